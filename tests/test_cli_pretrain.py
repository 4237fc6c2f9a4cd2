"""Config validation up front: each impossible config fails at once with a message naming its field."""

import os
import subprocess
import sys

import pytest

from experiments.configs import tiny
from jaxpt import cli
from jaxpt.config import ConfigError, from_section
from jaxpt.trainers.pretrain import PretrainRunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "configs", "tiny.py")


def _set(config, key, value):
  *parents, leaf = key.split(".")
  for part in parents:
    config = config[part]
  config[leaf] = value


def validate_config(config) -> PretrainRunConfig:
  return from_section(PretrainRunConfig, config, "config")


def test_tiny_config_is_valid():
  model = validate_config(tiny.get_config()).model
  assert model.d_model == 128 and model.norm_scheme == "siamese_post_pre"


@pytest.mark.parametrize("key, value, message", [
    ("steps", -1, "config.steps=-1: must be >= 0"),
    ("log_every", 0, "config.log_every=0: must be >= 1"),
    ("seed", -3, "config.seed=-3: must be >= 0"),
    ("keep_checkpoints", 0, "config.keep_checkpoints=0: must be >= 1"),
    ("model.d_model", 130, "config.model.d_model=130: not divisible by model.num_heads=4"),
    ("model.norm_scheme", "sideways", "config.model.norm_scheme='sideways': must be one of"),
    ("data.seq_len", 4096, "config.data.seq_len=4096: longer than config.model.max_seq_len=128"),
    ("data.path", "/no/such/corpus", "config.data.path='/no/such/corpus': no such file or directory"),
    ("data.eval_fraction", 1.0, "config.data.eval_fraction=1.0: must be in (0.0, 1.0)"),
    ("optim.learning_rate", 0.0, "config.optim.learning_rate=0.0: must be in (0.0, inf]"),
    ("optim.end_lr_fraction", 2.0, "config.optim.end_lr_fraction=2.0: must be in [0.0, 1.0]"),
    ("optim.grad_accum_steps", 3, "config.optim.grad_accum_steps=3: must divide config.data.batch_size=16"),
    ("loss.name", "mse", "config.loss.name='mse': unknown lm loss 'mse' (known: lm_cross_entropy"),
    ("loss.name", "bt", "config.loss.name='bt': 'bt' is a preference loss, not a lm loss (lm losses: "),
    ("loss.z_loss", -1e-4, "config.loss.z_loss=-0.0001: must be in [0.0, inf]"),
])
def test_impossible_config_names_the_field(key, value, message):
  config = tiny.get_config()
  _set(config, key, value)
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert str(error.value).startswith(message), str(error.value)


def test_missing_section_is_named():
  config = tiny.get_config()
  del config["optim"]
  with pytest.raises(ConfigError, match=r"^config\.optim: missing"):
    validate_config(config)


@pytest.mark.parametrize("override, field", [
    ("--config.steps=-1", "config.steps=-1: must be >= 0"),
    ("--config.model.norm_scheme=sideways", "config.model.norm_scheme='sideways'"),
    ("--config.no_such_field=1", "no config field 'no_such_field'"),
    ("--config.loss.name=bt", "config.loss.name='bt': 'bt' is a preference loss, not a lm loss"),
])
def test_cli_reports_config_error_without_traceback(override, field, tmp_path):
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "pretrain", "--config", TINY, override,
                           "--workdir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
  assert result.returncode == 2
  assert field in result.stderr and "Traceback" not in result.stderr, result.stderr
  assert not os.path.exists(tmp_path / "run")  # failed before any work


@pytest.mark.parametrize("argv, code", [(["jaxpt"], 2), (["jaxpt", "--help"], 0), (["jaxpt", "frobnicate"], 2)])
def test_cli_usage_lists_subcommands(argv, code, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(argv)
  assert exit_info.value.code == code
  captured = capsys.readouterr()
  assert "pretrain" in captured.out + captured.err


def test_cli_reports_a_bad_data_line_in_one_line(tmp_path):
  """A malformed preference file: exit 2, `data error: <file>:<line>: ...`, no traceback, no `config.` glued on."""
  bad = tmp_path / "prefs.jsonl"
  bad.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "p", "chosen": 3}\n')
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "rm", "--config",
                           os.path.join(ROOT, "experiments", "configs", "rm_tiny.py"), f"--config.data.source={bad}",
                           "--workdir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert f"jaxpt rm: data error: {bad}:2: " in result.stderr and "Traceback" not in result.stderr, result.stderr
