"""jaxpt: SiameseNorm transformers, DIR reward models and GRPO/CLIPO post-training in JAX/Flax.

    import jaxpt
    jaxpt.ModelConfig, jaxpt.TransformerLM, jaxpt.RewardModel         models
    jaxpt.get_loss("policy", "ppo_clip"), jaxpt.known_losses("lm")    losses, registered by kind
    jaxpt.train("rm", config, workdir) -> LoopResult                 any trainer of jaxpt.engine.trainers.TRAINERS
    jaxpt.build("rm", config, workdir) -> BuiltRun                    (pretrain, sft, rm, dpo, kto, grpo, ppo, vit, dit)
    jaxpt.PretrainRunConfig, ..., jaxpt.from_section, jaxpt.config_dict  run configs (their `config_class`)
    jaxpt.load(workdir or "hf:DIR") -> Model: logits, generate, score, save_hf (jaxpt.api)

Every name is imported on first use, so `import jaxpt` is cheap and has no side effects.
"""

from jaxpt.engine.trainers import TRAINERS as _TRAINERS  # a table of names: imports no jax

__version__ = "0.1.0"

_EXPORTS = {
    "jaxpt.config": ("ConfigError", "config_dict", "from_section", "load_config_file"),
    "jaxpt.models.config": ("ModelConfig",),
    "jaxpt.models.transformer": ("TransformerLM",),
    "jaxpt.models.reward": ("RewardModel",),
    "jaxpt.losses": ("LOSS_KINDS", "get_loss", "known_losses", "register_loss"),
    "jaxpt.engine.run": ("build", "train"),
    **{t.config_module or t.module: (t.config_class,) for t in map(_TRAINERS.get, _TRAINERS)},
    "jaxpt.api": ("load", "Model"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_MODULE_OF]


def __getattr__(name: str):
  if name in _MODULE_OF:
    import importlib

    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'jaxpt' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_MODULE_OF))
