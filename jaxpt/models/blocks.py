"""Transformer blocks, one class per residual scheme (spec: shared/specs/siamesenorm.md).

Every block maps `streams -> streams`, where `streams` is a tuple of `[batch, seq, d_model]` arrays: `(x,)` for
the single-stream schemes and `(x, y)` for SiameseNorm (x: Post-Norm-like stream, y: Pre-Norm-like stream).
F is attention or the MLP, LN a norm of the configured type, l the 0-based block index, c_l = sqrt(2(l+1)).

- `pre`:   x <- x + F(LN(x))
- `post`:  x <- LN(x + F(x))
- `hybrid` (HybridNorm): x' = x + Attn_qkvnorm(x);  xb = LN(x');  x <- xb + MLP(xb)
- `siamese_post_pre`: six norms per block (post1, pre1, in1, post2, pre2, in2)
      xh = LN_post(x);  z = F(LN_in(xh + LN_pre(y)));  x <- xh + z / c_l;  y <- y + z     (for attn, then MLP)
- `siamese_hybrid_pre`:
      A = Attn_qkvnorm(c1 * x + N_attn_y(y));  x' = x + A / c_l;  y' = y + A
      xb = N_ff(x');  M = MLP(N_ff_in(xb + N_ff_y(y')));  x <- xb + M / c_l;  y <- y' + M
- `hc`, `hc_dynamic`, `mhc`, `mhc_lite` (n = hc_streams streams; spec in `jaxpt.models.hyper_connections`):
      X = stack(streams);  (q, p, R) = connection_k(X);  X <- R X + p^T F(LN(q X))     (for attn, then MLP)

Each sub-layer is computed once and its (dropped-out) output is added to both streams. Blocks return
`(streams, kv)` so they can be stacked with `nn.scan` over the layer index: kv is None, or, when called with the
layer's `LayerCache` (decoding), its key/value buffers with the new tokens' K/V written in. Only K/V are cached:
the streams (both SiameseNorm streams) are per-token state recomputed for each token.

With `config.kernel == "pallas"` the siamese blocks compute each boundary with one fused op (`jaxpt.models.fused`),
reading the same norm parameters (`NormParams`, same tree):
- siamese_post_pre: entry  xh, h = fused(x, y)                  (no update: p = x)
                    middle xh', y', h2 = fused(xh, y, a, c)      (p = xh + a/c, y' = y + a)
- siamese_hybrid_pre: entry h = c1 * x + N_attn_y(y);  middle xb, y', h2 = fused(x, y, A, c) with
                    post = ff_norm, pre = ff_y_norm, in = ff_in_norm
The block-end updates x <- xh' + m/c, y <- y' + m stay two XLA-fused adds.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from jaxpt.models import fused
from jaxpt.models.config import ModelConfig
from jaxpt.models.hyper_connections import STREAM_AXES, HyperConnection, read_streams, write_streams
from jaxpt.nn.attention import Attention, LayerCache
from jaxpt.nn.lora import LoRA
from jaxpt.nn.mlp import MLP
from jaxpt.nn.moe import MoE
from jaxpt.nn.norms import NormParams, make_norm
from jaxpt.registry import Registry

RESIDUAL_AXES = ("batch", "length", "embed")


def depth_scale(layer_index):
  """c_l = sqrt(2 (l + 1)) for the 0-based block index l (a traced scalar under nn.scan)."""
  return jnp.sqrt(2.0 * (jnp.asarray(layer_index, jnp.float32) + 1.0))


def depth_scaled(update, c):
  """update / c_l in the update's dtype, rounded once (the official code divides by a Python float): 1/c_l stays
  float32, since a bf16 1/c_l would scale every element of a layer's update by the same error (up to 0.25%)."""
  return (update.astype(jnp.float32) / c).astype(update.dtype)


