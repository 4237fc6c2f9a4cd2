"""Normalisation layers, computed in float32 and returned in the compute dtype.

RMSNorm:   y = x / sqrt(mean(x^2) + eps) * w
LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b
Both normalise over the last axis: `[..., features] -> [..., features]`, and are `jax.checkpoint`ed: the backward
recomputes the norm from its input, so a norm keeps only x (in its own dtype) for the backward rather than the
float32 intermediates autodiff would store (three `[..., features]` float32 arrays). Norms are cheap to recompute
and many: SiameseNorm has six a layer (Pre-Norm two). The train step's compiled peak with scanned layers, bf16
compute (d512 / 8 layers, batch 8 x 256, XLA:CPU): SiameseNorm 2640 -> 2252 MiB, 1.18x -> 1.07x Pre-Norm's,
Pre-Norm 2232 -> 2104 MiB; with unrolled layers in float32 XLA already avoided most of it (only
`siamese_hybrid_pre` moved, 1.24x -> 1.17x) (`benchmarks/results_norm_checkpoint_memory_cpu.json`).
`NormParams` declares a norm's parameters (same names, shapes, init and logical axes) without applying it, for
callers that hand them to a fused kernel (`jaxpt.models.fused`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.registry import Registry


def declare_scale(module: nn.Module, features: int):
  """The `scale` parameter `[features]` (init 1) of a norm, declared in `module`'s scope."""
  return module.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (module.axis_name,)),
                      (features,), module.param_dtype)


def declare_bias(module: nn.Module, features: int):
  """The `bias` parameter `[features]` (init 0) of a LayerNorm, declared in `module`'s scope."""
  return module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (module.axis_name,)),
                      (features,), module.param_dtype)


class _RowNorm(nn.Module):
  """Fields shared by the norms: eps, compute dtype, param dtype, the logical name of the normalised axis."""

  eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  axis_name: str = "embed"


@functools.partial(jax.checkpoint, static_argnums=(2, 3))
def rms_norm(x, scale, eps: float, dtype):
  """x / sqrt(mean(x^2) + eps) * scale over the last axis, in float32, returned in `dtype` (checkpointed)."""
  x32 = x.astype(jnp.float32)
  inv_rms = jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps))
  return (x32 * inv_rms * scale.astype(jnp.float32)).astype(dtype)


@functools.partial(jax.checkpoint, static_argnums=(3, 4))
def layer_norm(x, scale, bias, eps: float, dtype):
  """standardize(x) * scale + bias over the last axis, in float32, returned in `dtype` (checkpointed)."""
  return (standardize(x, eps) * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(dtype)


class RMSNorm(_RowNorm):

  @nn.compact
  def __call__(self, x):
    return rms_norm(x, declare_scale(self, x.shape[-1]), self.eps, self.dtype)


def standardize(x, eps: float):
  """(x - mean(x)) / sqrt(var(x) + eps) over the last axis, in float32 (LayerNorm without scale and bias)."""
  x32 = x.astype(jnp.float32)
  centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)
  return centred * jnp.reciprocal(jnp.sqrt(var + eps))


class LayerNorm(_RowNorm):

  @nn.compact
  def __call__(self, x):
    return layer_norm(x, declare_scale(self, x.shape[-1]), declare_bias(self, x.shape[-1]), self.eps, self.dtype)


class NormParams(nn.Module):
  """A norm's parameters, `{"scale": [features]}` (RMSNorm) or `{"scale", "bias"}` (LayerNorm), unapplied:
  the same parameter tree as the norm module of that name, so checkpoints work either way."""

  norm_type: str = "rmsnorm"
  param_dtype: Any = jnp.float32
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, features: int):
    params = {"scale": declare_scale(self, features)}
    if self.norm_type == "layernorm":
      params["bias"] = declare_bias(self, features)
    return params


NORMS: Registry[type[_RowNorm]] = Registry("norm")
NORMS.add("rmsnorm", RMSNorm)
NORMS.add("layernorm", LayerNorm)


def make_norm(norm_type: str, eps: float, dtype: Any, param_dtype: Any, name: str,
              axis_name: str = "embed") -> nn.Module:
  """A fresh norm module of the configured kind (a `NORMS` name; KeyError naming the known norms otherwise);
  each call is its own parameter set."""
  return NORMS.get(norm_type)(eps=eps, dtype=dtype, param_dtype=param_dtype, axis_name=axis_name, name=name)
