"""Orbax checkpoints of a `TrainState`: async saves, keep-N, restore-latest."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxpt.config import ConfigError
from jaxpt.train.state import TrainState

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
  """Wraps `ocp.CheckpointManager` under `workdir/checkpoints/<step>/{state,meta}`.

  `state` is the TrainState pytree (StandardSave); `meta` is a small JSON dict (e.g. the config). Saves are
  asynchronous: `save` returns once arrays are copied off device; `close()` waits until files are committed.
  """

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, state: TrainState, meta: dict | None = None) -> bool:
    """Starts an async save at `state.step` (a no-op if that step is already saved); True if started."""
    step = int(jax.device_get(state.step))
    if step in self._manager.all_steps():
      return False
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {}))
    return bool(self._manager.save(step, args=args, force=True))

  def restore_latest(self, template: TrainState) -> TrainState | None:
    """The latest checkpoint restored into `template`'s structure/dtypes/shardings, or None if there is none."""
    step = self._manager.latest_step()
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    return restored.state

  def restore_params(self, template: Any, step: int | None = None) -> Any:
    """Only the `params` of a saved TrainState (latest step by default), restored into `template`'s structure,
    dtypes and shardings (e.g. to start a reward model or GRPO policy from a pretraining / SFT run). Optimizer
    state, rng and aux are not read, so the saving run may have used any optimizer."""
    step = self._manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, template)}
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    args = ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=True)
    return self._manager.restore(step, args=ocp.args.Composite(state=args)).state["params"]

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def load_run_params(workdir: str, template: Any, field: str = "config.init_from") -> Any:
  """The `params` of the latest checkpoint of a jaxpt pretrain / SFT run in `workdir` (nothing else is read),
  restored into the structure, dtypes and shardings of `template` (e.g. a TransformerLM params tree: a policy, or
  a reward model's backbone). ConfigError naming `field` when the run has no checkpoint or its parameter tree or
  shapes differ from `template`'s.
  """
  checkpointer = Checkpointer(os.path.expanduser(workdir), async_save=False)
  try:
    if checkpointer.latest_step() is None:
      raise ConfigError(field, f"no checkpoint under {checkpointer.directory}", workdir)
    try:
      params = checkpointer.restore_params(template)
    except (ValueError, KeyError, TypeError) as e:
      raise ConfigError(field, f"its params do not fit config.model ({e})", workdir) from None
  finally:
    checkpointer.close()
  for path, got, want in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(params),
                             jax.tree.leaves(template)):
    if got.shape != want.shape:
      raise ConfigError(field, f"parameter {jax.tree_util.keystr(path[0])} has shape {got.shape}, "
                        f"config.model needs {want.shape}", workdir)
  return params
