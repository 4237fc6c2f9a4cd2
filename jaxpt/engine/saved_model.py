"""A jaxpt run's saved model, read back: its recorded config, the params of a checkpoint (optionally sharded on a
mesh), its tokenizer and how it formatted prompts. `jaxpt.load` (jaxpt.api) wraps this in a `Model`; trainers that
read another run's model (GRPO's reward model, `reward.model`) use it directly, below the api layer.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxpt.config import ConfigError, from_section
from jaxpt.data.tokenizer import has_tokenizer, load_tokenizer
from jaxpt.models import hf, hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.lora import LoRAConfig
from jaxpt.parallel.rules import get_rules
from jaxpt.parallel.sharding import param_shardings
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.record import CONFIG_FILE, checkpoint_steps, recorded_config
from jaxpt.engine.trainers import TRAINERS, recorded_trainer, trainer_list

LOADABLE = ("lm", "reward")  # the kinds a saved model can be (a PPO run's checkpoints load as their policy, 'lm')


@dataclasses.dataclass(eq=False)
class SavedModel:
  """A run's model at one checkpoint: `TransformerLM` params (kind 'lm'; of a PPO run, its policy: the critic is not
  read) or `RewardModel` params (kind 'reward', `num_scores` heads: 2 for ODIN, quality then length); a LoRA run's
  adapters merged into its kernels, and kept apart too (`adapters`)."""

  config: ModelConfig
  params: Any
  tokenizer: Any  # None when the run has no tokenizer files
  kind: str
  num_scores: int
  tokenizer_dir: str | None
  prompt_format: str  # 'plain' | 'chat': how the run formatted its prompts
  step: int
  lora: LoRAConfig | None = None  # a LoRA run's lora section (None: no adapters)
  adapters: Any = None  # a LoRA run's adapters as they trained (`lora.adapter_params` of its params), not merged
  base_model: str | None = None  # the HF checkpoint directory a run started from (`init_from='hf:DIR'`), if any


def maybe_tokenizer(directory: str | None):
  """The tokenizer in `directory`, or None when it holds no tokenizer files (a broken one raises its DataError)."""
  if directory is None or not has_tokenizer(directory):
    return None
  return load_tokenizer(directory)


def run_tokenizer_dir(workdir: str, recorded: dict) -> str | None:
  """The directory holding a run's tokenizer: `workdir/tokenizer` (where every trainer keeps its own, or a copy of
  its `init_from`'s), else, for runs of older jaxpt versions, that of the run it started from."""
  own = os.path.join(workdir, "tokenizer")
  if has_tokenizer(own):
    return own
  init_from = recorded.get("init_from") or ""
  if init_from.startswith(hf.HF_PREFIX):
    return os.path.expanduser(init_from[len(hf.HF_PREFIX):])
  if init_from and os.path.isdir(os.path.expanduser(init_from)):
    parent = os.path.expanduser(init_from)
    return run_tokenizer_dir(parent, recorded_config(parent))
  return None


def _loads(trainer: Any) -> bool:
  return trainer.model in LOADABLE or trainer.lm_key is not None


def loadable_model(workdir: str, trainer: str, field: str = "path") -> str:
  """'lm' or 'reward': what a run of `trainer` loads as ('lm' for a PPO run: its policy, `Trainer.lm_key`);
  ConfigError naming `field` otherwise."""
  if trainer not in TRAINERS:
    raise ConfigError(field, f"is the workdir of a run of trainer {trainer!r}, which this jaxpt does not have "
                      f"(known: {', '.join(TRAINERS)})", workdir)
  entry = TRAINERS.get(trainer)
  if not _loads(entry):
    raise ConfigError(field, f"is the workdir of a jaxpt {trainer} run ({entry.model_kind}); "
                      f"jaxpt.load takes the run of jaxpt {trainer_list(_loads)}", workdir)
  return "lm" if entry.lm_key is not None else entry.model


def run_model_config(recorded: dict, overrides: dict) -> ModelConfig:
  """The run's recorded `model` section with `overrides` (runtime fields only: ConfigError naming the field for
  one that contradicts the checkpoint's architecture)."""
  for name, value in overrides.items():
    fixed = name not in hf_config.RUNTIME_FIELDS or name == "scan_layers"  # scan_layers shapes a checkpoint's tree
    if fixed and recorded["model"].get(name, value) != value:
      raise ConfigError(f"model.{name}", f"contradicts the run's config.json, which gives "
                        f"{recorded['model'][name]!r}", value)
  return from_section(ModelConfig, {**recorded["model"], **overrides}, "model")


def recorded_lora(recorded: dict) -> LoRAConfig:
  """The `lora` section a run's config.json records (rank 0, off, for runs recorded before it existed)."""
  return from_section(LoRAConfig, recorded.get("lora"), "lora")


def num_scores_of(recorded: dict) -> int:
  """The score heads of a reward-model run (its config.json `recorded` has an `rm` section): 2 for ODIN (quality,
  length), else 1."""
  return 2 if recorded["rm"].get("loss") == "odin" else 1


