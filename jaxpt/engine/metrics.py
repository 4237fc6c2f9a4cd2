"""Metric sinks for a run's workdir: `metrics.jsonl`, TensorBoard events (`tb/`) and a `loss.png` curve."""

from __future__ import annotations

import json
import os
from typing import Mapping

from absl import logging
from tensorboardX import SummaryWriter

from jaxpt.oserrors import write_atomically

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
TB_DIR = "tb"


def read_metrics(workdir: str) -> list[dict]:
  """All rows of `workdir/metrics.jsonl` (an empty list when absent); a row that does not read (cut by a kill or a
  full disk mid-write) is left out with a warning naming the file and line."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except ValueError:
        logging.warning("%s:%d: a row that does not read (cut by a kill or a full disk?), left out", path, number)
  return rows


class MetricWriter:
  """Appends one row per call to `metrics.jsonl` and TensorBoard; `plot()` draws `loss.png`.

  Opening at `start_step` drops rows with step > start_step left by an interrupted run, so after a resume the
  file reads as if the run had never stopped. The rows are also kept in memory (`rows`): `plot()` draws from them.
  """

  def __init__(self, workdir: str, start_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.workdir = workdir
    self._path = os.path.join(workdir, METRICS_FILE)
    self.rows = [row for row in read_metrics(workdir) if row.get("step", 0) <= start_step]
    write_atomically(self._path, "".join(json.dumps(row) + "\n" for row in self.rows))  # a kill keeps the old file
    self._file = open(self._path, "a")
    self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), purge_step=start_step + 1 if start_step else None)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    row = {"step": int(step)}
    row.update({k: float(v) for k, v in metrics.items()})  # NaN/inf kept (json reads them back): divergence shows
    self.rows.append(row)
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    for key, value in row.items():
      if key != "step" and value is not None:
        self._tb.add_scalar(key, value, int(step))
    self._tb.flush()

  def plot(self) -> str:
    """Draws train `loss` and `eval_loss` against step into `loss.png` from the in-memory rows; returns its path."""
    # Imported here: importing the train package must not import matplotlib.
    from jaxpt import reports

    return reports.plot_loss(self.rows, os.path.join(self.workdir, PLOT_FILE))

  def close(self) -> None:
    self._file.close()
    self._tb.close()


class NullMetricWriter:
  """MetricWriter's interface, writing nothing: for processes other than 0 in a multi-process run."""

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    del step, metrics

  def plot(self) -> str:
    return ""

  def close(self) -> None:
    pass
