"""Orbax checkpoints of a `TrainState`: async saves, keep-N, per-step manifests, restore of the newest intact step,
one-line CheckpointErrors."""

from __future__ import annotations

import glob
import json
import logging as std_logging
import os
import shutil
import sys
import time
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from jaxpt.config import ConfigError
from jaxpt.oserrors import describe, write_atomically
from jaxpt.engine.state import TrainState

CHECKPOINT_DIR = "checkpoints"
SKIPPED_DIR = "checkpoints_skipped"  # unrestorable checkpoints are moved here, never deleted
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
  """A checkpoint could not be saved or restored; the message is one line with the cause and the path."""


def _is_orbax_noise(record: std_logging.LogRecord) -> bool:
  """orbax's own error logs of a failed async save and asyncio's 'Task exception was never retrieved' for it: the
  failure reaches the caller as one CheckpointError line instead."""
  return record.levelno >= std_logging.ERROR and (record.name == "asyncio" or f"{os.sep}orbax{os.sep}" in
                                                   record.pathname)


def quiet_orbax_noise() -> None:
  """For command-line runs (process-wide; not done on import): drops the hundreds of lines a failed checkpoint
  save or read prints besides its CheckpointError (orbax's error logs and asyncio's, and the 'Event loop is
  closed' tracebacks tensorstore's late callbacks raise into closed event loops)."""
  previous = sys.unraisablehook

  def unraisable(info):
    if isinstance(info.exc_value, RuntimeError) and "Event loop is closed" in str(info.exc_value):
      return
    previous(info)

  sys.unraisablehook = unraisable
  for handler in std_logging.getLogger().handlers:
    handler.addFilter(lambda record: not _is_orbax_noise(record))


