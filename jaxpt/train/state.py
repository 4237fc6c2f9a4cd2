"""Train state: one pytree holding everything a resume needs."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """step: int32 scalar, number of completed optimizer steps; params; opt_state; rng: base PRNG key (uint32[2]).

  Randomness for step t is `fold_in(rng, t)`, so a resumed run draws exactly what an uninterrupted one would.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array

  @classmethod
  def create(cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params), rng=rng)

  def step_rng(self) -> jax.Array:
    return jax.random.fold_in(self.rng, self.step)
