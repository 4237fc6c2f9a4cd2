"""Train functions on a device mesh: the state is created sharded, the step is compiled with explicit shardings.

    init_state()              -> TrainState, each leaf laid out by `state_sharding` (never whole on one device)
    train_step(state, batch)  -> (state, metrics); batch leaves are global `[B, ...]` arrays split over data x fsdp

The step is compiled ahead of time (`jit(...).lower(...).compile()`), so its per-device memory is known before the
first step and nothing is compiled twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from jaxpt.parallel.memory import compiled_memory
from jaxpt.parallel.rules import Rules
from jaxpt.parallel.sharding import (batch_sharding, param_shardings, replicated, state_shardings,
                                     with_activation_sharding)
from jaxpt.engine.state import TrainState, trainable_part


@dataclasses.dataclass
class ShardedTraining:
  mesh: Mesh
  rules: Rules
  state_sharding: Any  # a TrainState of NamedShardings
  batch_sharding: NamedSharding
  init_state: Callable[[], TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]  # compiled
  memory: dict  # compiled_memory of train_step, per device (MiB)


def _with_sharding(abstract: Any, sharding: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sharding)


def train_state_sharding(init_fn: Callable[[], TrainState], boxed_params: Any,
                         optimizer: optax.GradientTransformation, mesh: Mesh, rules: Rules,
                         trainable: Any = None) -> tuple[Any, Any]:
  """(abstract TrainState, TrainState of NamedShardings) of `init_fn()`, without running it; `trainable`: the
  mask of the params the optimizer sees (`jaxpt.engine.state.trainable_part`; None: all)."""
  abstract_state = jax.eval_shape(init_fn)
  params = param_shardings(boxed_params, mesh, rules)
  return abstract_state, state_shardings(abstract_state, params, optimizer, mesh, trainable_part(params, trainable))


def sharded_init(init_fn: Callable[[], TrainState], sharding: Any, mesh: Mesh,
                 rules: Rules) -> Callable[[], TrainState]:
  """`init_fn` jitted to produce each leaf directly in its shard (e.g. a restore template on a new mesh)."""
  return jax.jit(with_activation_sharding(init_fn, mesh, rules), out_shardings=sharding)


def shard_training(init_fn: Callable[[], TrainState], step_fn: Callable, boxed_params: Any,
                   optimizer: optax.GradientTransformation, mesh: Mesh, rules: Rules,
                   batch_shapes: dict[str, jax.ShapeDtypeStruct], donate: bool = False,
                   trainable: Any = None) -> ShardedTraining:
  """Jits `init_fn` with out_shardings and compiles `step_fn` with in/out shardings on `mesh` under `rules`.

  init_fn() -> TrainState with unboxed params; boxed_params: `jax.eval_shape(model.init, ...)["params"]` (its
  logical names give the parameter shardings; optimizer moments follow their parameters, the rest is replicated).
  batch_shapes: global shapes `[B, ...]` of the batch leaves. Both functions trace with the activation rules on.
  trainable: the mask of the params the optimizer sees (None: all).
  """
  abstract_state, sharding = train_state_sharding(init_fn, boxed_params, optimizer, mesh, rules, trainable)
  init_state = sharded_init(init_fn, sharding, mesh, rules)
  batch_sh = batch_sharding(mesh, rules)
  compiled = compile_step(step_fn, abstract_state, sharding, batch_sh, mesh, rules, batch_shapes, donate)
  return ShardedTraining(mesh=mesh, rules=rules, state_sharding=sharding, batch_sharding=batch_sh,
                         init_state=init_state, train_step=compiled, memory=compiled_memory(compiled))


def compile_step(step_fn: Callable, abstract_state: Any, sharding: Any, batch_sh: NamedSharding, mesh: Mesh,
                 rules: Rules, batch_shapes: dict[str, jax.ShapeDtypeStruct], donate: bool = False) -> Callable:
  """`step_fn(state, batch) -> (state, metrics)` compiled for the state's `sharding` and batches of `batch_shapes`
  split by `batch_sh`, traced under the activation rules (a run's train step, or another step on the same state)."""
  batch_tree = {key: batch_sh for key in batch_shapes}
  step = jax.jit(with_activation_sharding(step_fn, mesh, rules), in_shardings=(sharding, batch_tree),
                 out_shardings=(sharding, replicated(mesh)), donate_argnums=(0,) if donate else ())
  return step.lower(_with_sharding(abstract_state, sharding), _with_sharding(batch_shapes, batch_tree)).compile()