def _path_names(path: tuple) -> tuple[str, ...]:
  """A pytree path as plain names ('params', 'blocks_0', ..., '0'), the same for a dataclass / NamedTuple and for
  the dicts / lists orbax saves them as."""
  return tuple(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _file_crc(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(1 << 24):
      crc = zlib.crc32(chunk, crc)
  return crc


def _step_files(step_dir: str) -> list[str]:
  """Relative paths of every file of a committed checkpoint step, sorted, without the manifest itself."""
  files = []
  for folder, _, names in os.walk(step_dir):
    files += [os.path.relpath(os.path.join(folder, n), step_dir) for n in names]
  return sorted(f for f in files if f != MANIFEST)


def _write_manifest(step_dir: str) -> None:
  """`<step_dir>/manifest.json`: {relative path: [size, crc32]} of every file of the committed step."""
  entries = {f: [os.path.getsize(os.path.join(step_dir, f)), _file_crc(os.path.join(step_dir, f))]
             for f in _step_files(step_dir)}
  write_atomically(os.path.join(step_dir, MANIFEST), json.dumps(entries))


def _check_manifest(step_dir: str) -> str | None:
  """Why the files of `step_dir` differ from its manifest (a missing, truncated or changed file), or None when
  they match or the step has no manifest (killed between commit and manifest: it is then tried as it is)."""
  try:
    with open(os.path.join(step_dir, MANIFEST)) as f:
      entries = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    return f"unreadable {MANIFEST} ({describe(e)})"
  for name, (size, crc) in sorted(entries.items()):
    path = os.path.join(step_dir, name)
    if not os.path.exists(path):
      return f"{name} is missing"
    if os.path.getsize(path) != size:
      return f"{name} has {os.path.getsize(path)} bytes, {size} were written"
    if _file_crc(path) != crc:
      return f"{name} is corrupted (CRC-32 differs from the one written)"
  return None


class Checkpointer:
  """Wraps `ocp.CheckpointManager` under `workdir/checkpoints/<step>/{state,meta}`.

  `state` is the TrainState pytree (StandardSave); `meta` is a small JSON dict (e.g. the config). Saves are
  asynchronous: `save` returns once arrays are copied off device; `close()` waits until files are committed.
  Once a step is committed, process 0 writes `<step>/manifest.json` (size and CRC-32 of every file), so a
  truncated or corrupted checkpoint is recognised before any of it is read; `restore_latest` falls back to the
  newest checkpoint that is intact and fits. Save and restore failures raise CheckpointError (one line).
  """

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True, create: bool = True):
    """create=False for a reader (eval, export, init_from): nothing is made in `workdir`."""
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=create)
    try:
      handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}  # not on import:
      # creating a handler starts JAX's backend, which must wait for jax.distributed.initialize
      self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    except OSError as e:
      raise CheckpointError(f"cannot open {self.directory}: {describe(e)}") from None
    self._unverified: list[int] = []  # saved steps whose manifest is not written yet
    self._unrestorable: tuple[list[int], int | None] = ([], None)  # skipped by restore_latest, the step restored

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, state: TrainState, meta: dict | None = None) -> bool:
    """Starts an async save at `state.step` (a no-op if that step is already saved); True if started."""
    step = int(jax.device_get(state.step))
    if step in self._manager.all_steps():
      return False
    self._finish_pending()  # the previous save must be committed before the next starts anyway
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {}))
    try:
      started = bool(self._manager.save(step, args=args, force=True))
    except Exception as e:  # orbax raises OSError, ValueError, RuntimeError, ... from its writer threads
      self._remove_unfinished([step])
      raise CheckpointError(f"saving the checkpoint at step {step} in {self.directory} failed: {describe(e)}") from None
    if started:
      self._unverified.append(step)
    return started

  def restore_latest(self, template: TrainState, set_aside: bool = True) -> TrainState | None:
    """The newest checkpoint that restores into `template`'s structure/dtypes/shardings, or None if there is none.

    A newer checkpoint that is corrupt or truncated (its manifest does not match, or orbax cannot read it) is
    skipped with a warning naming the step and the cause, and once an older one restores, moved to
    `workdir/checkpoints_skipped/` (kept for inspection, out of the way of the next save); with set_aside=False
    only once `set_aside_unrestorable()` is called (after the launch is accepted). CheckpointError when
    checkpoints exist but none restores, or the newest does not fit the config (a parameter's shape differs).
    """
    failures: list[tuple[int, str]] = []
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    for step in sorted(self._manager.all_steps(), reverse=True):
      problem = _check_manifest(self._step_dir(step)) or self._misfit(step, abstract)
      if problem is None:
        try:
          restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        except Exception as e:  # orbax / tensorstore raise ValueError, JSONDecodeError, KeyError, ...
          problem = describe(e)
      if problem is not None:
        logging.warning("checkpoint at step %d in %s does not restore, skipping it: %s", step, self.directory,
                        problem)
        failures.append((step, problem))
        continue
      self._unrestorable = ([s for s, _ in failures], step)
      if set_aside:
        self.set_aside_unrestorable()
      return restored.state
    if failures:
      listed = "; ".join(f"step {s}: {p}" for s, p in failures)
      raise CheckpointError(f"no checkpoint in {self.directory} restores into this run ({listed})")
    return None

  def set_aside_unrestorable(self) -> None:
    """Moves the checkpoints the last `restore_latest` skipped to workdir/checkpoints_skipped/ (if any)."""
    skipped, restored = self._unrestorable
    if skipped:
      self._set_aside(skipped, restored)
    self._unrestorable = ([], None)

  def restore_params(self, template: Any, step: int | None = None, key: str | None = None) -> Any:
    """Only the `params` of a saved TrainState (latest step by default), or only their subtree `key` (a PPO run's
    'policy'), restored into `template`'s structure, dtypes and shardings (e.g. to start a reward model or GRPO
    policy from a pretraining / SFT run). Optimizer state, rng, aux and the rest of the params are not read, so the
    saving run may have used any optimizer."""
    step = self._manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    wanted = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    abstract = {"params": {key: wanted} if key else wanted}
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    args = ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=True)
    with ocp.PyTreeCheckpointer() as reader:  # the manager's `state` handler restores whole trees only
      params = reader.restore(os.path.join(self._step_dir(step), "state"), args=args)["params"]
    return params[key] if key else params

  def close(self) -> None:
    """Waits until every save is committed (and its manifest written), then releases the manager."""
    try:
      self._finish_pending()
    finally:
      self._manager.close()

  def _finish_pending(self) -> None:
    """Waits for the running save; writes the manifests of the steps saved since the last call (process 0)."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:
      steps = ", ".join(map(str, self._unverified)) or "?"
      self._remove_unfinished(self._unverified)
      self._unverified = []
      raise CheckpointError(f"saving the checkpoint at step {steps} in {self.directory} failed: {describe(e)}") \
          from None
    steps, self._unverified = self._unverified, []
    if jax.process_index() == 0:
      for step in steps:
        if step in self._manager.all_steps():
          try:
            _write_manifest(self._step_dir(step))
          except OSError as e:
            raise CheckpointError(f"writing the manifest of step {step} in {self.directory} failed: "
                                  f"{describe(e)}") from None

  def _remove_unfinished(self, steps: list[int]) -> None:
    """Removes the temporary folders a failed save of `steps` left (orbax's `<step>.orbax-checkpoint-tmp*`, made
    for this run; process 0), so a full disk leaves no partial checkpoint behind. Orbax's writers may still be at
    work in such a folder when the failure reaches us: its save thread stops waiting at the first write that fails,
    and the writes after it (the config's JSON, other arrays) go on; every one of them finishes first."""
    for wait in [self._manager.wait_until_finished] + [f.result for f in _commit_futures(self._manager)]:
      try:
        wait()
      except Exception:  # noqa: BLE001 -- the failure being cleaned up after; the caller raises it
        pass
    if jax.process_index() == 0:
      for step in steps:
        for folder in glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*")):
          shutil.rmtree(folder, ignore_errors=True)

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _saved_leaves(self, step: int) -> dict[tuple[str, ...], Any]:
    """{path names: shape/dtype metadata} of the TrainState saved at `step`, read from its metadata (no arrays)."""
    saved = self._manager.item_metadata(step)["state"]
    return {_path_names(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(saved, "tree",
                                                                                                     saved))}

  def params_misfit(self, template: Any, step: int, key: str | None = None) -> str | None:
    """The first parameter of `template` (a params tree of arrays or ShapeDtypeStructs) that the params saved at
    `step` (their subtree `key`, if given) lack or hold in another shape, as 'blocks/.../kernel has shape (64, 32)
    there, the config gives (128, 32)'; None when all fit. Reads only the checkpoint's metadata."""
    return _first_misfit(self._saved_leaves(step), template, ("params",) + ((key,) if key else ()))

  def _misfit(self, step: int, abstract: TrainState) -> str | None:
    """Why `step`'s saved tree cannot be read (a corrupt checkpoint: None lets the caller fall back), or raises
    CheckpointError when it reads but does not fit `abstract` (the run's config changed a shape: older steps would
    not fit either)."""
    try:
      saved = self._saved_leaves(step)
    except Exception as e:
      return describe(e)
    misfit = _first_misfit(saved, abstract)
    if misfit is not None:
      raise CheckpointError(f"the checkpoint at step {step} in {self.directory} does not fit this run's config: "
                            f"{misfit}")
    return None

  def _set_aside(self, steps: list[int], restored: int) -> None:
    """Moves the unrestorable `steps` to workdir/checkpoints_skipped/ (process 0), so saves reuse their numbers."""
    if jax.process_index() == 0:
      aside = os.path.join(os.path.dirname(self.directory), SKIPPED_DIR)
      os.makedirs(aside, exist_ok=True)
      for step in steps:
        target = os.path.join(aside, f"{step}.{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(self._step_dir(step), target)
        logging.warning("restored step %d; moved the unrestorable step %d to %s", restored, step, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("jaxpt_checkpoints_set_aside")
    self._manager.reload()


def _commit_futures(manager: ocp.CheckpointManager) -> list[Any]:
  """The write futures of `manager`'s last asynchronous save. Orbax has no public accessor: they live on its
  AsyncCheckpointer's `_async_manager` (orbax-checkpoint 0.12; tests/test_train_checkpoint.py fails if they move)."""
  async_manager = getattr(getattr(manager, "_checkpointer", None), "_async_manager", None)
  return list(getattr(async_manager, "_commit_futures", None) or [])


def _first_misfit(saved: dict[tuple[str, ...], Any], template: Any, prefix: tuple[str, ...] = ()) -> str | None:
  """The first leaf of `template` that `saved` ({path names under `prefix`: metadata}) lacks or holds in another
  shape, in words; None when every leaf fits."""
  for path, want in jax.tree_util.tree_leaves_with_path(template):
    got = saved.get(prefix + _path_names(path))
    if got is None or tuple(got.shape) != tuple(want.shape):
      saved_as = "is absent" if got is None else f"has shape {tuple(got.shape)}"
      return f"{'/'.join(prefix + _path_names(path))} {saved_as} there, the config gives {tuple(want.shape)}"
  return None


def check_run_params(workdir: str, template: Any, field: str = "config.init_from", key: str | None = None) -> None:
  """ConfigError naming `field` when the jaxpt run in `workdir` has no checkpoint, or the params of its latest one
  (their subtree `key`, if given) lack a parameter of `template` or hold it in another shape. Reads only the
  checkpoint's metadata, so a trainer checks its `init_from` before any data work; nothing is written in `workdir`."""
  checkpointer = _open_run(workdir, field)
  try:
    _check_params(checkpointer, template, field, workdir, key)
  finally:
    checkpointer.close()


def _open_run(workdir: str, field: str) -> Checkpointer:
  """A reader of the jaxpt run in `workdir` (nothing created there); ConfigError naming `field` without checkpoints."""
  if not os.path.isdir(os.path.join(os.path.expanduser(workdir), CHECKPOINT_DIR)):
    raise ConfigError(field, f"no checkpoint under {os.path.join(os.path.expanduser(workdir), CHECKPOINT_DIR)}",
                      workdir)
  return Checkpointer(os.path.expanduser(workdir), async_save=False, create=False)


def _check_params(checkpointer: Checkpointer, template: Any, field: str, workdir: str, key: str | None) -> None:
  """`check_run_params` on an open reader."""
  step = checkpointer.latest_step()
  if step is None:
    raise ConfigError(field, f"no checkpoint under {checkpointer.directory}", workdir)
  try:
    misfit = checkpointer.params_misfit(template, step, key)
  except Exception as e:  # an unreadable checkpoint: orbax raises ValueError, FileNotFoundError, ...
    raise ConfigError(field, f"the checkpoint at step {step} does not read ({describe(e)})", workdir) from None
  if misfit is not None:
    raise ConfigError(field, f"its params do not fit config.model: {misfit}", workdir)


def load_run_params(workdir: str, template: Any, field: str = "config.init_from", key: str | None = None) -> Any:
  """The `params` of the latest checkpoint of a jaxpt pretrain / SFT run in `workdir`, or their subtree `key` (a
  PPO run's 'policy'; nothing else is read), restored into the structure, dtypes and shardings of `template` (e.g.
  a TransformerLM params tree: a policy, or a reward model's backbone). ConfigError naming `field` when the run has
  no checkpoint or its parameter tree or shapes differ from `template`'s (`check_run_params`).
  """
  checkpointer = _open_run(workdir, field)
  try:
    _check_params(checkpointer, template, field, workdir, key)
    return checkpointer.restore_params(template, key=key)
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(field, f"its params do not restore into config.model's ({describe(e)})", workdir) from None
  finally:
    checkpointer.close()
