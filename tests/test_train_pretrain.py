"""Pretraining end to end on the real TransformerLM and data pipeline, shrunk to run in seconds.

Shares one `build_pretraining` (data, compiled step) across the module; test_cli_pretrain.py reuses MICRO.
"""

import glob
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.configs import tiny
import jaxpt
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.step import accumulate_gradients
from tests.runs import latest_state, sigterm_after_first_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "configs", "tiny.py")
# `--config.<key>=<value>` overrides of experiments/configs/tiny.py: a ~50k-param model, 32-token rows.
MICRO = {
    "steps": 30, "log_every": 5, "eval_every": 10, "checkpoint_every": 0, "progress": False,
    "model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
    "model.num_kv_heads": 2, "model.mlp_dim": 64, "model.max_seq_len": 32,
    "data.seq_len": 32, "data.batch_size": 8, "data.eval_batches": 2, "data.max_corpus_bytes": 200_000,
    "optim.warmup_steps": 5, "optim.learning_rate": 1e-2,
}


def micro_config(**extra):
  config = tiny.get_config()
  for key, value in {**MICRO, **extra}.items():
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


def final_params(workdir, setup):
  return latest_state(workdir, setup.training.init_state())


@pytest.fixture(scope="session")
def micro_setup(tmp_path_factory):
  config = micro_config()
  return config, jaxpt.build("pretrain", config, str(tmp_path_factory.mktemp("micro_data")))


@pytest.fixture(scope="session")
def micro_run(micro_setup, tmp_path_factory):
  """An uninterrupted MICRO run: (workdir, LoopResult)."""
  config, setup = micro_setup
  workdir = str(tmp_path_factory.mktemp("micro_run"))
  return workdir, jaxpt.train("pretrain", config, workdir, built=setup)


def test_eval_loss_finite_and_decreasing(micro_run):
  rows = [r for r in read_metrics(micro_run[0]) if "eval_loss" in r]
  assert [r["step"] for r in rows] == [10, 20, 30]
  losses = [r["eval_loss"] for r in rows]
  assert np.all(np.isfinite(losses)) and losses[0] > losses[1] > losses[2], losses
  assert losses[-1] < np.log(512)  # better than uniform over the vocabulary
  np.testing.assert_allclose(rows[-1]["eval_ppl"], np.exp(losses[-1]), rtol=1e-6)


def test_writes_metrics_tensorboard_plot_and_config(micro_run):
  workdir, result = micro_run
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
  for row in rows:
    for key in ("loss", "lr", "grad_norm", "tokens_per_sec"):
      assert np.isfinite(row[key]) and row[key] >= 0, (key, row)
  assert rows[-1]["loss"] < rows[0]["loss"]
  assert glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))
  assert os.path.getsize(os.path.join(workdir, "loss.png")) > 1000
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["d_model"] == 32
  assert int(result.state.step) == 30


def test_resume_gives_bitwise_identical_params(micro_setup, micro_run, tmp_path):
  config, setup = micro_setup
  workdir = str(tmp_path)
  assert int(jaxpt.train("pretrain", config, workdir, built=setup, stop_at=13).state.step) == 13
  resumed = jaxpt.train("pretrain", config, workdir, built=setup).state
  want = micro_run[1].state
  for got, ref in zip(jax.tree.leaves(resumed), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def _cli(workdir, **extra):
  overrides = [f"--config.{k}={v}" for k, v in {**MICRO, **extra}.items()]
  return [sys.executable, "-m", "jaxpt.cli", "pretrain", "--config", TINY, *overrides, "--workdir", workdir]


def test_a_diverging_run_exits_non_zero_and_keeps_only_finite_checkpoints(micro_setup, tmp_path):
  """learning_rate 1e3: the loss turns NaN; exit code 3 with one line naming the step and quantity, and the newest
  kept checkpoint is older than that step and finite (on_nonfinite='stop', the default)."""
  workdir = str(tmp_path)
  done = subprocess.run(_cli(workdir, **{"optim.learning_rate": 1e3, "checkpoint_every": 2, "log_every": 1}),
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 3, done.stderr[-3000:]
  found = re.search(r"jaxpt pretrain: step (\d+): non-finite (loss|grad_norm|params)", done.stderr)
  assert found and "Traceback" not in done.stderr, done.stderr[-3000:]
  saved = sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")) if name.isdigit())
  assert saved and saved[-1] < int(found.group(1)), (saved, found.group(0))
  state = final_params(workdir, micro_setup[1])
  assert int(state.step) == saved[-1]
  assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.params))


def test_sigterm_checkpoints_and_restart_finishes_like_uninterrupted(micro_setup, micro_run, tmp_path):
  config, setup = micro_setup
  workdir = str(tmp_path)
  returncode, out, err = sigterm_after_first_row(_cli(workdir, log_every=1), workdir, ROOT)
  assert returncode == 75, err[-3000:]  # EXIT_PREEMPTED: a scheduler sees the run did not finish
  assert "SIGTERM" in out, out
  reached = read_metrics(workdir)[-1]["step"]
  assert 1 <= reached < config.steps
  checkpointer = Checkpointer(workdir)
  assert checkpointer.latest_step() == reached
  checkpointer.close()

  done = subprocess.run(_cli(workdir), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"finished step {config.steps}" in done.stdout
  resumed = final_params(workdir, setup)
  for got, ref in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_lm_grad_accumulation_matches_full_batch(micro_setup):
  """On the real model and packed batches (positions, segment ids, padding): accum 4 over B=8 == one pass."""
  _, setup = micro_setup
  params = setup.training.init_state().params
  loss_fn = make_lm_loss_fn(setup.training.model, "lm_cross_entropy", z_loss=1e-4)
  batch = setup.data.train_batch(0)
  batch["weights"][:2] = 0.0  # a fully padded micro-batch
  grads = {k: jax.jit(accumulate_gradients, static_argnums=(0, 4))(loss_fn, params, batch, jax.random.PRNGKey(0), k)
           for k in (1, 4)}
  for full, acc in zip(jax.tree.leaves(grads[1][0]), jax.tree.leaves(grads[4][0])):
    np.testing.assert_allclose(acc, full, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(grads[4][1]["loss"], grads[1][1]["loss"], rtol=1e-5)
