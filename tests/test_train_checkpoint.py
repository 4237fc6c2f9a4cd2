"""Checkpointer: manifests, the fall-back to the newest intact checkpoint, and one-line errors (issue 12, item 4)."""

import concurrent.futures
import glob
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpt.engine.checkpoint import MANIFEST, SKIPPED_DIR, CheckpointError, Checkpointer
from jaxpt.engine.state import TrainState


def _state(step: int, width: int = 3) -> TrainState:
  params = {"w": jnp.full((4, width), float(step)), "b": jnp.full((width,), float(step))}
  state = TrainState.create(params, optax.adam(1e-3), jax.random.PRNGKey(0))
  return state.replace(step=jnp.asarray(step, jnp.int32))


def _save_steps(workdir: str, steps=(1, 2, 3)) -> None:
  checkpointer = Checkpointer(workdir)
  for step in steps:
    checkpointer.save(_state(step))
  checkpointer.close()


def _array_files(workdir: str, step: int) -> list[str]:
  files = glob.glob(os.path.join(workdir, "checkpoints", str(step), "state", "**", "d", "*"), recursive=True)
  return sorted(f for f in files if os.path.isfile(f))


def _restore(workdir: str, template: TrainState) -> TrainState:
  checkpointer = Checkpointer(workdir)
  try:
    return checkpointer.restore_latest(template)
  finally:
    checkpointer.close()


def test_every_committed_step_gets_a_manifest(tmp_path):
  _save_steps(str(tmp_path))
  for step in (1, 2, 3):
    assert os.path.exists(tmp_path / "checkpoints" / str(step) / MANIFEST)
  assert int(_restore(str(tmp_path), _state(0)).step) == 3


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "delete"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
  workdir = str(tmp_path)
  _save_steps(workdir)
  victim = max(_array_files(workdir, 3), key=os.path.getsize)
  if damage == "truncate":
    os.truncate(victim, os.path.getsize(victim) // 2)
  elif damage == "flip_byte":
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(victim, "wb").write(bytes(data))
  else:
    os.remove(victim)
  restored = _restore(workdir, _state(0))
  assert int(restored.step) == 2
  np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.full((4, 3), 2.0))
  # the damaged step is kept for inspection, out of the way: saving step 3 again works and restores
  assert [os.path.basename(p).split(".")[0] for p in glob.glob(str(tmp_path / SKIPPED_DIR / "*"))] == ["3"]
  checkpointer = Checkpointer(workdir)
  assert checkpointer.save(_state(3))
  checkpointer.close()
  assert int(_restore(workdir, _state(0)).step) == 3


def test_a_checkpoint_without_manifest_that_orbax_cannot_read_is_skipped(tmp_path):
  """Killed between orbax's commit and the manifest: the step is tried as it is, and skipped if it fails."""
  workdir = str(tmp_path)
  _save_steps(workdir)
  os.remove(tmp_path / "checkpoints" / "3" / MANIFEST)
  metadata = glob.glob(str(tmp_path / "checkpoints" / "3" / "state" / "_METADATA"))[0]
  os.truncate(metadata, os.path.getsize(metadata) // 2)
  assert int(_restore(workdir, _state(0)).step) == 2


def test_a_changed_shape_is_one_line_naming_the_parameter(tmp_path):
  _save_steps(str(tmp_path))
  with pytest.raises(CheckpointError) as error:
    _restore(str(tmp_path), _state(0, width=5))
  message = str(error.value)
  assert "\n" not in message and "step 3" in message, message
  assert "params/b has shape (3,) there, the config gives (5,)" in message or "params/w" in message, message
  assert not os.path.exists(tmp_path / SKIPPED_DIR)  # a config mismatch moves nothing


def test_no_intact_checkpoint_is_one_line_listing_each(tmp_path):
  workdir = str(tmp_path)
  _save_steps(workdir, steps=(1, 2))
  for step in (1, 2):
    for path in _array_files(workdir, step):
      os.truncate(path, 1)
  with pytest.raises(CheckpointError) as error:
    _restore(workdir, _state(0))
  assert "step 2:" in str(error.value) and "step 1:" in str(error.value) and "\n" not in str(error.value)
  assert sorted(os.listdir(tmp_path / "checkpoints")) >= ["1", "2"]  # nothing moved when none restores


def test_a_failed_save_leaves_no_folder_even_when_a_later_write_is_still_running(tmp_path, monkeypatch):
  """Orbax's save thread waits for the writes in turn (the config's JSON, then the state's) and stops at the first
  that fails, while the writes after it go on: here the JSON fails (as on a full disk) and a state write, 1 s late,
  makes its folder as tensorstore does. The clean-up waits for them all before it removes the temporary folder
  (under load, the suite once saw one left behind)."""
  import orbax.checkpoint as ocp

  class FailedWrite:
    def result(self, timeout=None):
      raise OSError(27, "File too large")

  def late_write(directory):
    time.sleep(1.0)
    os.makedirs(directory / "late", exist_ok=True)
    (directory / "late" / "data").write_text("written after the failure")

  save_json, save_state = ocp.JsonCheckpointHandler.async_save, ocp.StandardCheckpointHandler.async_save
  writer = concurrent.futures.ThreadPoolExecutor(1)

  async def failing_json_save(self, *args, **kwargs):
    return [FailedWrite(), *(await save_json(self, *args, **kwargs) or [])]

  async def state_save_with_a_late_write(self, directory, *args, **kwargs):
    return [*(await save_state(self, directory, *args, **kwargs) or []), writer.submit(late_write, directory)]

  monkeypatch.setattr(ocp.JsonCheckpointHandler, "async_save", failing_json_save)
  monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", state_save_with_a_late_write)
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(_state(1))
  with pytest.raises(CheckpointError, match="saving the checkpoint at step 1 .* failed: .*File too large"):
    checkpointer.close()
  writer.shutdown()
  assert os.listdir(tmp_path / "checkpoints") == []
