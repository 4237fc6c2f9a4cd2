"""Multi-head causal self-attention with grouped KV heads, RoPE and optional per-head Q/K/V RMSNorm.

    q, k, v = x W_q, x W_k, x W_v                 q: [B, S, H, D]   k, v: [B, S, H_kv, D]
    (optional) q, k, v <- RMSNorm_head(q, k, v)   per head, over D (before RoPE)
    q, k <- RoPE(q, k; positions)
    A = softmax(q k^T / sqrt(D) + mask) v         query head h reads KV head h // (H / H_kv)
    out = A W_o                                   [B, S, d_model]

The mask is causal (by index) and, when `segment_ids` are given, block-diagonal over packed documents.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.nn.dense import Dense
from jaxpt.nn.norms import RMSNorm
from jaxpt.nn.rope import apply_rope


def attention_mask(seq_len: int, segment_ids=None):
  """Boolean mask `[batch or 1, 1, 1, q, k]`: True where query q may attend to key k."""
  causal = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))[None, None, None]
  if segment_ids is None:
    return causal
  same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, q, k]
  return causal & same_segment[:, None, None]


def grouped_attention(q, k, v, mask):
  """q: [B, S, H, D]; k, v: [B, S, H_kv, D]; mask: broadcastable to [B, H_kv, G, S, S] -> [B, S, H, D]."""
  batch, seq, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  groups = num_heads // num_kv_heads
  q = q.reshape(batch, seq, num_kv_heads, groups, head_dim)
  scores = jnp.einsum("bqhgd,bkhd->bhgqk", q, k, preferred_element_type=jnp.float32)
  scores = scores * (head_dim ** -0.5)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
  return out.reshape(batch, seq, num_heads, head_dim)


class Attention(nn.Module):
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  qk_norm: bool = False
  v_norm: bool = False
  norm_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, positions, segment_ids=None):
    """x: [batch, seq, d_model]; positions, segment_ids: [batch, seq] -> [batch, seq, d_model]."""
    d_model = x.shape[-1]

    def projection(heads, axes, name):
      return Dense((heads, self.head_dim), axes, dtype=self.dtype, param_dtype=self.param_dtype, name=name)(x)

    def head_norm(t, name):
      return RMSNorm(eps=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, axis_name="kv",
                     name=name)(t)

    q = projection(self.num_heads, ("embed", "heads", "kv"), "query")
    k = projection(self.num_kv_heads, ("embed", "kv_heads", "kv"), "key")
    v = projection(self.num_kv_heads, ("embed", "kv_heads", "kv"), "value")
    if self.qk_norm:
      q, k = head_norm(q, "query_norm"), head_norm(k, "key_norm")
    if self.v_norm:
      v = head_norm(v, "value_norm")
    q = apply_rope(q, positions, self.rope_theta)
    k = apply_rope(k, positions, self.rope_theta)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
    k = nn.with_logical_constraint(k, ("batch", "length", "kv_heads", "kv"))
    v = nn.with_logical_constraint(v, ("batch", "length", "kv_heads", "kv"))
    out = grouped_attention(q, k, v, attention_mask(x.shape[1], segment_ids))
    return Dense((d_model,), ("heads", "kv", "embed"), num_in_axes=2, dtype=self.dtype,
                 param_dtype=self.param_dtype, name="out")(out)
