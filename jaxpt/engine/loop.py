"""The one training loop: restore -> iterate batches -> step -> log / eval / checkpoint, SIGTERM- and Ctrl-C-safe.

Pretraining, reward modelling and GRPO differ only in the `train_step` and batch iterator they pass in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from absl import logging
from tqdm.auto import tqdm  # in a Jupyter kernel with ipywidgets (Colab): the notebook's widget bar

from jaxpt import progress
from jaxpt.config import Section, at_least, one_of
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.lock import workdir_lock
from jaxpt.engine.metrics import MetricWriter, NullMetricWriter
from jaxpt.engine.state import TrainState

NONFINITE_ACTIONS = ("stop", "skip")
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: stopped by SIGTERM after saving; rerunning the command resumes
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's code for Ctrl-C: stopped by it after saving; rerunning resumes
EXIT_NONFINITE = 3  # stopped at a non-finite step (NonFiniteError); nothing of it was saved
TrainStep = Callable[[TrainState, Any], tuple[TrainState, dict]]
BatchesFn = Callable[[int], Iterator[Any]]
EvalFn = Callable[[TrainState], dict]


@dataclasses.dataclass(frozen=True)
class LoopConfig(Section):
  """The loop's settings; a run config (`jaxpt.engine.config.RunConfig`) holds them inline (`config.loop`), so its
  dict forms have these fields at their top level (`config.steps`).

  Attributes:
    steps: total loop steps of the run.
    log_every: steps between metrics rows (metrics.jsonl, TensorBoard, progress); also a row at every eval and at
      the end.
    eval_every: steps between evaluations; 0 = only at the end of the run.
    checkpoint_every: steps between checkpoints; 0 = only at the end of the run (and on SIGTERM or Ctrl-C).
    keep_checkpoints: how many of the newest checkpoints are kept.
    async_checkpoints: write checkpoints in the background while training goes on.
    progress: progress on stderr: on a terminal a tqdm bar (in a notebook with ipywidgets, e.g. Colab, tqdm.auto's
      widget bar); otherwise (a log file) no carriage-return redraws but one plain line per metrics row (step, loss,
      steps/s): about steps / log_every lines in a log.
    on_nonfinite: a NaN/inf loss, gradient or parameter: `stop` raises NonFiniteError at the first step whose
      `nonfinite` metric is set (before any checkpoint of it is written); `skip` leaves such updates out (the
      train step keeps the old state), warns once per skipped step and goes on.
    max_skipped_steps: on_nonfinite='skip': raise NonFiniteError (exit 3) once this many steps in a row were skipped
      (a run that no longer learns; counted exactly, within one launch); 0 = no limit. Checked at metrics rows and
      before checkpoints (no host sync per step), so the loop may run up to log_every - 1 steps past the last of
      them; a checkpoint due after it is not written.
  """

  steps: int = 1000
  log_every: int = 10
  eval_every: int = 0
  checkpoint_every: int = 0
  keep_checkpoints: int = 3
  async_checkpoints: bool = True
  progress: bool = True
  on_nonfinite: str = "stop"
  max_skipped_steps: int = 10

  def check(self) -> None:
    for field, low in (("steps", 0), ("log_every", 1), ("eval_every", 0), ("checkpoint_every", 0),
                       ("keep_checkpoints", 1), ("max_skipped_steps", 0)):
      at_least(self, field, low)
    one_of(self, "on_nonfinite", NONFINITE_ACTIONS)


class NonFiniteError(RuntimeError):
  """A step's loss, gradient norm or parameters were NaN/inf: with on_nonfinite='stop' (no checkpoint holds it),
  or the last of `skipped` = max_skipped_steps steps in a row that on_nonfinite='skip' left out."""

  def __init__(self, step: int, quantity: str, skipped: int = 0):
    self.step, self.quantity, self.skipped = step, quantity, skipped
    if skipped:
      super().__init__(f"step {step}: non-finite {quantity}; stopped after {skipped} consecutive skipped steps "
                       f"(steps {step - skipped + 1}-{step}, on_nonfinite='skip', max_skipped_steps={skipped}): the "
                       "run no longer learns. Lower optim.learning_rate")
    else:
      super().__init__(f"step {step}: non-finite {quantity}; stopped before saving it (the newest checkpoint is "
                       "older). Lower optim.learning_rate, or set on_nonfinite='skip' to leave such updates out")


class _NonFiniteWatch:
  """Reads the `nonfinite` metric of the steps since the last check, in step order, at metrics rows and before
  checkpoints (one host transfer each, not a sync per step): on_nonfinite='stop' raises NonFiniteError at the first
  flagged step; 'skip' warns once per skipped step and raises once max_skipped_steps were skipped in a row (counted
  exactly, across checks)."""

  def __init__(self, config: LoopConfig):
    self.config = config
    self.unchecked: list[dict] = []  # the metrics of the steps since the last check
    self.in_a_row = 0  # skipped steps in a row, up to the last checked step

  def check(self, step: int) -> None:
    """Checks the steps up to `step`, the last one run."""
    rows, self.unchecked = jax.device_get(self.unchecked), []
    for at, row in enumerate(rows, start=step - len(rows) + 1):
      if float(row.get("nonfinite", 0.0)) <= 0:
        self.in_a_row = 0
        continue
      quantity = next((k for k in ("loss", "grad_norm") if k in row and not np.isfinite(row[k])), "params")
      if self.config.on_nonfinite == "stop":
        raise NonFiniteError(at, quantity)
      self.in_a_row += 1
      logging.warning("step %d: non-finite %s; its update was skipped (on_nonfinite='skip'; %d in a row of at most "
                      "max_skipped_steps=%d)", at, quantity, self.in_a_row, self.config.max_skipped_steps)
      if self.in_a_row == self.config.max_skipped_steps:
        raise NonFiniteError(at, quantity, skipped=self.in_a_row)


@dataclasses.dataclass
class LoopResult:
  state: TrainState
  last_row: dict  # the last metrics row written
  signal: str | None = None  # the signal that stopped it: 'SIGTERM' or 'SIGINT' (Ctrl-C); None when not preempted

  @property
  def preempted(self) -> bool:
    """Stopped by SIGTERM or SIGINT (a checkpoint at state.step was saved)."""
    return self.signal is not None


def signal_name(signum: int) -> str:
  """'Ctrl-C (SIGINT)' or 'SIGTERM', as the one-line messages name them."""
  return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_now(signum: int) -> None:
  """A second SIGTERM / Ctrl-C while the first is being handled (a long compile, a hung save): one line, then exit
  128 + signum at once, without saving (the last committed checkpoint is kept; a half-written one is skipped on
  the next launch)."""
  print(f"jaxpt: a second {signal_name(signum)}: stopping now without saving; the last checkpoint is kept",
        file=sys.stderr, flush=True)
  os._exit(128 + signum)


def install_handlers(handler: Callable[[int, Any], None], signums: Sequence[int]) -> dict[int, Any]:
  """`handler` for each of `signums` except one the process was told to ignore (a background job's SIGINT is
  SIG_IGN on purpose: a Ctrl-C in the parent's terminal must not stop it); the previous handlers, to restore."""
  return {signum: signal.signal(signum, handler) for signum in signums if signal.getsignal(signum) != signal.SIG_IGN}


class _Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks between steps, naming the signal.

  One process: Python handlers for both (only installable from the main thread), the previous ones restored after.
  Several processes: jax's preemption service (started by `jax.distributed.initialize`) catches SIGTERM on any host
  and agrees on a step all hosts reach; `poll(step)` turns the flag on there on every host, so all stop and
  checkpoint at the same step (a Ctrl-C there stays a KeyboardInterrupt: one host cannot stop the others).
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal: str | None = None  # the name of the signal that asked the loop to stop
    self.multi_process = jax.process_count() > 1

  @property
  def requested(self) -> bool:
    return self.signal is not None

  @contextlib.contextmanager
  def installed(self):
    if self.multi_process or threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = install_handlers(self._handle, self.SIGNALS)
    try:
      yield self
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)

  def poll(self, step: int) -> None:
    """Call after every step (all processes, same steps)."""
    if self.multi_process and multihost_utils.reached_preemption_sync_point(step):
      self.signal = "SIGTERM"

  def _handle(self, signum, frame):
    del frame
    if self.signal is not None:
      stop_now(signum)
    self.signal = signal.Signals(signum).name


