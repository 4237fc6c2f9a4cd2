"""`jaxpt vit` end to end on the digits, shrunk to seconds: it learns, evaluates top-1, resumes bitwise.

Shares one `build_vit` (data, compiled step) across the module.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.configs import vit_digits
import jaxpt
from jaxpt.config import ConfigError
from jaxpt.engine.evaluate import evaluate_run
from jaxpt.engine.metrics import read_metrics
from tests.runs import latest_state, sigterm_after_first_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments", "configs", "vit_digits.py")
# `--config.<key>=<value>` overrides of experiments/configs/vit_digits.py: a one-layer d_model-32 ViT on 4x4 patches
# (a ViT on 2x2 patches needs a few hundred steps to learn where its tokens are: 17% top-1 after 60).
MICRO = {
    "steps": 150, "log_every": 25, "eval_every": 75, "checkpoint_every": 0, "progress": False,
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
    "vit.patch_size": 4, "data.batch_size": 32, "optim.warmup_steps": 5, "optim.learning_rate": 1e-2,
}


def micro_config(**extra):
  config = vit_digits.get_config()
  config.update_from_flattened_dict({**MICRO, **extra})
  return config


@pytest.fixture(scope="module")
def micro_setup(tmp_path_factory):
  config = micro_config()
  return config, jaxpt.build("vit", config, str(tmp_path_factory.mktemp("vit_setup")))


@pytest.fixture(scope="module")
def micro_run(micro_setup, tmp_path_factory):
  config, setup = micro_setup
  workdir = str(tmp_path_factory.mktemp("vit_run"))
  return workdir, jaxpt.train("vit", config, workdir, built=setup)


def test_learns_the_digits_well_above_chance(micro_run):
  workdir, result = micro_run
  rows = [r for r in read_metrics(workdir) if "eval_top1" in r]
  assert [r["step"] for r in rows] == [75, 150]
  assert rows[-1]["eval_top1"] > 0.4 and rows[-1]["eval_val_top1"] > 0.4, rows[-1]  # chance: 0.1
  assert rows[-1]["eval_loss"] < rows[0]["eval_loss"] < np.log(10)
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["vit"]["patch_size"] == 4
  assert int(result.state.step) == 150


def test_jaxpt_eval_reproduces_the_last_eval_row(micro_run):
  workdir, _ = micro_run
  row = evaluate_run(workdir)
  last = [r for r in read_metrics(workdir) if "eval_top1" in r][-1]
  assert row["run"] == "vit" and row["step"] == 150
  np.testing.assert_allclose(row["eval_top1"], last["eval_top1"], rtol=1e-6)


def test_resume_gives_bitwise_identical_params(micro_setup, micro_run, tmp_path):
  config, setup = micro_setup
  workdir = str(tmp_path)
  assert int(jaxpt.train("vit", config, workdir, built=setup, stop_at=17).state.step) == 17
  resumed = jaxpt.train("vit", config, workdir, built=setup).state
  for got, want in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _cli(workdir, **extra):
  overrides = [f"--config.{k}={v}" for k, v in {**MICRO, **extra}.items()]
  return [sys.executable, "-m", "jaxpt.cli", "vit", "--config", CONFIG, *overrides, "--workdir", workdir]


@pytest.mark.slow  # bitwise resume: the test above; SIGTERM and a fresh process: test_train_pretrain's and cli_signals'
def test_cli_killed_and_rerun_finishes_like_uninterrupted(micro_setup, micro_run, tmp_path):
  """`jaxpt vit` stopped by SIGTERM after its first metrics row, then rerun in a fresh process: the final params
  equal the uninterrupted in-process run's bit for bit (data order and augmentation are functions of the step)."""
  workdir = str(tmp_path)
  returncode, _, err = sigterm_after_first_row(_cli(workdir, log_every=1), workdir, ROOT)
  assert returncode == 75, err[-3000:]
  assert 1 <= read_metrics(workdir)[-1]["step"] < 150
  done = subprocess.run(_cli(workdir), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "jaxpt vit: finished step 150" in done.stdout and "eval_top1=" in done.stdout, done.stdout
  resumed = latest_state(workdir, micro_setup[1].training.init_state())
  for got, want in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("key, value, message", [
    ("vit.image_size", 16, "config.vit.image_size=16: the data set 'digits' has 8x8 images"),
    ("vit.channels", 3, "config.vit.channels=3: the data set 'digits' has 1 channels"),
    ("model.causal", True, "config.model.causal=True: a ViT attends bidirectionally"),
    ("label_smoothing", 1.0, "config.label_smoothing=1.0: must be in [0.0, 1.0)"),
])
def test_impossible_config_names_the_field(key, value, message, tmp_path):
  with pytest.raises(ConfigError) as error:
    jaxpt.build("vit", micro_config(**{key: value}), str(tmp_path))
  assert str(error.value).startswith(message), str(error.value)