class ResidualBlock(nn.Module):
  """Shared sub-layer factories; subclasses implement one residual scheme in `__call__`. `lora`: adapters on the
  attention and MLP projections it targets (`jaxpt.nn.lora`; not on MoE experts)."""

  config: ModelConfig
  deterministic: bool = True
  lora: LoRA | None = None

  @property
  def adapters(self) -> LoRA | None:
    """`lora` with its dropout on iff this block's is."""
    return None if self.lora is None else dataclasses.replace(self.lora, deterministic=self.deterministic)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.config.dtype)

  def norm(self, name: str):
    cfg = self.config
    return make_norm(cfg.norm_type, cfg.norm_eps, self.compute_dtype, jnp.dtype(cfg.param_dtype), name)

  def norm_params(self, name: str, features: int):
    """The parameters of norm `name` (same tree as `self.norm(name)`), for the fused kernels."""
    cfg = self.config
    return NormParams(cfg.norm_type, jnp.dtype(cfg.param_dtype), name=name)(features)

  def attention(self, h, positions, segment_ids, cache: LayerCache | None, qkv_norm: bool = False):
    """-> (out, kv): kv is None without a cache, else the layer's updated (key, value) buffers."""
    cfg = self.config
    out = Attention(num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.resolved_head_dim,
                    rope_theta=cfg.rope_theta, qk_norm=cfg.qk_norm or qkv_norm, v_norm=cfg.v_norm or qkv_norm,
                    norm_eps=cfg.norm_eps, query_chunk=cfg.attention_query_chunk, impl=cfg.attention_impl,
                    dtype=self.compute_dtype,
                    param_dtype=jnp.dtype(cfg.param_dtype), qkv_bias=cfg.qkv_bias, out_bias=cfg.attn_out_bias,
                    rope_scaling=cfg.rope_scaling_params, causal=cfg.causal, rope=cfg.rope, lora=self.adapters,
                    name="attn")(h, positions, segment_ids, cache)
    out, kv = (out, None) if cache is None else out
    return self.dropout(out), kv

  def mlp(self, h):
    """The dense MLP, or with `num_experts > 0` the routed `MoE` (its aux losses sown into `losses`)."""
    cfg = self.config
    recompute = cfg.remat == "none"  # a remat policy recomputes the whole block already
    if cfg.num_experts:
      layer = MoE(cfg.num_experts, cfg.experts_per_token, cfg.mlp_dim, cfg.mlp_type, cfg.moe_capacity_factor,
                  dtype=self.compute_dtype, param_dtype=jnp.dtype(cfg.param_dtype), recompute_hidden=recompute,
                  name="mlp")
    else:
      layer = MLP(mlp_dim=cfg.mlp_dim, mlp_type=cfg.mlp_type, dtype=self.compute_dtype,
                  param_dtype=jnp.dtype(cfg.param_dtype), use_bias=cfg.mlp_bias, lora=self.adapters,
                  recompute_hidden=recompute, name="mlp")
    return self.dropout(layer(h))

  def dropout(self, t):
    return nn.Dropout(rate=self.config.dropout_rate)(t, deterministic=self.deterministic)

  @staticmethod
  def constrain(streams):
    return tuple(nn.with_logical_constraint(s, RESIDUAL_AXES) for s in streams)


class PreNormBlock(ResidualBlock):

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    (x,) = streams
    a, kv = self.attention(self.norm("attn_norm")(x), positions, segment_ids, cache)
    x = x + a
    x = x + self.mlp(self.norm("mlp_norm")(x))
    return self.constrain((x,)), kv


class PostNormBlock(ResidualBlock):

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    (x,) = streams
    a, kv = self.attention(x, positions, segment_ids, cache)
    x = self.norm("attn_post_norm")(x + a)
    x = self.norm("mlp_post_norm")(x + self.mlp(x))
    return self.constrain((x,)), kv


class HybridNormBlock(ResidualBlock):

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    (x,) = streams
    a, kv = self.attention(x, positions, segment_ids, cache, qkv_norm=True)
    x = x + a
    xb = self.norm("mlp_post_norm")(x)
    x = xb + self.mlp(xb)
    return self.constrain((x,)), kv


class SiamesePostPreBlock(ResidualBlock):

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    if fused.use_fused(self.config):
      return self.fused_call(streams, layer_index, positions, segment_ids, cache)
    x, y = streams
    c = depth_scale(layer_index)
    xh = self.norm("post1")(x)
    a, kv = self.attention(self.norm("in1")(xh + self.norm("pre1")(y)), positions, segment_ids, cache)
    x, y = xh + depth_scaled(a, c), y + a
    xh = self.norm("post2")(x)
    m = self.mlp(self.norm("in2")(xh + self.norm("pre2")(y)))
    return self.constrain((xh + depth_scaled(m, c), y + m)), kv

  def fused_call(self, streams, layer_index, positions, segment_ids, cache):
    x, y = streams
    cfg, c = self.config, depth_scale(layer_index)
    p = {name: self.norm_params(name, x.shape[-1]) for name in ("post1", "pre1", "in1", "post2", "pre2", "in2")}
    xh, y, h = fused.post_pre_boundary(cfg, x, y, None, None, p["post1"], p["pre1"], p["in1"])
    a, kv = self.attention(h, positions, segment_ids, cache)
    xh, y, h = fused.post_pre_boundary(cfg, xh, y, a, c, p["post2"], p["pre2"], p["in2"])
    m = self.mlp(h)
    return self.constrain((xh + depth_scaled(m, c), y + m)), kv


