"""Optimizer: AdamW with linear warmup + cosine decay, global-norm clipping, no decay on 1-D params."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


def make_schedule(optim_config: Any, total_steps: int) -> optax.Schedule:
  """lr(t): 0 -> peak linearly over `warmup_steps`, then cosine to `peak * end_lr_fraction` at `total_steps`."""
  peak = float(optim_config.learning_rate)
  warmup = int(optim_config.warmup_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=peak,
      warmup_steps=warmup,
      decay_steps=max(int(total_steps), warmup + 1),
      end_value=peak * float(optim_config.end_lr_fraction),
  )


def decay_mask(params: Any, scan_axis: str = "layers") -> Any:
  """True where a param gets weight decay: matrices and embeddings; False for norms, biases, scalars.

  A param decays iff it has >= 2 dims besides the scanned-layer axis. Boxed params (`nn.Partitioned`, as
  `model.init` returns them) say which axis is `scan_axis` by logical name, so a scanned norm scale
  [layers, d] is not decayed; plain arrays count all dims. Returns a pytree of bools shaped like unboxed params.
  """

  def leaf_mask(p):
    if isinstance(p, nn.Partitioned):
      return sum(name != scan_axis for name in p.names) >= 2
    return jnp.ndim(p) >= 2

  return jax.tree.map(leaf_mask, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def make_optimizer(optim_config: Any, total_steps: int,
                   mask: Any = None) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns (optimizer, schedule). `mask`: weight-decay mask pytree (or callable); default `decay_mask`.

  `optim.grad_clip <= 0` disables clipping.
  """
  schedule = make_schedule(optim_config, total_steps)
  parts = []
  if float(optim_config.grad_clip) > 0:
    parts.append(optax.clip_by_global_norm(float(optim_config.grad_clip)))
  parts.append(optax.adamw(
      learning_rate=schedule,
      b1=float(optim_config.b1),
      b2=float(optim_config.b2),
      eps=float(optim_config.eps),
      weight_decay=float(optim_config.weight_decay),
      mask=decay_mask if mask is None else mask,
  ))
  return optax.chain(*parts), schedule
