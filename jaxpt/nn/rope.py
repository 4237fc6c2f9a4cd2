"""Rotary position embeddings (RoPE), rotate-half convention (GPT-NeoX / Llama / Qwen2).

For a head vector split into halves (a, b) and angle theta_i = pos * f_i, f_i = base^(-2i/D), i < D/2:
    rope(a, b) = (a cos - b sin, b cos + a sin)
i.e. dimension i is paired with i + D/2, as Hugging Face's `rotate_half` pairs them (not interleaved 2i, 2i+1).

Llama-3 frequency scaling (`Llama3Scaling`; lambda_i = 2 pi / f_i the wavelength, L = original_max_len):
    f_i' = f_i                                   lambda_i < L / high_freq_factor
         = f_i / factor                          lambda_i > L / low_freq_factor
         = (1 - s) f_i / factor + s f_i          otherwise, s = (L / lambda_i - low_freq_factor)
                                                                / (high_freq_factor - low_freq_factor)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp


class Llama3Scaling(NamedTuple):
  """Llama-3 RoPE scaling parameters (Hugging Face `rope_scaling = {"rope_type": "llama3", ...}`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_len: int


def rope_frequencies(head_dim: int, base: float, scaling: Llama3Scaling | None = None):
  """-> float32 [head_dim // 2]: f_i = base^(-2i/D), Llama-3-scaled when `scaling` is given (module doc)."""
  inv_freq = base ** (-jnp.arange(head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim)
  if scaling is None:
    return inv_freq
  factor, low, high, length = scaling
  wavelength = 2 * math.pi / inv_freq
  smooth = (length / wavelength - low) / (high - low)
  blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  return jnp.where(wavelength < length / high, inv_freq,
                   jnp.where(wavelength > length / low, inv_freq / factor, blended))


def apply_rope(x, positions, base: float, scaling: Llama3Scaling | None = None):
  """x: [batch, seq, heads, head_dim]; positions: [batch, seq] int -> same shape and dtype as x."""
  head_dim = x.shape[-1]
  half = head_dim // 2
  inv_freq = rope_frequencies(head_dim, base, scaling)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch, seq, half]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  a, b = x32[..., :half], x32[..., half:]
  return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)
