"""Training: one sharded-training builder (`builder.build_training`), one step (`step.make_train_step`), one loop
(`loop.train_loop`), and the trainers composed from them, listed in one table (`trainers.TRAINERS`).

The trainers are imported on their own (`from jaxpt.train.pretrain import pretrain`): they pull in the model and
data layers. The names below load on first use, so `import jaxpt.train.trainers` (the CLI's help) imports no jax.
"""

_EXPORTS = {
    "jaxpt.train.checkpoint": ("Checkpointer",),
    "jaxpt.train.config": ("RunConfig",),
    "jaxpt.train.loop": ("LoopConfig", "LoopResult", "train_loop"),
    "jaxpt.train.optim": ("OptimConfig", "decay_mask", "make_optimizer", "make_schedule"),
    "jaxpt.train.sharded": ("ShardedTraining", "shard_training", "sharded_init", "train_state_sharding"),
    "jaxpt.train.state": ("TrainState",),
    "jaxpt.train.step": ("accumulate", "accumulate_gradients", "grad_fn_of", "make_train_step"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
  if name in _MODULE_OF:
    import importlib

    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'jaxpt.train' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_MODULE_OF))
