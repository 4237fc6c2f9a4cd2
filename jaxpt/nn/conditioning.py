"""DiT's conditioning primitives (Peebles & Xie 2023; no ModelConfig here): timestep and class embeddings, the
parameter-free LayerNorm and the adaLN(-Zero) modulation.

    timestep_frequencies(t, F):  [batch] -> [batch, F] = [cos(t f_k), sin(t f_k)], f_k = 10000^(-k / (F/2)),
                                 k < F/2 (GLIDE's / DiT's order: all cosines first)
    TimestepEmbedding:           c_t = W_2 silu(W_1 freq(t) + b_1) + b_2                      [batch, d]
    LabelEmbedding:              c_y = E[y], E [num_classes + 1, d] (init normal(0.02)); row num_classes is the
                                 "null" class of classifier-free guidance (a dropped label)
    layer_norm(h, eps):          (h - mean(h)) / sqrt(var(h) + eps), no scale or bias (DiT's LN)
    AdaLNModulation(n):          (m_1, ..., m_n) = split(W silu(c) + b), each [batch, d]; W and b start at 0
                                 (adaLN-Zero: every shift, scale and gate is 0 at init)
    modulate(h, shift, scale):   h (1 + scale) + shift, shift / scale [batch, d] broadcast over the tokens
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxpt.nn.dense import Dense
from jaxpt.nn.norms import standardize

MAX_PERIOD = 10000.0


def timestep_frequencies(timesteps, features: int, max_period: float = MAX_PERIOD):
  """float [batch] (integer or fractional timesteps) -> float32 [batch, features] (see the module doc; an odd
  `features` gets a last column of zeros)."""
  half = features // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.asarray(timesteps, jnp.float32)[:, None] * freqs[None]
  table = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
  return jnp.pad(table, [(0, 0), (0, features % 2)])


class TimestepEmbedding(nn.Module):
  """timesteps [batch] -> [batch, features]: a two-layer SiLU MLP (with biases) on `timestep_frequencies`."""

  features: int
  frequency_features: int = 256
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, timesteps):
    def dense(axes, name):
      return Dense((self.features,), axes, dtype=self.dtype, param_dtype=self.param_dtype, use_bias=True, name=name)

    hidden = dense(("frequencies", "embed"), "wi")(timestep_frequencies(timesteps, self.frequency_features))
    return dense(("mlp", "embed"), "wo")(nn.silu(hidden))


class LabelEmbedding(nn.Module):
  """int labels [batch] in [0, num_classes] (num_classes = the null class) -> [batch, features]."""

  num_classes: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, labels):
    table = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("classes", "embed")),
                       (self.num_classes + 1, self.features), self.param_dtype)
    return jnp.take(table, labels, axis=0).astype(self.dtype)


def layer_norm(h, eps: float):
  """LayerNorm over the last axis without scale or bias, computed in float32, returned in h's dtype."""
  return standardize(h, eps).astype(h.dtype)


def modulate(h, shift, scale):
  """h [batch, tokens, d] -> h (1 + scale) + shift, shift / scale [batch, d]."""
  return h * (1.0 + scale[:, None]) + shift[:, None]


class AdaLNModulation(nn.Module):
  """c [batch, d_c] -> a tuple of `count` arrays [batch, features]: split(W silu(c) + b), W [d_c, count, features]
  and b zero-initialised (adaLN-Zero)."""

  count: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, condition):
    out = Dense((self.count, self.features), ("embed", "modulations", "conditioned"), dtype=self.dtype,
                param_dtype=self.param_dtype, use_bias=True, zero_init=True, name="proj")(nn.silu(condition))
    return tuple(out[:, i] for i in range(self.count))
