"""What every trainer's run config holds: `RunConfig` (loop fields, `model`, `optim`, `mesh`, `init_from`).

Each trainer's run config derives from it and adds its own sections (`data`, `loss`, `rm`, `grpo`, ...) and the
cross-section rules (`check`). The CLI or Python API turns a ConfigDict into one with
`jaxpt.config.from_section(XRunConfig, config, "config")`, once; everything below takes the checked object.
"""

from __future__ import annotations

import dataclasses
import os

from jaxpt.config import ConfigError, at_least
from jaxpt.models.config import ModelConfig
from jaxpt.parallel.mesh import MeshConfig
from jaxpt.train.loop import LoopConfig
from jaxpt.train.optim import OptimConfig

__all__ = ["RunConfig", "check_vocab", "config_json"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(LoopConfig):
  """The loop's fields (`jaxpt.train.loop.LoopConfig`: steps, log_every, ...), model and optim (required
  sections), mesh (default: every device on `data`), seed, and init_from: '' = random init, else a jaxpt run's
  workdir whose latest checkpoint's params start this run."""

  model: ModelConfig
  optim: OptimConfig
  mesh: MeshConfig = MeshConfig()
  seed: int = 0
  init_from: str = ""

  def check(self) -> None:
    super().check()
    at_least(self, "seed", 0)
    if self.init_from and not os.path.isdir(os.path.join(os.path.expanduser(self.init_from), "checkpoints")):
      raise ConfigError("init_from", "no checkpoints/ folder there (expected the workdir of a jaxpt run, or '' "
                        "for random init)", self.init_from)

  @property
  def loop(self) -> LoopConfig:
    return LoopConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoopConfig)})

  def check_batch_split(self, rows: int, rows_field: str) -> None:
    """ConfigError naming optim.grad_accum_steps when it does not divide the `rows` of a step's batch."""
    if rows % self.optim.grad_accum_steps:
      raise ConfigError("optim.grad_accum_steps", f"must divide {rows_field}={rows}", self.optim.grad_accum_steps)

  def check_seq_len(self, seq_len: int, seq_len_field: str) -> None:
    """ConfigError naming `seq_len_field` when it is longer than the model's max_seq_len."""
    if seq_len > self.model.max_seq_len:
      raise ConfigError(seq_len_field, f"longer than config.model.max_seq_len={self.model.max_seq_len}", seq_len)


def check_vocab(model: ModelConfig, tokenizer_vocab_size: int) -> None:
  """ConfigError naming config.model.vocab_size when the tokenizer has more tokens than the embedding has rows."""
  if tokenizer_vocab_size > model.vocab_size:
    raise ConfigError("config.model.vocab_size", f"smaller than the tokenizer's {tokenizer_vocab_size} tokens",
                      model.vocab_size)


def config_json(config: RunConfig) -> dict:
  """The run config as a JSON-able dict (config.json, checkpoint metadata)."""
  return dataclasses.asdict(config)