def _mean_metrics(pending: list[dict]) -> dict:
  """Means over the steps since the last log (over the steps that report each key); `num_tokens` is summed."""
  host = jax.device_get(pending)
  keys = list(dict.fromkeys(key for m in host for key in m))
  row = {}
  for key in keys:
    values = np.asarray([m[key] for m in host if key in m], np.float64)
    row[key] = float(values.sum() if key == "num_tokens" else values.mean())
  return row


def print_summary(command: str, result: "LoopResult", workdir: str, keys: Sequence[str]) -> int:
  """One line for `jaxpt <command>`: where a SIGTERM or Ctrl-C stopped the run, or the last logged values of `keys`
  (those present); returns the exit code: 0 when finished, EXIT_PREEMPTED when a SIGTERM stopped it,
  EXIT_INTERRUPTED when a Ctrl-C (SIGINT) did (a checkpoint of that step saved either way: rerun to resume)."""
  step = int(jax.device_get(result.state.step))
  if result.preempted:
    ctrl_c = result.signal == "SIGINT"
    print(f"jaxpt {command}: {'Ctrl-C (SIGINT)' if ctrl_c else 'SIGTERM'} at step {step}; checkpoint saved in "
          f"{workdir}, rerun to resume.", flush=True)
    return EXIT_INTERRUPTED if ctrl_c else EXIT_PREEMPTED
  summary = ", ".join(f"{k}={result.last_row[k]:.4g}" for k in keys if k in result.last_row)
  print(f"jaxpt {command}: finished step {step} in {workdir}" + (f": {summary}" if summary else ""))
  return 0


