"""What every trainer's run config holds: `RunConfig` (loop fields, `model`, `optim`, `mesh`, `init_from`).

Each trainer's run config derives from it and adds its own sections (`data`, `loss`, `rm`, `grpo`, ...) and the
cross-section rules (`check`). The CLI or Python API turns a ConfigDict into one with
`jaxpt.config.from_section(XRunConfig, config, "config")`, once; everything below takes the checked object.
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxpt.config import ConfigError, at_least
from jaxpt.models.config import ModelConfig
from jaxpt.parallel.mesh import MeshConfig
from jaxpt.train.loop import LoopConfig
from jaxpt.train.optim import OptimConfig

__all__ = ["RunConfig", "check_init_from", "check_vocab", "config_json", "init_from_tokenizer"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(LoopConfig):
  """What every run config holds: the loop's fields (`jaxpt.train.loop.LoopConfig`: steps, log_every, ...) and these.

  Attributes:
    model: the transformer (required section).
    optim: the optimizer and its learning-rate schedule (required section).
    mesh: the device mesh and sharding rules (default: every device on `data`).
    seed: seed of the parameter init, the data order and the run's random keys.
    init_from: '' = random init, else a jaxpt run's workdir whose latest checkpoint's params start this run.
    allow_changes: comma-separated fields or sections ('steps,optim.learning_rate', 'optim', 'inputs') this launch
      may change when it resumes a run recorded with other values (`jaxpt.train.record`); '' = resume only the run
      as recorded.
  """

  model: ModelConfig
  optim: OptimConfig
  mesh: MeshConfig = MeshConfig()
  seed: int = 0
  init_from: str = ""
  allow_changes: str = ""

  def check(self) -> None:
    super().check()
    at_least(self, "seed", 0)
    if self.init_from:
      check_init_from(self.init_from)

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


def check_init_from(workdir: str) -> None:
  """ConfigError naming init_from unless `workdir` is a jaxpt language-model run (pretrain, SFT, GRPO, DPO) with a
  checkpoints/ folder: a reward model's params (backbone + score head) start no policy or backbone."""
  path = os.path.expanduser(workdir)
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise ConfigError("init_from", "no checkpoints/ folder there (expected the workdir of a jaxpt run, or '' "
                      "for random init)", workdir)
  try:
    with open(os.path.join(path, "config.json")) as f:
      recorded = json.load(f)
  except (OSError, ValueError):
    return  # no readable record: the restore itself checks the params tree
  if isinstance(recorded, dict) and "rm" in recorded:
    raise ConfigError("init_from", "is the workdir of a reward-model run (jaxpt rm); init_from takes a language-model "
                      "run (jaxpt pretrain, sft, grpo or dpo)", workdir)


def init_from_tokenizer(init_from: str, workdir: str | None = None):
  """The tokenizer of the `init_from` run (`<init_from>/tokenizer/spm.model`), as it is: never retrained, since the
  policy's embedding rows are its ids. With `workdir`, also copied to `<workdir>/tokenizer/spm.model` (so that run
  can be a later run's init_from). ConfigError naming init_from when there is none."""
  from jaxpt.data.tokenizer import Tokenizer  # here: the config layer does not load sentencepiece

  path = os.path.join(os.path.expanduser(init_from), "tokenizer", "spm.model")
  if not os.path.exists(path):
    raise ConfigError("config.init_from", "no tokenizer/spm.model there", init_from)
  tokenizer = Tokenizer.load(path)
  if workdir is not None:
    target = os.path.join(workdir, "tokenizer", "spm.model")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
      f.write(tokenizer.model_proto)
    os.replace(tmp, target)
  return tokenizer


def check_vocab(model: ModelConfig, tokenizer_vocab_size: int) -> None:
  """ConfigError naming config.model.vocab_size when the tokenizer has more tokens than the embedding has rows."""
  if tokenizer_vocab_size > model.vocab_size:
    raise ConfigError("config.model.vocab_size", f"smaller than the tokenizer's {tokenizer_vocab_size} tokens",
                      model.vocab_size)


def config_json(config: RunConfig) -> dict:
  """The run config as a JSON-able dict (config.json, checkpoint metadata)."""
  return dataclasses.asdict(config)
