"""The generic loop on a tiny in-test model: bitwise resume, checkpoint retention, metrics sinks."""

import glob
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.loop import LoopConfig, NonFiniteError, train_loop
from jaxpt.engine.metrics import MetricWriter, read_metrics
from jaxpt.engine.optim import make_optimizer
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import make_train_step
from tests.test_train_fixtures import batches_from, tiny_loss_fn, tiny_params

STEPS = 12
LOOP = LoopConfig(steps=STEPS, log_every=3, eval_every=4, checkpoint_every=5, keep_checkpoints=2, progress=False)


@pytest.fixture(scope="module")
def setup():
  optim = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=3, end_lr_fraction=0.1, b1=0.9, b2=0.95,
                                         eps=1e-8, weight_decay=0.1, grad_clip=1.0))
  optimizer, schedule = make_optimizer(optim, STEPS)
  train_step = jax.jit(make_train_step(tiny_loss_fn, optimizer, schedule))
  init = lambda: TrainState.create(tiny_params(), optimizer, jax.random.PRNGKey(7))
  eval_batch = next(batches_from(10_000))
  evaluate = jax.jit(lambda state: {"eval_loss": tiny_loss_fn(state.params, eval_batch, None)[1]["nll"]})
  return init, train_step, evaluate


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
  init, train_step, evaluate = setup
  workdir = str(tmp_path_factory.mktemp("straight"))
  return workdir, train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate, meta={"run": "a"})


def test_resume_is_bitwise_identical(setup, uninterrupted, tmp_path):
  init, train_step, evaluate = setup
  workdir = str(tmp_path)
  first = train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate, stop_at=7)
  assert int(first.state.step) == 7 and not first.preempted
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "7"))
  # A fresh init state: everything must come from the checkpoint.
  second = train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate)
  want = uninterrupted[1].state
  assert int(second.state.step) == STEPS
  for got, ref in zip(jax.tree.leaves(second.state), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  # metrics.jsonl: one row per logged step (plus one at the stop), same eval results as the uninterrupted run.
  rows, want_rows = read_metrics(workdir), read_metrics(uninterrupted[0])
  assert [r["step"] for r in rows] == [3, 4, 6, 7, 8, 9, 12]
  strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_per_sec")}
  assert [strip(r) for r in rows[:3]] == [strip(r) for r in want_rows[:3]]
  evals = lambda rows: [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
  assert evals(rows) == evals(want_rows)


def test_a_metrics_row_cut_mid_write_is_left_out_and_the_run_resumes(setup, uninterrupted, tmp_path, caplog):
  """Found by tools/fault_injection.py: a full disk cut a metrics.jsonl row, and every relaunch then died in
  json.loads (a traceback, the run never resumed). The cut row is left out with a warning naming its line."""
  init, train_step, evaluate = setup
  workdir = str(tmp_path)
  train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate, stop_at=7)
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path) as f:
    lines = f.readlines()
  with open(path, "w") as f:  # the row of step 6 cut, as a full disk or a kill leaves it
    f.writelines(lines[:2] + [lines[2][:40]])
  resumed = train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate)
  assert int(resumed.state.step) == STEPS
  assert [r["step"] for r in read_metrics(workdir)] == [3, 4, 8, 9, 12]
  assert f"{path}:3: a row that does not read" in caplog.text


