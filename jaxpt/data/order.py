"""The deterministic, resumable row order every batcher shares: the batch of step t depends on (seed, t) only.

Rows are read as one endless stream, epoch after epoch; epoch e visits every row once, in the permutation drawn
from (seed, e). The global batch of step t is stream positions [t B, (t + 1) B); process p of P reads its
contiguous B / P of them. So a run resumed at step t reads exactly what an uninterrupted one would.
A second, independent stream of the same rows (`stream` > 0: epoch e's permutation drawn from (seed, e, stream))
serves extra draws by position, e.g. DAPO's refill prompts (`jaxpt.data.math_task.PromptData.refill_batch`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from jaxpt.config import ConfigError

_CACHED_EPOCHS = 4


def process_slice(batch_size: int, process_index: int, process_count: int) -> tuple[int, int]:
  """[begin, end) rows of a global batch of `batch_size` that belong to `process_index`."""
  if process_count <= 0 or batch_size % process_count:
    raise ConfigError("config.data.batch_size", f"must be divisible by process_count={process_count}", batch_size)
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
  per_process = batch_size // process_count
  return process_index * per_process, (process_index + 1) * per_process


def step_batches(train_batch: Callable[[int, int, int], Any], batch_size: int, start_step: int = 0,
                 process_index: int = 0, process_count: int = 1) -> Iterator[Any]:
  """Endless `train_batch(step, process_index, process_count)` for steps start_step, start_step + 1, ...; the
  arguments are checked before the first batch."""
  if start_step < 0:
    raise ValueError(f"start_step must be >= 0, got {start_step}")
  process_slice(batch_size, process_index, process_count)
  step = start_step
  while True:
    yield train_batch(step, process_index, process_count)
    step += 1


class StepOrder:
  """Row indices of each step's batch over `num_rows` rows (see the module doc); `stream` 0 is the training
  order, another `stream` an independent order of the same rows."""

  def __init__(self, seed: int, num_rows: int, batch_size: int, stream: int = 0):
    if num_rows <= 0:
      raise ValueError("no training rows")
    if stream < 0:
      raise ValueError(f"stream must be >= 0, got {stream}")
    self.seed, self.num_rows, self.batch_size, self.stream = seed, num_rows, batch_size, stream
    self._permutations: dict[int, np.ndarray] = {}

  def permutation(self, epoch: int) -> np.ndarray:
    """int64 [num_rows]: the row order of `epoch` (the last few are cached)."""
    if epoch not in self._permutations:
      if len(self._permutations) >= _CACHED_EPOCHS:
        self._permutations.pop(min(self._permutations))
      key = [self.seed, epoch] + ([self.stream] if self.stream else [])
      self._permutations[epoch] = np.random.default_rng(key).permutation(self.num_rows)
    return self._permutations[epoch]

  def rows(self, step: int, process_index: int = 0, process_count: int = 1) -> np.ndarray:
    """int64 [batch_size / process_count]: this process's rows of the global batch of `step`."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}")
    begin, end = process_slice(self.batch_size, process_index, process_count)
    stream = step * self.batch_size + np.arange(begin, end, dtype=np.int64)
    epochs, offsets = np.divmod(stream, self.num_rows)
    rows = np.empty_like(stream)
    for epoch in np.unique(epochs):
      mask = epochs == epoch
      rows[mask] = self.permutation(int(epoch))[offsets[mask]]
    return rows
