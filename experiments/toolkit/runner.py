"""A resumable grid of training runs, each in its own workdir, trained `jobs` at a time by worker processes.

    runs = [dict(name="lr0.001/pre/seed0", scheme="pre", lr=1e-3, seed=0), ...]
    summaries = runner.run_grid(runs, train_one, workdir="/tmp/exp", jobs=2)

`train_one(run, run_workdir) -> dict` is a module-level function (it is pickled to the workers); its dict, with the
run's wall time and `environment()` (the git HEAD and versions that trained it), is saved as
`<run_workdir>/done.json`, and a run whose done.json exists is not trained again, so an interrupted grid resumes
where it stopped. A run that raises is reported and retried by the next invocation; the others go on. A finished
run's done.json is never replaced: a worker whose grid was killed (an orphan left with queued runs) trains
nothing more, and a run finished by another grid meanwhile keeps that grid's record. A run's workdir lock is held
from that check until its done.json is written, so a second grid reports a run in training as failed (retried by
the next invocation) instead of training it again.

Speed, not semantics: a grid runs min(jobs, runs left) workers, each with single-threaded XLA when there are
several (two single-threaded workers train ~1.3x faster than one two-threaded process on a 2-core machine; a lone
run keeps XLA's threads: a pool of one single-threaded worker left a core idle), and all share JAX's persistent
compilation cache (`WORKDIR/_jax_cache`), so runs that differ only in seed or learning rate reuse one compiled program.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
from typing import Callable

DONE_FILE = "done.json"
SINGLE_THREADED_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def run_dir(workdir: str, run: dict) -> str:
  return os.path.join(workdir, run["name"])


def require_finished(result, directory: str) -> None:
  """Raises for a training loop's result that was preempted (SIGTERM): the run resumes at the next invocation and
  is never recorded or scored half-trained."""
  if result.preempted:
    raise RuntimeError(f"{directory}: preempted at step {int(result.state.step)}")


def require_grid_finished(stage: str, finished: list[dict], expected: int, hint: str) -> None:
  """Stops the program unless all `expected` runs of `stage` have finished (the message ends with `hint`)."""
  if len(finished) < expected:
    raise SystemExit(f"{stage}: {len(finished)} of {expected} runs finished{hint}")


def copy_finished(source: str, target: str) -> int:
  """Copies every finished run under `source` (each folder with a done.json, at any depth: a run, or a part of one
  such as a reward model and the RL runs against it) to the same place under `target` where that folder has not
  finished: its done.json and metrics.jsonl, never checkpoints; returns how many. Keeping a run
  (`copy_finished(run_dir(workdir, run), KEEP/runs/<name>)`, as it finishes) and bringing kept runs into a fresh
  workdir (`copy_finished(KEEP/runs, workdir)`, a later session's machine) are this one copy, so a stage goes on
  across sessions; a kept run must need nothing more than its record (a kept SFT has every run that starts from it
  kept too, or is only read). A finished folder is never overwritten: its files do not change once done."""
  copied = 0
  for folder, _, files in sorted(os.walk(source)):
    if DONE_FILE not in files:
      continue
    copy = os.path.join(target, os.path.relpath(folder, source))
    if os.path.exists(os.path.join(copy, DONE_FILE)):
      continue
    os.makedirs(copy, exist_ok=True)
    for name in sorted(files, key=lambda n: n == DONE_FILE):  # done.json last: a copy cut short is unfinished
      if name in ("metrics.jsonl", DONE_FILE):
        shutil.copyfile(os.path.join(folder, name), os.path.join(copy, name))
    copied += 1
  return copied


def import_kept(keep: str, workdir: str) -> int:
  """`copy_finished(keep/runs, workdir)`, saying how many runs it brought in (a later session's fresh workdir)."""
  imported = copy_finished(os.path.join(keep, "runs"), workdir)
  if imported:
    print(f"{imported} finished runs imported into {workdir} from {keep}", flush=True)
  return imported


def load_done(workdir: str, run: dict) -> dict | None:
  """The run's done.json, or None if it has not finished."""
  path = os.path.join(run_dir(workdir, run), DONE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


class GridGone(RuntimeError):
  """The process that started this worker is gone (killed): its queued runs are not trained."""


_GRID_PID = None  # the pid of the grid process that started this worker
_IN_RUN = threading.Event()  # set while this process trains a run


def _end_with_the_grid(grid_pid: int, poll_s: float = 1.0) -> None:
  """A worker's daemon thread: once the grid process that started it is gone (killed, SIGKILL included: the worker
  is reparented), a run in training gets SIGTERM, so it checkpoints and stops as on a kill, and then the worker
  exits, instead of waiting forever for work that cannot come."""
  while os.getppid() == grid_pid:
    time.sleep(poll_s)
  if _IN_RUN.is_set():
    os.kill(os.getpid(), signal.SIGTERM)
    while _IN_RUN.is_set():
      time.sleep(poll_s)
  os._exit(1)


def _init_worker(cache_dir: str, grid_pid: int) -> None:
  global _GRID_PID
  _GRID_PID = grid_pid
  threading.Thread(target=_end_with_the_grid, args=(grid_pid,), daemon=True).start()
  import jax
  from absl import logging

  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  logging.set_verbosity(logging.WARNING)


class RunFailed(Exception):
  """A run's own error as "<type>: <message>" (picklable whatever the original was: a worker can hand it back)."""


def _train_and_record(train_one: Callable[[dict, str], dict], run: dict, workdir: str) -> dict:
  from experiments.toolkit.environment import environment
  from jaxpt.engine.lock import workdir_lock

  if _GRID_PID is not None and os.getppid() != _GRID_PID:
    raise GridGone(f"{run['name']}: the grid process {_GRID_PID} is gone; not training its queued runs")
  directory = run_dir(workdir, run)
  finished = load_done(workdir, run)
  if finished is not None:  # finished by another grid meanwhile: never trained or recorded twice
    return finished
  try:  # the run's workdir lock (the trainer's own, re-entrant) is held until done.json is written, so another
    # grid never finds the run unlocked and unrecorded in between (it would train it again from its last checkpoint)
    with workdir_lock(directory):
      finished = load_done(workdir, run)
      if finished is not None:
        return finished
      start = time.perf_counter()
      _IN_RUN.set()
      try:
        summary = dict(run, **train_one(run, directory))
      finally:
        _IN_RUN.clear()
      summary["wall_s"] = time.perf_counter() - start
      summary["environment"] = environment()  # the code that trained it (a report may be written later, elsewhere)
      return _record(summary, directory, workdir, run)
  except Exception as e:  # noqa: BLE001 -- re-raised as a picklable error, so the grid reports it (not a broken pool)
    raise RunFailed(f"{type(e).__name__}: {e}") from None


def _record(summary: dict, directory: str, workdir: str, run: dict) -> dict:
  """Writes done.json whole or not at all; a done.json written meanwhile by another grid is kept (and returned)."""
  temporary = os.path.join(directory, DONE_FILE + f".{os.getpid()}.tmp")
  with open(temporary, "w") as f:
    json.dump(summary, f, indent=1)
  try:
    os.link(temporary, os.path.join(directory, DONE_FILE))
  except FileExistsError:
    return load_done(workdir, run)
  finally:
    os.remove(temporary)
  return summary


@contextlib.contextmanager
def _worker_xla_flags(jobs: int):
  """XLA_FLAGS for the workers this grid spawns (they copy the environment when they start): single-threaded XLA
  when jobs > 1; the process's own XLA_FLAGS are restored after, so a later grid of one run is multi-threaded."""
  before = os.environ.get("XLA_FLAGS")
  if jobs > 1 and SINGLE_THREADED_XLA not in (before or ""):
    os.environ["XLA_FLAGS"] = f"{before or ''} {SINGLE_THREADED_XLA}".strip()
  try:
    yield
  finally:
    if before is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = before


def run_grid(runs: list[dict], train_one: Callable[[dict, str], dict], workdir: str, jobs: int = 2,
             describe: Callable[[dict], str] = lambda s: "",
             after_each: Callable[[dict], None] | None = None) -> list[dict | None]:
  """Trains every unfinished run; returns each run's done.json (None where it failed), in the order of `runs`.
  `after_each(summary)` is called in this process as each run finishes (e.g. to keep its files elsewhere at once)."""
  names = [r["name"] for r in runs]
  if len(set(names)) != len(names):
    raise ValueError("run_grid: run names must be unique")
  todo = [r for r in runs if load_done(workdir, r) is None]
  jobs = max(1, min(jobs, len(todo)))  # a lone run trains multi-threaded, not on one core of an idle pool
  print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished; training {len(todo)} with {jobs} jobs",
        flush=True)
  if todo:
    start = time.time()
    context = multiprocessing.get_context("spawn")
    with _worker_xla_flags(jobs), futures.ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_init_worker,
        initargs=(os.path.join(workdir, "_jax_cache"), os.getpid())) as pool:
      pending = {pool.submit(_train_and_record, train_one, r, workdir): r for r in todo}
      for count, future in enumerate(futures.as_completed(pending), 1):
        run = pending[future]
        try:
          summary = future.result()
          status = f"{summary['wall_s']:.0f} s {describe(summary)}"
          if after_each is not None:
            after_each(summary)
        except Exception as e:  # noqa: BLE001 -- one failed run must not stop the grid
          status = f"FAILED: {str(e)[:300] if isinstance(e, RunFailed) else f'{type(e).__name__}: {str(e)[:300]}'}"
        print(f"[{count}/{len(todo)} {time.time() - start:.0f} s] {run['name']}: {status}", flush=True)
  return [load_done(workdir, r) for r in runs]


def refuse_other_digests(summaries: list[dict], overrides: dict, where: str = "") -> None:
  """Stops the program at the first of `summaries` (finished runs' done.json, or the run rows a pilot file
  records) whose digests (the `*_digest` keys of `overrides`, e.g. `config_digest`) are not the current code's:
  a stage that trains after reading runs it does not train would otherwise mix two configs in one result (N, the
  tuned settings and the claims from one, the runs it trains from the other). One line naming the run (`where`:
  the file it was read from) and both digests."""
  keys = [k for k in overrides if k.endswith("_digest")]
  for summary in summaries:
    differ = [k for k in keys if summary.get(k) != overrides[k]]
    if differ:
      raise SystemExit(f"{summary.get('name', '?')}{f' ({where})' if where else ''}: trained with " + ", ".join(
          f"{k} {summary.get(k)}, the current code's is {overrides[k]}" for k in differ) +
          "; a stage must not mix configs: run it with the code that trained it, or retrain in another --workdir")


def finished_or_trained(runs: list[dict], train_one: Callable[[dict, str], dict], workdir: str, jobs: int,
                        report_only: bool, overrides: dict, describe: Callable[[dict], str] = lambda s: "",
                        before_training: Callable[[], None] = lambda: None, strict: bool = False,
                        after_each: Callable[[dict], None] | None = None) -> list[dict]:
  """The finished runs' done.json, after training the unfinished ones unless `report_only` (`before_training` is
  called first, when there is something to train). `overrides` ({key: value} every run dict carries, e.g. the
  --set values): a finished run made with other values would be mixed in silently, so it stops the program.
  With `report_only` nothing is trained, so a finished run where only digests (`config_digest`, a classifier's
  `classifier_digest`: the code's default config changed since it trained) differ is reported with a warning
  naming the digests instead, unless `strict` (a stage that reads these runs and then trains others, e.g. a main
  stage reading its pilot stage's tuning runs): then `refuse_other_digests` stops it. `after_each`: `run_grid`'s."""
  existing = [load_done(workdir, r) for r in runs]
  if strict:
    refuse_other_digests([s for s in existing if s is not None], overrides, workdir)
  stale: dict[tuple, int] = {}
  for summary in existing:
    if summary is None:
      continue
    differ = {k for k, v in overrides.items() if summary.get(k) != v}
    if report_only and differ and all(k.endswith("_digest") for k in differ):
      key = tuple(sorted((k, summary.get(k)) for k in differ))
      stale[key] = stale.get(key, 0) + 1
      continue
    if differ:
      raise SystemExit(f"{summary['name']}: trained with other overrides "
                       f"({ {k: summary.get(k) for k in overrides} }); use another --workdir")
  for digests, count in stale.items():
    print(f"warning: {count} finished runs were trained with " + ", ".join(
        f"{k} {v} (the current code's: {overrides[k]})" for k, v in digests) + "; reported as trained", flush=True)
  if not report_only and any(s is None for s in existing):
    before_training()
    existing = run_grid(runs, train_one, workdir, jobs, describe, after_each)
  return [s for s in existing if s is not None]
