"""Optimizer: AdamW with linear warmup + cosine decay, global-norm clipping, no decay on 1-D params."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxpt.config import Section, at_least, in_range


@dataclasses.dataclass(frozen=True)
class OptimConfig(Section):
  """The `optim` section: AdamW at a learning rate warmed up linearly, then cosine-decayed.

  Attributes:
    learning_rate: peak learning rate, reached after warmup_steps.
    warmup_steps: steps of the linear warmup from 0.
    end_lr_fraction: the cosine decay ends at learning_rate * end_lr_fraction.
    b1: AdamW's first-moment decay.
    b2: AdamW's second-moment decay.
    eps: AdamW's epsilon.
    weight_decay: AdamW's decoupled weight decay (not on 1-D params: norms, biases).
    grad_clip: global-norm gradient clipping threshold (0 = off).
    grad_accum_steps: micro-batches each step's batch is split into, gradients accumulated over them.
  """

  learning_rate: float = 3e-3
  warmup_steps: int = 50
  end_lr_fraction: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  grad_clip: float = 1.0
  grad_accum_steps: int = 1

  def check(self) -> None:
    in_range(self, "learning_rate", 0.0, low_open=True)
    at_least(self, "warmup_steps", 0)
    in_range(self, "end_lr_fraction", 0.0, 1.0)
    in_range(self, "b1", 0.0, 1.0, high_open=True)
    in_range(self, "b2", 0.0, 1.0, high_open=True)
    in_range(self, "eps", 0.0, low_open=True)
    in_range(self, "weight_decay", 0.0)
    in_range(self, "grad_clip", 0.0)
    at_least(self, "grad_accum_steps", 1)


def make_schedule(optim_config: OptimConfig, total_steps: int) -> optax.Schedule:
  """lr(t): 0 -> peak linearly over `warmup_steps`, then cosine to `peak * end_lr_fraction` at `total_steps`."""
  peak = optim_config.learning_rate
  warmup = optim_config.warmup_steps
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=peak,
      warmup_steps=warmup,
      decay_steps=max(int(total_steps), warmup + 1),
      end_value=peak * optim_config.end_lr_fraction,
  )


def decay_mask(params: Any, scan_axis: str = "layers") -> Any:
  """True where a param gets weight decay: matrices and embeddings; False for norms, biases, scalars.

  A param decays iff it has >= 2 dims besides the scanned-layer axis and its name is neither a bias's (`bias` or
  `bias_*`: a q/k/v bias is [heads, head_dim], mHC's `bias_res` [n, n]) nor a scale's (`scale` or `*_scale`: mHC's
  per-stream norm scale `stream_norm_scale` is [n, d_model]). Boxed params (`nn.Partitioned`, as `model.init`
  returns them) say which axis is `scan_axis` by logical name, so a scanned norm scale [layers, d] is not decayed;
  plain arrays count all dims. Returns a pytree of bools shaped like unboxed params.
  """

  def leaf_mask(path, p):
    leaf = str(getattr(path[-1], "key", "")) if path else ""
    if leaf == "bias" or leaf.startswith("bias_") or leaf == "scale" or leaf.endswith("_scale"):
      return False
    if isinstance(p, nn.Partitioned):
      return sum(name != scan_axis for name in p.names) >= 2
    return jnp.ndim(p) >= 2

  return jax.tree_util.tree_map_with_path(leaf_mask, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """g <- g min(1, max_norm / ||g||), ||g|| the global norm over every leaf: `optax.clip_by_global_norm` (same
  state, so checkpoints load either way) as one scalar factor per step. Optax divides each element by ||g|| and
  XLA writes that clipped copy of every gradient out before AdamW's two moment updates read it; a multiply by a
  scalar it fuses into each of them instead (d512 / 8 layers on CPU: the optimizer's traffic 2.35 -> 1.78 GB a step,
  `python -m tools.step_bytes`; the step's peak memory holds no clipped copy beside the gradient, `jaxpt plan`).
  Below the threshold the factor is exactly 1; above it, rounding aside, the same clip."""

  def update_fn(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    factor = jnp.where(norm < max_norm, 1.0, max_norm / norm)
    return jax.tree.map(lambda g: g * factor.astype(g.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def make_optimizer(optim_config: OptimConfig, total_steps: int,
                   mask: Any = None) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns (optimizer, schedule). `mask`: weight-decay mask pytree (or callable); default `decay_mask`.

  `optim.grad_clip <= 0` disables clipping.
  """
  schedule = make_schedule(optim_config, total_steps)
  parts = []
  if optim_config.grad_clip > 0:
    parts.append(clip_by_global_norm(optim_config.grad_clip))
  parts.append(optax.adamw(
      learning_rate=schedule,
      b1=optim_config.b1,
      b2=optim_config.b2,
      eps=optim_config.eps,
      weight_decay=optim_config.weight_decay,
      mask=decay_mask if mask is None else mask,
  ))
  return optax.chain(*parts), schedule


class PartitionedOptimizer(NamedTuple):
  """An optax-style optimizer (`init`, `update`) that is one optimizer per top-level subtree of the params:
  `parts[name]` updates params[name] with a state of its own (state = {name: state}); `jaxpt.parallel.sharding`
  shards each part's moments like its params."""

  init: Any
  update: Any
  parts: dict


def partitioned(parts: dict[str, optax.GradientTransformation], frozen: tuple[str, ...] = ()) -> PartitionedOptimizer:
  """The optimizer of params {name: subtree} that updates params[name] with `parts[name]` (its own state, learning
  rate, clipping: PPO's policy and critic). A `frozen` part neither moves nor changes its state (update 0), so two
  optimizers differing only in `frozen` share one state layout (PPO's critic-only value warm-up)."""

  def init(params):
    return {name: part.init(params[name]) for name, part in parts.items()}

  def update(updates, state, params=None):
    new_updates, new_state = {}, {}
    for name, part in parts.items():
      if name in frozen:
        new_updates[name], new_state[name] = jax.tree.map(jnp.zeros_like, updates[name]), state[name]
      else:
        new_updates[name], new_state[name] = part.update(updates[name], state[name],
                                                         None if params is None else params[name])
    return new_updates, new_state

  return PartitionedOptimizer(init, update, dict(parts))
