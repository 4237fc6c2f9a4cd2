"""Metric sinks for a run's workdir: `metrics.jsonl`, TensorBoard events (`tb/`) and a `loss.png` curve."""

from __future__ import annotations

import json
import os
from typing import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboardX import SummaryWriter  # noqa: E402

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
TB_DIR = "tb"


def read_metrics(workdir: str) -> list[dict]:
  """All rows of `workdir/metrics.jsonl` (an empty list when absent)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class MetricWriter:
  """Appends one row per call to `metrics.jsonl` and TensorBoard; `plot()` redraws `loss.png`.

  Opening at `start_step` drops rows with step > start_step left by an interrupted run, so after a resume the
  file reads as if the run had never stopped.
  """

  def __init__(self, workdir: str, start_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.workdir = workdir
    self._path = os.path.join(workdir, METRICS_FILE)
    kept = [row for row in read_metrics(workdir) if row.get("step", 0) <= start_step]
    with open(self._path, "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in kept)
    self._file = open(self._path, "a")
    self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), purge_step=start_step + 1 if start_step else None)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    row = {"step": int(step)}
    row.update({k: _to_json_number(v) for k, v in metrics.items()})
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    for key, value in row.items():
      if key != "step" and value is not None:
        self._tb.add_scalar(key, value, int(step))
    self._tb.flush()

  def plot(self) -> str:
    """Draws train `loss` and `eval_loss` against step into `loss.png`; returns its path."""
    rows = read_metrics(self.workdir)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("loss", "-"), ("eval_loss", "o-")):
      points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
      if points:
        ax.plot(*zip(*points), style, label=key, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if rows:
      ax.legend()
    path = os.path.join(self.workdir, PLOT_FILE)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def _to_json_number(value) -> float:
  """A float; NaN/inf are kept (Python's json reads them back) so a diverged run is visible."""
  return float(value)


class NullMetricWriter:
  """MetricWriter's interface, writing nothing: for processes other than 0 in a multi-process run."""

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    del step, metrics

  def plot(self) -> str:
    return ""

  def close(self) -> None:
    pass
