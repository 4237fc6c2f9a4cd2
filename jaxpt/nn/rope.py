"""Rotary position embeddings (RoPE), rotate-half convention (GPT-NeoX / Llama / Qwen2).

For a head vector split into halves (a, b) and angle theta_i = pos * base^(-2i/D):
    rope(a, b) = (a cos - b sin, b cos + a sin)
"""

from __future__ import annotations

import jax.numpy as jnp


def apply_rope(x, positions, base: float):
  """x: [batch, seq, heads, head_dim]; positions: [batch, seq] int -> same shape and dtype as x."""
  head_dim = x.shape[-1]
  half = head_dim // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch, seq, half]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  a, b = x32[..., :half], x32[..., half:]
  return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)
