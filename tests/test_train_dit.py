"""`jaxpt dit` end to end on the digits, shrunk to seconds: the loss falls, `jaxpt eval` reproduces the eval row, a
resumed run ends bit for bit like an uninterrupted one, and the trained model samples.

Shares one `build_dit` (data, compiled step) across the module.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import dit_digits
import jaxpt
from jaxpt.config import ConfigError
from jaxpt.trainers.dit import make_dit_sampler
from jaxpt.engine.evaluate import evaluate_run
from jaxpt.engine.metrics import read_metrics
from tests.runs import latest_state, sigterm_after_first_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments", "configs", "dit_digits.py")
# `--config.<key>=<value>` overrides of experiments/configs/dit_digits.py: a one-layer d_model-32 DiT on 4x4 patches.
MICRO = {
    "steps": 80, "log_every": 10, "eval_every": 40, "checkpoint_every": 0, "progress": False,
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
    "dit.patch_size": 4, "dit.frequency_features": 16, "data.batch_size": 32, "optim.warmup_steps": 5,
    "optim.learning_rate": 3e-3, "sample.num_steps": 5,
}


def micro_config(**extra):
  config = dit_digits.get_config()
  config.update_from_flattened_dict({**MICRO, **extra})
  return config


@pytest.fixture(scope="module")
def micro_setup(tmp_path_factory):
  config = micro_config()
  return config, jaxpt.build("dit", config, str(tmp_path_factory.mktemp("dit_setup")))


@pytest.fixture(scope="module")
def micro_run(micro_setup, tmp_path_factory):
  config, setup = micro_setup
  workdir = str(tmp_path_factory.mktemp("dit_run"))
  return workdir, jaxpt.train("dit", config, workdir, built=setup)


def test_the_diffusion_loss_falls(micro_run):
  """At init the model predicts eps = 0, so the loss starts at E[eps^2] = 1; 80 steps bring it well below."""
  workdir, result = micro_run
  rows = read_metrics(workdir)
  train = [r["loss"] for r in rows if "loss" in r]
  evals = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in evals] == [40, 80] and int(result.state.step) == 80
  assert train[0] > 0.8 and np.mean(train[-3:]) < 0.5, train
  assert evals[-1]["eval_loss"] < 0.5 and evals[-1]["eval_val_loss"] < 0.5, evals[-1]


def test_jaxpt_eval_reproduces_the_last_eval_row(micro_run):
  workdir, _ = micro_run
  row = evaluate_run(workdir)
  last = [r for r in read_metrics(workdir) if "eval_loss" in r][-1]
  assert row["run"] == "dit" and row["step"] == 80
  np.testing.assert_allclose(row["eval_loss"], last["eval_loss"], rtol=1e-6)


def test_resume_gives_bitwise_identical_params(micro_setup, micro_run, tmp_path):
  config, setup = micro_setup
  workdir = str(tmp_path)
  assert int(jaxpt.train("dit", config, workdir, built=setup, stop_at=17).state.step) == 17
  resumed = jaxpt.train("dit", config, workdir, built=setup).state
  for got, want in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_trained_model_samples_images(micro_setup, micro_run):
  config, setup = micro_setup
  sample = make_dit_sampler(setup.config, setup.training.model)
  images = sample(micro_run[1].state.params, jnp.arange(4), jax.random.PRNGKey(0))
  assert images.shape == (4, 8, 8, 1) and float(jnp.max(jnp.abs(images))) <= 1.0  # clip_x0: the last x0_hat
  assert float(jnp.std(images)) > 0.1


@pytest.mark.slow
def test_cli_killed_and_rerun_finishes_like_uninterrupted(micro_setup, micro_run, tmp_path):
  """`jaxpt dit` stopped by SIGTERM after its first metrics row, then rerun in a fresh process: the final params
  equal the uninterrupted in-process run's bit for bit (data order, timesteps and noise are functions of the step)."""
  workdir = str(tmp_path)
  command = lambda **extra: [sys.executable, "-m", "jaxpt.cli", "dit", "--config", CONFIG, "--workdir", workdir,
                             *[f"--config.{k}={v}" for k, v in {**MICRO, **extra}.items()]]
  returncode, _, err = sigterm_after_first_row(command(log_every=1), workdir, ROOT)
  assert returncode == 75, err[-3000:]
  assert 1 <= read_metrics(workdir)[-1]["step"] < 80
  done = subprocess.run(command(), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "jaxpt dit: finished step 80" in done.stdout and "eval_loss=" in done.stdout, done.stdout
  resumed = latest_state(workdir, micro_setup[1].training.init_state())
  for got, want in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("key, value, message", [
    ("dit.image_size", 16, "config.dit.image_size=16: the data set 'digits' has 8x8 images"),
    ("dit.num_classes", 5, "config.dit.num_classes=5: the data set 'digits' has 10 classes"),
    ("model.norm_scheme", "hybrid", "config.model.norm_scheme='hybrid': a DiT has the schemes pre, siamese_post_pre"),
    ("num_timesteps", 1, "config.num_timesteps=1: must be >= 2"),
])
def test_impossible_config_names_the_field(key, value, message, tmp_path):
  with pytest.raises(ConfigError) as error:
    jaxpt.build("dit", micro_config(**{key: value}), str(tmp_path))
  assert str(error.value).startswith(message), str(error.value)
