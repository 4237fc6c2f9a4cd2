"""The training engine: one sharded-training builder (`builder.build_training`), one step (`step.make_train_step`),
one loop (`loop.train_loop`), one loop path over them for every trainer (`run.run_built` of a `run.BuiltRun`), and
the table of trainers (`trainers.TRAINERS`), whose modules live in `jaxpt.trainers`.

The names below load on first use, so `import jaxpt.engine.trainers` (the CLI's help) imports no jax.
"""

_EXPORTS = {
    "jaxpt.engine.checkpoint": ("Checkpointer",),
    "jaxpt.engine.config": ("RunConfig",),
    "jaxpt.engine.loop": ("LoopConfig", "LoopResult", "train_loop"),
    "jaxpt.engine.optim": ("OptimConfig", "decay_mask", "make_optimizer", "make_schedule"),
    "jaxpt.engine.run": ("BuiltRun", "Hooks", "run_built"),
    "jaxpt.engine.sharded": ("ShardedTraining", "shard_training", "sharded_init", "train_state_sharding"),
    "jaxpt.engine.state": ("TrainState",),
    "jaxpt.engine.step": ("accumulate", "accumulate_gradients", "grad_fn_of", "make_train_step"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
  if name in _MODULE_OF:
    import importlib

    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'jaxpt.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_MODULE_OF))
