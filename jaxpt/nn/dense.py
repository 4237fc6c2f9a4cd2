"""Projections computed as one 2-D matmul, with logical axis names on their kernels.

`Dense` maps `[..., *in_shape] -> [..., *out_shape]` with a kernel `[*in_shape, *out_shape]` by flattening to
`[tokens, prod(in_shape)] @ [prod(in_shape), prod(out_shape)]`. Flattening first matters for speed: the weight
gradient then contracts a single `tokens` axis. With `[batch, seq, ...]` kept separate it contracts two axes, and
XLA:CPU canonicalises that by materialising a transposed copy of the `[batch, seq, out]` cotangent (measured:
~18% of a d_model-512 train step; see benchmarks/train_step.py).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp


def dense_init(logical_axes: Sequence[str], num_in_axes: int = 1):
  """Fan-in scaled truncated normal (variance 1/fan_in) for a kernel `[*in_shape, *out_shape]`."""
  in_axes = tuple(range(num_in_axes))
  out_axes = tuple(range(num_in_axes, len(logical_axes)))
  init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=in_axes, out_axis=out_axes)
  return nn.with_logical_partitioning(init, tuple(logical_axes))


class Dense(nn.Module):
  """y = x W without bias: `[..., *in_shape] -> [..., *out_shape]`, kernel `[*in_shape, *out_shape]`.

  `logical_axes` names every kernel axis (in axes first); `num_in_axes` trailing axes of x are contracted.
  """

  out_shape: Sequence[int]
  logical_axes: Sequence[str]
  num_in_axes: int = 1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    in_shape = tuple(x.shape[x.ndim - self.num_in_axes:])
    out_shape = tuple(self.out_shape)
    kernel = self.param("kernel", dense_init(self.logical_axes, self.num_in_axes), in_shape + out_shape,
                        self.param_dtype)
    lead = x.shape[:x.ndim - self.num_in_axes]
    fan_in, fan_out = math.prod(in_shape), math.prod(out_shape)
    y = jnp.dot(x.reshape(-1, fan_in).astype(self.dtype), kernel.reshape(fan_in, fan_out).astype(self.dtype))
    return y.reshape(lead + out_shape)
