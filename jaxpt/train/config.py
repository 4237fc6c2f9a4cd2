"""Top-level run-config validation: once, before any work, with errors that name the field.

A run config (see `experiments/configs/`) is a ConfigDict with top-level `seed`, `steps`, `log_every`,
`eval_every`, `checkpoint_every`, `keep_checkpoints` and sub-dicts `model` (ModelConfig fields), `data`, `optim`,
`loss` and, optionally, `mesh` (jaxpt.parallel.MeshConfig fields; checks that need the devices happen later).
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from jaxpt.data import config as data_config_lib
from jaxpt.losses import get_loss
from jaxpt.models.config import ConfigError, ModelConfig
from jaxpt.parallel.mesh import MeshConfig

__all__ = ["ConfigChecker", "ConfigError", "check_optim", "check_run_fields", "check_vocab", "validate_config"]

TOP_LEVEL = ("seed", "steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints")
OPTIM_FIELDS = ("learning_rate", "warmup_steps", "end_lr_fraction", "b1", "b2", "eps", "weight_decay", "grad_clip",
                "grad_accum_steps")
DATA_FIELDS = ("path", "seq_len", "batch_size", "eval_batches", "eval_fraction")


class ConfigChecker:
  """Reads `config.<path>` and raises ConfigError(`config.<path>=<value>: <message>`)."""

  def __init__(self, config: Any):
    self.config = config

  def get(self, path: str) -> Any:
    node = self.config
    for part in path.split("."):
      if part not in node:
        raise ConfigError(f"config.{path}: missing")
      node = node[part]
    return node

  def fail(self, path: str, message: str) -> None:
    raise ConfigError(f"config.{path}={self.get(path)!r}: {message}")

  def integer(self, path: str, minimum: int) -> int:
    value = self.get(path)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      self.fail(path, "must be an integer")
    if value < minimum:
      self.fail(path, f"must be >= {minimum}")
    return int(value)

  def number(self, path: str, low: float, high: float = float("inf"), low_open: bool = False,
             high_open: bool = False) -> float:
    value = self.get(path)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      self.fail(path, "must be a number")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
      left, right = "(" if low_open else "[", ")" if high_open else "]"
      self.fail(path, f"must be in {left}{low}, {high}{right}")
    return float(value)


def check_run_fields(config: Any) -> ModelConfig:
  """The fields every trainer reads: top-level loop fields and `model`; returns the validated ModelConfig."""
  check = ConfigChecker(config)
  check.get("model")
  check.integer("seed", 0)
  check.integer("steps", 0)
  check.integer("log_every", 1)
  check.integer("eval_every", 0)
  check.integer("checkpoint_every", 0)
  check.integer("keep_checkpoints", 1)
  return ModelConfig.from_dict(check.get("model").to_dict(), prefix="config.model")


def check_vocab(model: ModelConfig, tokenizer_vocab_size: int) -> None:
  """ConfigError naming config.model.vocab_size when the tokenizer has more tokens than the embedding has rows."""
  if tokenizer_vocab_size > model.vocab_size:
    raise ConfigError(f"config.model.vocab_size={model.vocab_size}: smaller than the tokenizer's "
                      f"{tokenizer_vocab_size} tokens")


def check_optim(config: Any, batch_field: str = "data.batch_size") -> None:
  """`config.optim` (see experiments/configs/base.py); grad_accum_steps must divide `config.<batch_field>`."""
  check = ConfigChecker(config)
  check.number("optim.learning_rate", 0.0, low_open=True)
  check.integer("optim.warmup_steps", 0)
  check.number("optim.end_lr_fraction", 0.0, 1.0)
  check.number("optim.b1", 0.0, 1.0, high_open=True)
  check.number("optim.b2", 0.0, 1.0, high_open=True)
  check.number("optim.eps", 0.0, low_open=True)
  check.number("optim.weight_decay", 0.0)
  check.number("optim.grad_clip", 0.0)
  accum = check.integer("optim.grad_accum_steps", 1)
  batch_size = check.integer(batch_field, 1)
  if batch_size % accum:
    check.fail("optim.grad_accum_steps", f"must divide config.{batch_field}={batch_size}")


def validate_config(config: Any) -> ModelConfig:
  """Checks every field a pretraining run uses; returns the validated ModelConfig. Raises ConfigError naming the
  field."""
  check = ConfigChecker(config)
  for section in ("model", "data", "optim", "loss"):
    check.get(section)
  model = check_run_fields(config)

  seq_len = check.integer("data.seq_len", 1)
  if seq_len > model.max_seq_len:
    check.fail("data.seq_len", f"longer than config.model.max_seq_len={model.max_seq_len}")
  check.integer("data.batch_size", 1)
  check.integer("data.eval_batches", 0)
  check.number("data.eval_fraction", 0.0, 1.0, low_open=True, high_open=True)
  path = check.get("data.path")
  tfds_name = config.data.get("tfds_name", "") or ""
  if not isinstance(path, str):
    check.fail("data.path", "must be a string ('' = the embedded default corpus)")
  if path and not tfds_name and not os.path.exists(os.path.expanduser(path)):
    check.fail("data.path", "no such file or directory")
  try:
    data_config_lib.validate(config.data)  # the data layer's own checks (types, ranges, tfds fields)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  check_optim(config)

  name = check.get("loss.name")
  try:
    get_loss(name)
  except KeyError as e:
    check.fail("loss.name", str(e.args[0]))
  if "z_loss" in config.loss:
    check.number("loss.z_loss", 0.0)
  MeshConfig.from_config(config)
  return model
