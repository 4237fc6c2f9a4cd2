"""The one table of trainers: `TRAINERS`, name -> `Trainer`, read by everything that lists or picks a trainer.

    TRAINERS.get("rm").config_type              # RMRunConfig (its module is imported on first use)
    TRAINERS.get("rm").build_function(config, W)  # the BuiltRun (`jaxpt.engine.run`) that `jaxpt.train` trains
    recorded_trainer(json.load(config.json))  # "rm": the run's "trainer" key (the legacy rule for older runs)

The CLI's training subcommands and their help, `jaxpt eval` (the trainer's build and evaluator), `jaxpt.load` (what
a run's checkpoints hold), `init_from` (which runs may start another), the run record (each run writes its trainer's
name as the top-level `"trainer"` key of its config.json), `jaxpt`'s exports and `tools/fault_injection.py` all
read this table; adding a trainer is one `TRAINERS.add` here. Entries name their module and functions by path and
import nothing until used, so the table is cheap to read (`jaxpt --help`) and adds no import edge of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

from jaxpt.registry import Registry

__all__ = ["LM_KEYS", "MODEL_KINDS", "TRAINERS", "TRAINER_KEY", "Trainer", "legacy_trainer", "recorded_trainer",
           "trainer_list", "trainer_of"]

TRAINER_KEY = "trainer"  # the top-level key of a run's config.json that names its trainer
MODEL_KINDS = {"lm": "language-model", "reward": "reward-model", "vit": "image-classifier", "dit": "diffusion-model",
               "actor_critic": "policy-and-critic"}
LM_KEYS = {"actor_critic": "policy"}  # model kind -> the params key holding its language model beside other models


@dataclasses.dataclass(frozen=True)
class Trainer:
  """A trainer: `jaxpt <name>` and `jaxpt.train("<name>", ...)`, its run config `<module>.<config_class>` and its
  `<module>.build`.

  Attributes:
    name: the subcommand and the name a run records (config.json's "trainer").
    help: one line for `jaxpt --help`.
    module: the module holding the trainer ('jaxpt.trainers.rm'), imported on first use.
    config_class: its run config dataclass, in `config_module` (default: `module`).
    summary: the metrics of `jaxpt <name>`'s last line, in order ('eval_accuracy*': all keys with that prefix).
    build: `build(config, workdir) -> BuiltRun` (`jaxpt.engine.run`): the run `jaxpt.train` trains and
      `jaxpt eval` rebuilds from a recorded config.
    model: what its checkpoints hold (a key of MODEL_KINDS): 'lm' (TransformerLM), 'reward' (RewardModel), 'vit',
      'dit', 'actor_critic' (PPO: params {"policy": TransformerLM, "critic": RewardModel read per token}).
    starts_runs: whether its runs may be another run's `init_from` (a PPO run starts another from its policy).
    eval_set: the config field whose 0 means the run has no eval set ('' = it always has one).
    config_module: the module defining `config_class`, when not `module` ('' = `module`).
    lora: whether it trains LoRA adapters when `config.lora.rank > 0` (`jaxpt.nn.lora`); the others refuse them.
    eval_unread: (field, reset) pairs: a config field naming a directory that only training reads (GRPO's and
      PPO's `reward.model`, PPO's `ppo.critic_init`) and the field or section that `jaxpt eval` resets to its
      default when that directory is gone (the eval scores the policy with the verifier; `jaxpt.engine.evaluate`).
  """

  name: str
  help: str
  module: str
  config_class: str
  summary: tuple[str, ...]
  model: str
  build: str = "build"
  starts_runs: bool = True
  eval_set: str = ""
  config_module: str = ""
  lora: bool = False
  eval_unread: tuple[tuple[str, str], ...] = ()

  def _attribute(self, name: str) -> Any:
    return getattr(importlib.import_module(self.module), name)

  @property
  def config_type(self) -> type:
    return getattr(importlib.import_module(self.config_module or self.module), self.config_class)

  @property
  def build_function(self) -> Callable[[Any, str], Any]:
    return self._attribute(self.build)

  @property
  def model_kind(self) -> str:
    """'language-model', 'reward-model', ...: what its checkpoints hold, in words."""
    return MODEL_KINDS[self.model]

  @property
  def lm_key(self) -> str | None:
    """The key of its checkpoints' params under which its language model sits beside another model ('policy' for
    'actor_critic': `jaxpt.load`, `export-hf` and `init_from` read that, never the critic); None when the params
    are the model itself."""
    return LM_KEYS.get(self.model)

  def owns(self, config_type: type) -> bool:
    """Whether `config_type` is this trainer's run config class (exactly: SFTRunConfig extends PretrainRunConfig)."""
    return ((config_type.__module__, config_type.__qualname__) ==
            (self.config_module or self.module, self.config_class))