def load_run(workdir: str, step: int | None = None, mesh: Mesh | None = None, rules: str = "fsdp_tp",
             overrides: dict | None = None) -> SavedModel:
  """The run in `workdir` at its latest checkpoint (or `step`), params in the logical-axis rules' sharding on
  `mesh` (first device without one). FileNotFoundError without such a checkpoint, ValueError for one that does
  not fit the run's config.json, ConfigError (field 'path') for a run whose checkpoints hold no loadable model. A
  PPO run loads as its policy (params['policy'], kind 'lm'): its critic is not read."""
  recorded = recorded_config(workdir)
  trainer = recorded_trainer(recorded)
  model_kind = loadable_model(workdir, trainer)
  key = TRAINERS.get(trainer).lm_key
  config = run_model_config(recorded, overrides or {})
  lora = recorded_lora(recorded)
  if model_kind == "reward":
    num_scores = num_scores_of(recorded)
    module = RewardModel(config, num_scores=num_scores, lora=lora.spec())
    init_args = (jnp.zeros((1, 1), jnp.int32), jnp.zeros((1,), jnp.int32))
  else:
    num_scores, module = 1, TransformerLM(config, lora=lora.spec())
    init_args = (jnp.zeros((1, 1), jnp.int32),)
  boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *init_args))["params"]
  template = nn.meta.unbox(boxed)
  if mesh is not None:
    shardings = param_shardings(boxed, mesh, get_rules(rules))
    template = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), template,
                            shardings)
  steps = checkpoint_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"{workdir}: no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  if step is not None and step not in steps:
    raise FileNotFoundError(f"{workdir}: no checkpoint at step {step} (checkpoints at steps "
                            f"{', '.join(map(str, steps))})")
  step = steps[-1] if step is None else step
  checkpointer = Checkpointer(workdir, async_save=False, create=False)
  try:
    misfit = checkpointer.params_misfit(template, step, key)
    if misfit is not None:  # e.g. a config.json edited by hand: restoring would give arrays of the wrong shapes
      raise ValueError(f"{workdir}: the checkpoint at step {step} does not fit the run's {CONFIG_FILE}: {misfit}")
    params = checkpointer.restore_params(template, step, key)
  finally:
    checkpointer.close()
  adapters = None
  if lora.enabled:  # a LoRA run: its adapters merged into the kernels (the model without LoRA reads them)
    adapters = lora_lib.adapter_params(params)
    params = lora_lib.merge_params(params, lora.scale, lora.quant, jnp.dtype(config.param_dtype))
  directory = run_tokenizer_dir(workdir, recorded)
  prompt_format = (recorded.get("task") or recorded.get("data") or {}).get("prompt_format", "plain")
  init_from = recorded.get("init_from") or ""
  base_model = os.path.expanduser(init_from[len(hf.HF_PREFIX):]) if init_from.startswith(hf.HF_PREFIX) else None
  return SavedModel(config, params, maybe_tokenizer(directory), kind=model_kind, num_scores=num_scores,
                    tokenizer_dir=directory, prompt_format=prompt_format, step=step,
                    lora=lora if lora.enabled else None, adapters=adapters, base_model=base_model)


def load_reward_run(path: str, mesh: Mesh | None, rules: str, field: str = "reward.model",
                    fits: Any = None) -> SavedModel:
  """The reward model of the `jaxpt rm` run in `path` (its latest checkpoint), or of `hf:DIR` (a reward model
  exported by `jaxpt export-hf`, or a transformers sequence classifier), params sharded on `mesh` by `rules`;
  `fits(model_config, tokenizer)` checks it before the params are read. Every refusal is one ConfigError naming
  `field`: no such directory, not a jaxpt run, a run whose checkpoints hold no reward model (an LM run), no
  checkpoint, one that cannot be restored (e.g. truncated), an `hf:` directory of a language model."""
  if path.startswith(hf.HF_PREFIX):
    return _load_hf_reward(os.path.expanduser(path[len(hf.HF_PREFIX):]), mesh, rules, field, fits, path)
  workdir = os.path.expanduser(path)
  if not os.path.isdir(workdir):
    raise ConfigError(field, "no such directory (a jaxpt rm run's workdir)", path)
  try:
    recorded = recorded_config(workdir)
  except ValueError as e:  # NoRunRecord
    raise ConfigError(field, f"is not a jaxpt run: {e}", path) from None
  trainer = recorded_trainer(recorded)
  if loadable_model(workdir, trainer, field) != "reward":
    raise ConfigError(field, f"is the workdir of a jaxpt {trainer} run (a language model), not of a reward-model "
                      f"run (jaxpt {trainer_list(lambda t: t.model == 'reward')})", path)
  if not checkpoint_steps(workdir):
    raise ConfigError(field, f"has no checkpoint in {os.path.join(workdir, 'checkpoints')}", path)
  if fits is not None:
    fits(run_model_config(recorded, {}), maybe_tokenizer(run_tokenizer_dir(workdir, recorded)))
  try:
    return load_run(workdir, mesh=mesh, rules=rules)
  except (OSError, ValueError, KeyError, RuntimeError) as e:  # orbax's errors for a damaged checkpoint vary
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ConfigError(field, f"its checkpoint cannot be restored ({type(e).__name__}: {reason})", path) from None


def _load_hf_reward(directory: str, mesh: Mesh | None, rules: str, field: str, fits: Any, path: str) -> SavedModel:
  """`load_reward_run` of an HF-format reward-model directory (step 0: it has no training steps)."""
  if not os.path.isfile(os.path.join(directory, hf_config.CONFIG_FILE)):
    raise ConfigError(field, f"{directory}: no {hf_config.CONFIG_FILE} (an hf: reward model is a directory "
                      "written by `jaxpt export-hf` of a jaxpt rm run, or a transformers sequence classifier)", path)
  if not hf_config.is_reward_model(hf_config.read_hf_json(directory)):
    raise ConfigError(field, f"{directory}: its {hf_config.CONFIG_FILE} is a language model's, not a reward "
                      "model's (no score head)", path)
  config = hf_config.read_config(directory, reward=True)
  tokenizer = maybe_tokenizer(directory)
  if fits is not None:
    fits(config, tokenizer)
  config, params, record = hf.load_reward(directory, mesh=mesh, rules=rules)
  return SavedModel(config, params, tokenizer, kind="reward", num_scores=record["num_scores"],
                    tokenizer_dir=directory, prompt_format=record["prompt_format"], step=0)