def test_metrics_rows_checkpoints_and_plots(uninterrupted):
  workdir, result = uninterrupted
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [3, 4, 6, 8, 9, 12]
  for row in rows:
    for key in ("step", "loss", "nll", "accuracy", "lr", "grad_norm", "tokens_per_sec"):
      assert np.isfinite(row[key]), (key, row)
  assert [r["step"] for r in rows if "eval_loss" in r] == [4, 8, 12]
  assert rows[-1]["eval_loss"] < rows[0]["loss"]
  assert result.last_row["step"] == STEPS
  # keep_checkpoints=2 of saves at 5, 10, 12.
  assert sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
                if os.path.basename(p).isdigit()) == [10, 12]
  assert glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))
  with open(os.path.join(workdir, "loss.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert json.loads(f.readline())["step"] == 3


def test_loss_png_is_drawn_once_at_the_end(setup, tmp_path, monkeypatch):
  """Evals at steps 4, 8, 12 do not redraw loss.png: the loop draws it once, from the writer's in-memory rows."""
  init, train_step, evaluate = setup
  drawn = []
  plot = MetricWriter.plot
  monkeypatch.setattr(MetricWriter, "plot", lambda self: drawn.append(len(self.rows)) or plot(self))
  train_loop(init(), train_step, batches_from, LOOP, str(tmp_path), eval_fn=evaluate)
  assert drawn == [len(read_metrics(str(tmp_path)))]
  with open(os.path.join(tmp_path, "loss.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_finished_run_restarts_as_a_no_op(setup, uninterrupted):
  init, train_step, evaluate = setup
  workdir, result = uninterrupted
  again = train_loop(init(), train_step, batches_from, LOOP, workdir, eval_fn=evaluate)
  assert int(again.state.step) == STEPS
  for got, ref in zip(jax.tree.leaves(again.state.params), jax.tree.leaves(result.state.params)):
    np.testing.assert_array_equal(got, ref)


def test_restore_params_reads_only_the_params(uninterrupted):
  """A different optimizer's template: only `params` are read, equal to the run's final params."""
  from jaxpt.engine.checkpoint import Checkpointer

  workdir, result = uninterrupted
  checkpointer = Checkpointer(workdir)
  try:
    params = checkpointer.restore_params(jax.tree.map(np.zeros_like, tiny_params()))
  finally:
    checkpointer.close()
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(result.state.params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_nonfinite_step_stops_the_run_before_it_is_saved(setup, tmp_path):
  """on_nonfinite='stop': a NaN at step 7 raises NonFiniteError naming the step and the quantity; the checkpoint of
  step 5 (finite) is the newest, and the NaN row is in metrics.jsonl."""
  init, train_step, _ = setup

  def poisoned(state, batch):
    state, metrics = train_step(state, batch)
    if int(state.step) == 7:
      metrics = dict(metrics, loss=jnp.nan, nonfinite=1.0)
    return state, metrics

  config = LoopConfig(steps=STEPS, log_every=4, checkpoint_every=5, keep_checkpoints=1, progress=False)
  with pytest.raises(NonFiniteError, match="step 7: non-finite loss"):
    train_loop(init(), poisoned, batches_from, config, str(tmp_path))
  checkpointer = Checkpointer(str(tmp_path))
  assert checkpointer.latest_step() == 5
  checkpointer.close()
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [4, 8] and np.isnan(read_metrics(str(tmp_path))[1]["loss"])


def test_skipped_steps_in_a_row_are_counted_exactly_across_checks(setup, tmp_path, caplog):
  """on_nonfinite='skip': a warning names each skipped step; the count of skips in a row is exact across the checks
  (metrics rows at 4, 8, 12, checkpoints at 5, 10) and reset by a finite step; the third in a row (step 12) stops
  the run before its final checkpoint. Before: every step could be skipped and the run ended as if finished."""
  init, train_step, _ = setup
  flagged = {3, 4, 7, 8, 10, 11, 12}  # 2 in a row, 2 in a row, then 3 in a row across the checkpoint at 10

  def poisoned(state, batch):
    state, metrics = train_step(state, batch)
    return state, dict(metrics, nonfinite=float(int(state.step) in flagged))

  config = LoopConfig(steps=STEPS, log_every=4, checkpoint_every=5, keep_checkpoints=3, progress=False,
                      on_nonfinite="skip", max_skipped_steps=3)
  with caplog.at_level("WARNING"), pytest.raises(NonFiniteError) as raised:
    train_loop(init(), poisoned, batches_from, config, str(tmp_path))
  assert str(raised.value) == ("step 12: non-finite params; stopped after 3 consecutive skipped steps (steps 10-12, "
                               "on_nonfinite='skip', max_skipped_steps=3): the run no longer learns. Lower "
                               "optim.learning_rate")
  skipped = [int(m.split()[1].rstrip(":")) for m in caplog.messages if "its update was skipped" in m]
  assert skipped == sorted(flagged)
  checkpointer = Checkpointer(str(tmp_path))
  assert checkpointer.latest_step() == 10  # due at 10 with 1 in a row; none at 12
  checkpointer.close()
