"""Train state: one pytree holding everything a resume needs, and the trainable part of a params tree.

With a `trainable` mask (a tree of bools shaped like the params; LoRA: the adapters and any head new to the run)
the optimizer sees only `trainable_part(params, trainable)`: its state holds moments for those leaves alone, and the
step applies updates to them alone (`jaxpt.engine.step`); the rest of the params is carried unchanged.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


def trainable_part(tree: Any, trainable: Any) -> Any:
  """The leaves of nested-dict `tree` where `trainable` (a tree of bools of the same structure) is True, as a
  nested dict without the other leaves (and without subtrees left empty); `tree` itself when `trainable` is None."""
  if trainable is None:
    return tree
  if isinstance(trainable, dict):
    parts = {key: trainable_part(tree[key], mask) for key, mask in trainable.items()}
    return {key: part for key, part in parts.items() if not (isinstance(part, dict) and not part)}
  return tree if trainable else {}


def with_part(tree: Any, part: Any) -> Any:
  """`tree` with the leaves of `part` (a `trainable_part` of it) put in their places."""
  if not isinstance(part, dict):
    return part
  return {**tree, **{key: with_part(tree[key], value) for key, value in part.items()}}


@flax.struct.dataclass
class TrainState:
  """step: int32 scalar, number of completed loop steps; params; opt_state; rng: base PRNG key (uint32[2]);
  aux: any other pytree a trainer carries across steps and checkpoints (the DIR estimator and its optimizer state,
  the CLIPO head and its optimizer state); None when unused.

  Randomness for step t is `fold_in(rng, t)`, so a resumed run draws exactly what an uninterrupted one would.
  With `trainable` (module docstring) opt_state is the optimizer's state of the trainable part alone.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  aux: Any = None

  @classmethod
  def create(cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array, aux: Any = None,
             trainable: Any = None) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params,
               opt_state=optimizer.init(trainable_part(params, trainable)), rng=rng, aux=aux)

  def step_rng(self) -> jax.Array:
    return jax.random.fold_in(self.rng, self.step)
