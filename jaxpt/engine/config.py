"""What every trainer's run config holds: `RunConfig` (the loop's settings, `model`, `optim`, `mesh`, `init_from`).

Each trainer's run config derives from it and adds its own sections (`data`, `loss`, `rm`, `grpo`, ...) and the
cross-section rules (`check`). The CLI or Python API turns a ConfigDict into one with
`jaxpt.config.from_section(XRunConfig, config, "config")`, once; everything below takes the checked object.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from jaxpt.config import ConfigError, DataError, Section, as_dict, at_least, inline, section_values
from jaxpt.models import hf, hf_config, hf_peft
from jaxpt.models.config import ModelConfig
from jaxpt.nn.lora import ROLLOUTS_WITHOUT_LORA, LoRAConfig, resolve_targets
from jaxpt.parallel.mesh import MeshConfig
from jaxpt.engine.loop import LoopConfig
from jaxpt.engine.optim import OptimConfig
from jaxpt.engine.record import NoRunRecord, recorded_config
from jaxpt.engine.trainers import TRAINER_KEY, TRAINERS, recorded_trainer, trainer_list, trainer_of

__all__ = ["RunConfig", "check_hf_model", "check_init_from", "check_overrides", "check_vocab", "config_json"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(Section):
  """What every run config holds: the loop's settings and these.

  Attributes:
    loop: the loop's settings (`jaxpt.engine.loop.LoopConfig`), held inline: its fields are the run config's own
      (`config.steps`, `--config.log_every`, config.json's top level); `config.loop` is the LoopConfig.
    model: the transformer (required section).
    optim: the optimizer and its learning-rate schedule (required section).
    mesh: the device mesh and sharding rules (default: every device on `data`).
    seed: seed of the parameter init, the data order and the run's random keys.
    init_from: '' = random init; a jaxpt run's workdir whose latest checkpoint's params (and tokenizer) start this
      run; or 'hf:DIR', a Hugging Face checkpoint directory (jaxpt.models.hf) whose config.json fills the model's
      architecture fields (those left at their defaults; another value is an error naming both, and so is a
      `--config.model.<field>` override even at the default: `check_overrides`) and whose tokenizer the run uses.
    allow_changes: comma-separated fields or sections ('steps,optim.learning_rate', 'optim', 'inputs') this launch
      may change when it resumes a run recorded with other values (`jaxpt.engine.record`); '' = resume only the run
      as recorded.
    lora: low-rank adapters (`jaxpt.nn.lora`); rank 0 (the default) = off, every parameter trains. The fine-tuning
      trainers take it (`Trainer.lora`); the others refuse a rank > 0.
  """

  loop: LoopConfig = inline(LoopConfig())
  model: ModelConfig
  optim: OptimConfig
  mesh: MeshConfig = MeshConfig()
  seed: int = 0
  init_from: str = ""
  allow_changes: str = ""
  lora: LoRAConfig = LoRAConfig()

  @classmethod
  def prepare_values(cls, values: dict, path: str) -> dict:
    """A recorded config.json's `"trainer"` key is dropped when it names this class's trainer (ConfigError naming it
    otherwise). With `init_from='hf:DIR'`: the model section's fields left at their defaults take DIR's config.json
    values (architecture and max_seq_len); `check` then refuses a set value that contradicts the checkpoint. With
    `lora.init_adapter` (a PEFT adapter directory): the lora fields left at their defaults take its
    adapter_config.json values (`_adapter_fields`)."""
    values = _adapter_fields(_without_trainer_key(cls, values, path), path)
    init_from = values.get("init_from") or ""
    if not isinstance(init_from, str) or not init_from.startswith(hf.HF_PREFIX):
      return values
    fields, _ = _checkpoint_fields(init_from, f"{path}.init_from")
    given = section_values(values.get("model"))
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    filled = {name: value for name, value in fields.items() if given.get(name, defaults[name]) == defaults[name]}
    return {**values, "model": {**given, **filled}}

  def check(self) -> None:
    at_least(self, "seed", 0)
    self.check_lora()
    if self.init_from:
      check_init_from(self.init_from)
    if self.init_from.startswith(hf.HF_PREFIX):
      check_hf_model(self.init_from, self.model)

  def check_lora(self) -> None:
    """ConfigError naming lora.rank for a trainer without adapters (`Trainer.lora`) or a rank above a targeted
    projection's dims, lora.targets for a projection the model lacks (MoE experts), lora.base_quant_block for blocks
    that do not divide a quantized kernel's input axis; then `lora.init_adapter`."""
    if self.lora.init_adapter and not self.lora.enabled:
      raise ConfigError("lora.init_adapter", "needs lora.rank > 0 (the adapters' rank)", self.lora.init_adapter)
    if not self.lora.enabled:
      return
    trainer = trainer_of(type(self))
    if trainer is not None and not trainer.lora:
      raise ConfigError("lora.rank", f"jaxpt {trainer.name} trains every parameter; LoRA is for jaxpt "
                        f"{trainer_list(lambda t: t.lora)}", self.lora.rank)
    try:
      self.lora.check_dims(self.model.projection_dims(), " (MoE experts have none)" if self.model.num_experts else "",
                           self.model.projection_blocked_dims())
    except ConfigError as e:
      raise e.under("lora") from None
    if self.lora.init_adapter:
      self.check_init_adapter()

  def check_init_adapter(self) -> None:
    """ConfigError naming lora.init_adapter without `init_from` (the base the adapters belong to), or when its
    adapter_model.safetensors does not hold exactly this model's adapters in their shapes (file headers only:
    nothing is loaded before compile)."""
    if not self.init_from:
      raise ConfigError("lora.init_adapter", "needs init_from (the base model the adapters were trained on, e.g. "
                        "hf:DIR)", self.lora.init_adapter)
    hf_peft.check_adapter(os.path.expanduser(self.lora.init_adapter), self.model, self.lora, "lora.init_adapter")

  def recorded_before(self, recorded: Mapping[str, Any]) -> dict[str, Any]:
    """{dotted field: value} for the fields that a run's config.json `recorded`, written before they existed, lacks
    and whose default would change what that run does: the value it ran with (`jaxpt.engine.record` compares this
    launch with it on resume). A run recorded before the `lora` section trained without adapters: lora.rank 0."""
    return {} if "lora" in recorded else {"lora.rank": 0}

  def check_batch_split(self, rows: int, rows_field: str) -> None:
    """ConfigError naming optim.grad_accum_steps when it does not divide the `rows` of a step's batch."""
    if rows % self.optim.grad_accum_steps:
      raise ConfigError("optim.grad_accum_steps", f"must divide {rows_field}={rows}", self.optim.grad_accum_steps)

  def check_seq_len(self, seq_len: int, seq_len_field: str) -> None:
    """ConfigError naming `seq_len_field` when it is longer than the model's max_seq_len."""
    if seq_len > self.model.max_seq_len:
      raise ConfigError(seq_len_field, f"longer than config.model.max_seq_len={self.model.max_seq_len}", seq_len)


def _without_trainer_key(cls: type, values: dict, path: str) -> dict:
  """`values` without the `"trainer"` key a run's config.json leads with; ConfigError when it names another trainer
  than the one whose run config `cls` is."""
  if TRAINER_KEY not in values:
    return values
  trainer = trainer_of(cls)
  if trainer is not None and values[TRAINER_KEY] != trainer.name:
    raise ConfigError(f"{path}.{TRAINER_KEY}", f"the config of another trainer's run (this is jaxpt {trainer.name}'s)",
                      values[TRAINER_KEY])
  return {k: v for k, v in values.items() if k != TRAINER_KEY}


PEFT_KEYS = {"rank": "r", "alpha": "lora_alpha", "rslora": "use_rslora", "targets": "target_modules",
             "dropout": "lora_dropout"}  # lora field -> adapter_config.json key


def _adapter_fields(values: dict, path: str) -> dict:
  """`values` with the lora fields left at their defaults taken from the adapter_config.json of
  `lora.init_adapter` (when set); ConfigError naming the field and the file for a set rank, alpha, rslora or
  targets that contradicts it (dropout, which does not change what the adapters compute, may differ)."""
  lora = section_values(values.get("lora"))
  directory = lora.get("init_adapter") or ""
  if not isinstance(directory, str) or not directory:
    return values
  found = hf_peft.read_adapter_fields(os.path.expanduser(directory), f"{path}.lora.init_adapter")
  where = os.path.join(directory, hf_peft.ADAPTER_CONFIG)
  defaults = {f.name: f.default for f in dataclasses.fields(LoRAConfig)}
  for name, value in found.items():
    given = lora.get(name, defaults[name])
    if given == defaults[name]:
      lora[name] = value
    elif name != "dropout" and not _same_lora_value(name, given, value):
      raise _contradiction(path, name, given, value, where)
  return {**values, "lora": lora}


def check_overrides(config: Any, overrides: Mapping[str, Any], path: str = "config") -> None:
  """ConfigError naming the field for a command-line override (`overrides`: flat dotted names -> values, as
  ml_collections' `get_override_values` gives them) that is wrong even at the field's default, which the run config,
  filled from a file holding every field, cannot tell from a field left unset: one contradicting lora.init_adapter's
  adapter (`check_adapter_overrides`), lora.rollouts with LoRA off, a model field contradicting the config.json of
  an `init_from='hf:DIR'` start (`check_hf_fields`; `prepare_values` fills a field at its default from the file:
  `--config.model.qkv_bias=False` over a checkpoint with qkv biases would train with them)."""
  check_adapter_overrides(config, overrides, path)
  init_from = section_values(config).get("init_from")
  if isinstance(init_from, str) and init_from.startswith(hf.HF_PREFIX):
    model = {name.split(".", 1)[1]: value for name, value in overrides.items() if name.startswith("model.")}
    if model.get("head_dim", 0) is None:  # None: derived (d_model / num_heads), as the checkpoint's is
      del model["head_dim"]
    try:
      check_hf_fields(init_from, model)
    except ConfigError as e:
      raise e.under(path) from None
  rank = section_values(section_values(config).get("lora")).get("rank")
  if "lora.rollouts" in overrides and not (isinstance(rank, int) and rank > 0):
    raise ConfigError(f"{path}.lora.rollouts", ROLLOUTS_WITHOUT_LORA, overrides["lora.rollouts"])


def check_adapter_overrides(config: Any, overrides: Mapping[str, Any], path: str = "config") -> None:
  """ConfigError naming the field when a command-line override (`overrides`: flat dotted names -> values, as
  ml_collections' `get_override_values` gives them) sets lora.rank, alpha, rslora or targets to a value that
  contradicts the adapter_config.json of `config`'s `lora.init_adapter`, even the field's default: a config file
  holds every field, so `prepare_values` tells a field set to its default from one left unset only here (where it
  fills it from the file)."""
  lora = section_values(section_values(config).get("lora"))
  directory = lora.get("init_adapter") or ""
  if not isinstance(directory, str) or not directory:
    return
  found = hf_peft.read_adapter_fields(os.path.expanduser(directory), f"{path}.lora.init_adapter")
  where = os.path.join(directory, hf_peft.ADAPTER_CONFIG)
  for name, value in found.items():
    given = overrides.get(f"lora.{name}", value)
    if name != "dropout" and not _same_lora_value(name, given, value):
      raise _contradiction(path, name, given, value, where)


def _contradiction(path: str, name: str, given: Any, value: Any, where: str) -> ConfigError:
  return ConfigError(f"{path}.lora.{name}", f"contradicts {where}, which gives {PEFT_KEYS[name]} ({name}={value!r})",
                     given)


def _same_lora_value(name: str, given, value) -> bool:
  """Whether a set lora field equals the adapter's (targets: the same projections; an invalid value is left to
  LoRAConfig.check)."""
  try:
    if name == "targets":
      return resolve_targets(given) == resolve_targets(value)
    return type(value)(given) == value
  except (TypeError, ValueError):
    return True


def check_init_from(workdir: str, field: str = "init_from", critic: bool = False) -> None:
  """ConfigError naming `field` unless `workdir` is 'hf:DIR' with a checkpoint's config.json and weights, or the
  workdir of a jaxpt run with a checkpoints/ folder whose trainer's runs may start others (`Trainer.starts_runs`):
  a reward model's params (backbone + score head) start no policy or backbone. With `critic` (PPO's
  `ppo.critic_init`) it is the opposite: only a reward-model run starts a critic (its score head becomes the value
  head), and no 'hf:' checkpoint (it has no score head)."""
  if workdir.startswith(hf.HF_PREFIX):
    if critic:
      raise ConfigError(field, "takes a jaxpt reward-model run's workdir (jaxpt "
                        f"{trainer_list(lambda t: t.model == 'reward')}), not an HF checkpoint", workdir)
    try:
      hf.Checkpoint(os.path.expanduser(workdir[len(hf.HF_PREFIX):]))  # finds the weight files, opens none
    except DataError as e:
      raise ConfigError(field, str(e), workdir) from None
    return
  path = os.path.expanduser(workdir)
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise ConfigError(field, "no checkpoints/ folder there (expected the workdir of a jaxpt "
                      + ("reward-model run)" if critic else "run, or '' for random init)"), workdir)
  try:
    name = recorded_trainer(recorded_config(path))
  except NoRunRecord:
    if critic:
      raise ConfigError(field, "is not a jaxpt run (no config.json)", workdir) from None
    return  # no readable record: the restore itself checks the params tree
  if name not in TRAINERS:
    return  # an unknown trainer's run: likewise
  trainer = TRAINERS.get(name)
  if critic and trainer.model != "reward":
    raise ConfigError(field, f"is the workdir of a {trainer.model_kind} run (jaxpt {name}); a critic starts from "
                      f"a reward-model run (jaxpt {trainer_list(lambda t: t.model == 'reward')})", workdir)
  if not critic and not trainer.starts_runs:
    raise ConfigError(field, f"is the workdir of a {trainer.model_kind} run (jaxpt {name}); init_from takes "
                      f"the run of jaxpt {trainer_list(lambda t: t.starts_runs)}", workdir)


def _checkpoint_fields(init_from: str, field: str) -> tuple[dict, tuple[str, ...]]:
  try:
    return hf_config.checkpoint_fields(os.path.expanduser(init_from[len(hf.HF_PREFIX):]))
  except DataError as e:
    raise ConfigError(field, str(e), init_from) from None


def check_hf_model(init_from: str, model: ModelConfig) -> None:
  """ConfigError naming both values when `model` contradicts the architecture of checkpoint `init_from`
  ('hf:DIR'), or wants more positions than a transformers checkpoint has."""
  values = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
  check_hf_fields(init_from, {**values, "head_dim": model.resolved_head_dim})


def check_hf_fields(init_from: str, values: Mapping[str, Any]) -> None:
  """`check_hf_model` for the ModelConfig fields `values` holds ({name: value}; head_dim resolved) alone."""
  directory = os.path.expanduser(init_from[len(hf.HF_PREFIX):])
  fields, architecture = _checkpoint_fields(init_from, "init_from")
  expected = {**fields, "head_dim": fields.get("head_dim") or fields["d_model"] // fields["num_heads"]}
  for name in architecture:
    if name in values and (error := hf_config.contradiction(directory, name, values[name], expected,
                                                            architecture)) is not None:
      raise error
  positions, wanted = fields.get("max_seq_len"), values.get("max_seq_len")
  if architecture is hf_config.ARCHITECTURE_FIELDS:  # a transformers checkpoint: its positions bound max_seq_len
    if positions is not None and wanted is not None and wanted > positions:
      raise ConfigError("model.max_seq_len", f"longer than the {positions} positions of "
                        f"{os.path.join(directory, hf_config.CONFIG_FILE)}", wanted)


def check_vocab(model: ModelConfig, tokenizer_vocab_size: int) -> None:
  """ConfigError naming config.model.vocab_size when the tokenizer has more tokens than the embedding has rows."""
  if tokenizer_vocab_size > model.vocab_size:
    raise ConfigError("config.model.vocab_size", f"smaller than the tokenizer's {tokenizer_vocab_size} tokens",
                      model.vocab_size)


def config_json(config: RunConfig) -> dict:
  """The run config as a JSON-able dict (config.json, checkpoint metadata): the loop's fields at its top level."""
  return as_dict(config)