class SiameseHybridPreBlock(ResidualBlock):

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    if fused.use_fused(self.config):
      return self.fused_call(streams, layer_index, positions, segment_ids, cache)
    x, y = streams
    c = depth_scale(layer_index)
    c1 = self.c1(x.shape[-1])
    a, kv = self.attention(c1.astype(x.dtype) * x + self.norm("attn_y_norm")(y), positions, segment_ids, cache,
                           qkv_norm=True)
    x, y = x + depth_scaled(a, c), y + a
    xb = self.norm("ff_norm")(x)
    m = self.mlp(self.norm("ff_in_norm")(xb + self.norm("ff_y_norm")(y)))
    return self.constrain((xb + depth_scaled(m, c), y + m)), kv

  def c1(self, features: int):
    return self.param("c1", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (features,),
                      jnp.dtype(self.config.param_dtype))

  def fused_call(self, streams, layer_index, positions, segment_ids, cache):
    x, y = streams
    cfg, c, d = self.config, depth_scale(layer_index), x.shape[-1]
    c1 = self.c1(d)
    p = {name: self.norm_params(name, d) for name in ("attn_y_norm", "ff_norm", "ff_y_norm", "ff_in_norm")}
    a, kv = self.attention(fused.hybrid_entry(cfg, x, y, c1, p["attn_y_norm"]), positions, segment_ids, cache,
                           qkv_norm=True)
    xb, y, h = fused.post_pre_boundary(cfg, x, y, a, c, p["ff_norm"], p["ff_y_norm"], p["ff_in_norm"])
    m = self.mlp(h)
    return self.constrain((xb + depth_scaled(m, c), y + m)), kv


class HyperConnectionBlock(ResidualBlock):
  """The Pre-Norm sub-layers (same names: attn_norm, attn, mlp_norm, mlp), each wrapped by a `HyperConnection`
  (attn_hc, mlp_hc) over the n streams instead of x <- x + F(LN(x))."""

  @nn.compact
  def __call__(self, streams, layer_index, positions, segment_ids=None, cache=None):
    x = nn.with_logical_constraint(jnp.stack(streams, axis=2), STREAM_AXES)  # [batch, seq, n, d_model]
    k = 2 * jnp.asarray(layer_index, jnp.int32)
    pre, post, res = HyperConnection(self.config, name="attn_hc")(x, k)
    a, kv = self.attention(self.norm("attn_norm")(read_streams(pre, x)), positions, segment_ids, cache)
    x = write_streams(res, x, post, a)
    pre, post, res = HyperConnection(self.config, name="mlp_hc")(x, k + 1)
    x = write_streams(res, x, post, self.mlp(self.norm("mlp_norm")(read_streams(pre, x))))
    return self.constrain(tuple(x[:, :, i] for i in range(x.shape[2]))), kv


BLOCKS: Registry[type[nn.Module]] = Registry("residual scheme")  # ModelConfig.norm_scheme -> block class
BLOCKS.add("pre", PreNormBlock)
BLOCKS.add("post", PostNormBlock)
BLOCKS.add("hybrid", HybridNormBlock)
BLOCKS.add("siamese_post_pre", SiamesePostPreBlock)
BLOCKS.add("siamese_hybrid_pre", SiameseHybridPreBlock)
BLOCKS.add("hc", HyperConnectionBlock)
BLOCKS.add("hc_dynamic", HyperConnectionBlock)
BLOCKS.add("mhc", HyperConnectionBlock)
BLOCKS.add("mhc_lite", HyperConnectionBlock)


class OutputMerge(nn.Module):
  """Final hidden state `[batch, seq, d_model]` fed to the LM head.

  pre, hybrid: LN_final(x);  post: x (already normalised);
  siamese_*:   LN_final(LN_fx(x) + LN_fy(y));
  hc, hc_dynamic, mhc, mhc_lite: LN_final(x_1 + ... + x_n) (HC's sum of the streams, then the final norm).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, streams):
    cfg = self.config

    def norm(name):
      return make_norm(cfg.norm_type, cfg.norm_eps, jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype), name)

    if cfg.norm_scheme == "post":
      return streams[0]
    if cfg.is_siamese:
      x, y = streams
      return norm("final_norm")(norm("final_x_norm")(x) + norm("final_y_norm")(y))
    return norm("final_norm")(sum(streams[1:], streams[0]))