TRAINERS: Registry[Trainer] = Registry("trainer")
for _trainer in (
    Trainer("pretrain", "Pretrain a transformer LM (metrics.jsonl, TensorBoard, loss.png, checkpoints in workdir).",
            "jaxpt.trainers.pretrain", "PretrainRunConfig", ("loss", "eval_loss", "eval_ppl"), "lm",
            eval_set="data.eval_batches"),
    Trainer("sft", "Supervised fine-tuning on a math task (response-only loss; answer accuracy in the eval).",
            "jaxpt.trainers.sft", "SFTRunConfig", ("loss", "eval_loss", "eval_answer_accuracy", "eval_sample_accuracy"),
            "lm",
            eval_set="data.eval_batches", lora=True),
    Trainer("grpo", "GRPO / CLIPO post-training with KV-cache rollouts and verifiable rewards.",
            "jaxpt.trainers.grpo", "GRPORunConfig", ("reward_mean", "accuracy", "eval_accuracy*"), "lm",
            eval_set="data.eval_prompts", config_module="jaxpt.trainers.grpo_config", lora=True,
            eval_unread=(("reward.model", "reward"),)),
    Trainer("ppo", "PPO with a learned critic (from a reward-model run or the policy), GAE and KL-shaped rewards.",
            "jaxpt.trainers.ppo", "PPORunConfig", ("reward_mean", "accuracy", "value_loss", "eval_accuracy*"),
            "actor_critic", eval_set="data.eval_prompts", config_module="jaxpt.trainers.ppo_config", lora=True,
            eval_unread=(("reward.model", "reward"), ("ppo.critic_init", "ppo.critic_init"))),
    Trainer("rm", "Train a reward model (Bradley-Terry, DIR, ODIN) and write its evaluation report.",
            "jaxpt.trainers.rm", "RMRunConfig", ("loss", "accuracy", "eval_accuracy", "eval_pearson_score_length",
                                                 "eval_spearman_score_length"), "reward", starts_runs=False,
            lora=True),
    Trainer("vit", "Train a ViT image classifier (any residual scheme; top-1 on the test split in the eval).",
            "jaxpt.trainers.vit", "ViTRunConfig", ("loss", "eval_loss", "eval_top1", "eval_val_top1"), "vit"),
    Trainer("dit", "Train a class-conditional DiT (pre or siamese_post_pre; the diffusion loss in the eval).",
            "jaxpt.trainers.dit", "DiTRunConfig", ("loss", "eval_loss", "eval_val_loss", "eval_fid", "eval_val_fid"),
            "dit"),
    Trainer("dpo", "DPO (optionally + DIR) of a language model on preference pairs; implicit-reward eval report.",
            "jaxpt.trainers.dpo", "DPORunConfig", ("loss", "accuracy", "eval_accuracy", "eval_pearson_score_length",
                                                   "eval_pearson_margin_length"), "lm", lora=True),
    Trainer("kto", "KTO of a language model on unpaired desirable / undesirable examples; implicit-reward eval report.",
            "jaxpt.trainers.kto", "KTORunConfig", ("loss", "kl", "eval_accuracy", "eval_pearson_score_length"), "lm",
            lora=True),
):
  TRAINERS.add(_trainer.name, _trainer)


def trainer_of(config_type: type) -> Trainer | None:
  """The trainer whose run config class is `config_type`, or None for an unregistered one."""
  return next((t for t in map(TRAINERS.get, TRAINERS) if t.owns(config_type)), None)


def trainer_list(where: Callable[[Trainer], bool] = lambda trainer: True) -> str:
  """'pretrain, sft, grpo or dpo': the registered trainers for which `where` holds, for help text and errors."""
  found = [name for name in TRAINERS if where(TRAINERS.get(name))]
  return " or ".join(filter(None, [", ".join(found[:-1]), found[-1]])) if found else "none"


def recorded_trainer(recorded: Mapping[str, Any]) -> str:
  """The trainer that made the run whose config.json is `recorded`: its "trainer" key, or for a run recorded before
  runs named their trainer, `legacy_trainer`."""
  name = recorded.get(TRAINER_KEY)
  return name if isinstance(name, str) else legacy_trainer(recorded)


def legacy_trainer(recorded: Mapping[str, Any]) -> str:
  """The legacy rule, only for config.json files without a "trainer" key (runs made before it was written): the
  trainer guessed from the sections the config holds, in this order: `rm`, `vit`, `dit`, `dpo`, `grpo` name
  theirs; `task` and `decode` -> sft; anything else -> pretrain. No new trainer is added here: new runs record
  their trainer."""
  for section in ("rm", "vit", "dit", "dpo", "grpo"):
    if section in recorded:
      return section
  if "task" in recorded and "decode" in recorded:
    return "sft"
  return "pretrain"