def _is_due(step: int, every: int) -> bool:
  return every > 0 and step % every == 0


def train_loop(state: TrainState, train_step: TrainStep, batches: BatchesFn, config: LoopConfig, workdir: str, *,
               eval_fn: EvalFn | None = None, meta: dict | None = None, stop_at: int | None = None,
               record: Callable[[], Any] | None = None) -> LoopResult:
  """Trains `state` to `config.steps`, resuming from the latest checkpoint in `workdir` if there is one.

  train_step(state, batch) -> (state, metrics): typically jitted; metrics are scalars (`num_tokens`, if
    present, yields `tokens_per_sec`).
  batches(start_step) -> iterator whose k-th item is the batch for step start_step + k (data order is a function
    of the step, so the checkpointed step is the data position).
  eval_fn(state) -> dict of scalars, run every `eval_every` steps and at the end.
  meta: JSON-able dict saved with each checkpoint (e.g. the config).
  stop_at: stop (and checkpoint) after this step, as if preempted there; for staged runs and tests.
  record(): called once the checkpoint to resume from (if any) has restored into `state`, the last check a relaunch
    can fail (a checkpoint that does not fit the config), and before the loop writes anything: it records the
    launch (`jaxpt.engine.record.record_launch`), so a refused relaunch leaves the workdir as it was.
  Writes metrics.jsonl rows {step, loss, ..., lr, grad_norm, tokens_per_sec, eval_*}, TensorBoard, loss.png.
  """
  with workdir_lock(workdir):  # one writer per workdir
    checkpointer = Checkpointer(workdir, keep=config.keep_checkpoints, async_save=config.async_checkpoints)
    try:
      restored = checkpointer.restore_latest(state, set_aside=False)
      if record is not None:
        record()
      checkpointer.set_aside_unrestorable()  # the launch is accepted: corrupt newer steps out of the way
    except BaseException:
      checkpointer.close()
      raise
    if restored is not None:
      state = restored
    start = int(jax.device_get(state.step))
    end = config.steps if stop_at is None else min(config.steps, stop_at)
    if start:
      logging.warning("resuming from the checkpoint at step %d", start)
    lead = jax.process_index() == 0  # in a multi-process run only process 0 writes metrics and shows progress
    writer = MetricWriter(workdir, start_step=start) if lead else NullMetricWriter()
    preemption = _Preemption()
    last_row: dict = {}
    pending: list[dict] = []
    nonfinite = _NonFiniteWatch(config)
    step = start

    show = config.progress and lead
    # A terminal, or a notebook's widget bar; else (a log file, a kernel without ipywidgets) one plain line per
    # metrics row instead of carriage-return redraws.
    redraw = show and (sys.stderr.isatty() or any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__))
    bar = tqdm(total=config.steps, initial=start, disable=not redraw, dynamic_ncols=True, desc="train")
    # The handlers stay over the closing too: a signal then must not cut the last checkpoint's write short.
    with preemption.installed():
      try:
        iterator = batches(start)
        tick = time.perf_counter()
        while step < end and not preemption.requested:
          state, metrics = train_step(state, next(iterator))
          pending.append(metrics)
          nonfinite.unchecked.append(metrics)
          step += 1
          preemption.poll(step)
          bar.update(1)
          is_last = step == config.steps
          do_eval = eval_fn is not None and (_is_due(step, config.eval_every) or is_last)
          if do_eval or is_last or step == end or _is_due(step, config.log_every):
            row = _mean_metrics(pending)
            elapsed = time.perf_counter() - tick
            row["steps_per_sec"] = len(pending) / elapsed
            if "num_tokens" in row:
              row["tokens_per_sec"] = row.pop("num_tokens") / elapsed
            pending = []
            if do_eval:
              row.update({k: float(v) for k, v in jax.device_get(eval_fn(state)).items()})
            writer.write(step, row)
            nonfinite.check(step)  # after the row is written, so a non-finite step shows in metrics.jsonl
            last_row = dict(row, step=step)
            if "loss" in row:
              bar.set_postfix(loss=f"{row['loss']:.4f}")
            if show and not redraw:
              loss = f" loss={row['loss']:.4f}" if "loss" in row else ""
              print(f"train: step {step}/{config.steps}{loss} {row['steps_per_sec']:.3g} steps/s", file=sys.stderr,
                    flush=True)
            tick = time.perf_counter()
          if _is_due(step, config.checkpoint_every):
            nonfinite.check(step)
            checkpointer.save(state, meta)
        if preemption.requested:
          logging.warning("%s: saving a checkpoint at step %d and stopping", preemption.signal, step)
        if step > start or checkpointer.latest_step() is None:
          nonfinite.check(step)
          checkpointer.save(state, meta)
      finally:
        bar.close()
        checkpointer.close()
        writer.plot()
        writer.close()
        progress.set_doing("finishing up after training")  # for the CLI's line on a signal once these handlers go
    return LoopResult(state=state, last_row=last_row, signal=preemption.signal)
