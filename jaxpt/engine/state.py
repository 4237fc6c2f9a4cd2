"""Train state: one pytree holding everything a resume needs."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """step: int32 scalar, number of completed loop steps; params; opt_state; rng: base PRNG key (uint32[2]);
  aux: any other pytree a trainer carries across steps and checkpoints (the DIR estimator and its optimizer state,
  the CLIPO head and its optimizer state); None when unused.

  Randomness for step t is `fold_in(rng, t)`, so a resumed run draws exactly what an uninterrupted one would.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  aux: Any = None

  @classmethod
  def create(cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array,
             aux: Any = None) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params), rng=rng, aux=aux)

  def step_rng(self) -> jax.Array:
    return jax.random.fold_in(self.rng, self.step)
