"""Projections computed as one 2-D matmul, with logical axis names on their kernels.

`Dense` maps `[..., *in_shape] -> [..., *out_shape]` with a kernel `[*in_shape, *out_shape]` by flattening to
`[tokens, prod(in_shape)] @ [prod(in_shape), prod(out_shape)]`. Flattening first matters for speed: the weight
gradient then contracts a single `tokens` axis. With `[batch, seq, ...]` kept separate it contracts two axes, and
XLA:CPU canonicalises that by materialising a transposed copy of the `[batch, seq, out]` cotangent (measured:
~18% of a d_model-512 train step; see benchmarks/train_step.py).

`matmul` is that 2-D product with its backward pass written out so that both gradients' dots run on the operands'
dtype, accumulated in float32: dx = g w^T, dw = x^T g, the latter one dot contracting both operands' leading
`tokens` axis. (Until 8581039 dw came from a transposed copy of x kept by an optimization barrier: on earlier
machines XLA:CPU ran the leading-axis dot at ~75% of its plain rate. On the Intel Xeon of
`benchmarks/results_train_step_cpu.json` the copies took ~570 ms of a ~3 s d512 Pre-Norm step (scanned layers) in a
profile, and without them the step takes 0.91x the time with scanned layers and 0.96x unrolled, timed in alternation
(`benchmarks/results_dense_backward_cpu.json`); on TPU and GPU such a copy is pure overhead.)
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxpt.nn.lora import LORA_AXIS, LoRA, kaiming_uniform_init, lora_delta
from jaxpt.nn.quant import dequantize, quantize


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x, w, out_dtype=None):
  """x [tokens, k] @ w [k, n] -> [tokens, n] (accumulated in, and returned as, `out_dtype` when given; else
  accumulated in float32 and returned in the operands' dtype). Backward: dx = g w^T, dw = x^T g (see the module
  doc)."""
  return accumulate_f32(x, w, out_dtype)


def accumulate_f32(x, w, out_dtype=None):
  """jnp.dot(x, w) accumulated in float32, cast to `out_dtype` (default: the operands' result dtype).

  Asking for the float32 result is what lets XLA:CPU run a bf16 x bf16 matmul on the bf16 operands: asked for a
  bf16 result it first converts both operands to float32 (a float32 copy of every weight: a d512 decode step with
  bf16 weights took 1.33x the float32 step's time, against 0.79x this way); on TPU the MXU accumulates in
  float32 either way."""
  out_dtype = out_dtype or jnp.result_type(x, w)
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(out_dtype)


def _matmul_fwd(x, w, out_dtype):
  return matmul(x, w, out_dtype), (x, w)


def _matmul_bwd(out_dtype, residuals, g):
  x, w = residuals
  contract_tokens = (((0,), (0,)), ((), ()))  # x [tokens, k], g [tokens, n] -> [k, n]
  return (jnp.dot(g, w.T, preferred_element_type=jnp.float32).astype(x.dtype),
          lax.dot_general(x, g, contract_tokens, preferred_element_type=jnp.float32).astype(w.dtype))


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def kernel_init(ndim: int, num_in_axes: int = 1):
  """Fan-in scaled truncated normal (variance 1/fan_in) for a kernel `[*in_shape, *out_shape]` of `ndim` axes."""
  in_axes, out_axes = tuple(range(num_in_axes)), tuple(range(num_in_axes, ndim))
  return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=in_axes, out_axis=out_axes)


def dense_init(logical_axes: Sequence[str], num_in_axes: int = 1):
  """`kernel_init` with the kernel's logical axis names."""
  return nn.with_logical_partitioning(kernel_init(len(logical_axes), num_in_axes), tuple(logical_axes))


class Dense(nn.Module):
  """y = x W (+ b with `use_bias`): `[..., *in_shape] -> [..., *out_shape]`, kernel `[*in_shape, *out_shape]`,
  bias `[*out_shape]` (init 0). With `zero_init` the kernel starts at 0 too (DiT's adaLN-Zero and output layers).
  With `lora` it adds s (dropout(x) A) B, A `[*in_shape, r]`, B `[r, *out_shape]` (`jaxpt.nn.lora`); with
  `lora.quant` (QLoRA) the kernel is `kernel_q` codes and `kernel_scale` scales blocked along the last input axis
  (`jaxpt.nn.quant`), W~ dequantized to the compute dtype before the matmul; at init they quantize the kernel the
  float Dense would draw.

  `logical_axes` names every kernel axis (in axes first); `num_in_axes` trailing axes of x are contracted.
  """

  out_shape: Sequence[int]
  logical_axes: Sequence[str]
  num_in_axes: int = 1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_bias: bool = False
  zero_init: bool = False
  lora: LoRA | None = None

  @nn.compact
  def __call__(self, x):
    in_shape = tuple(x.shape[x.ndim - self.num_in_axes:])
    out_shape = tuple(self.out_shape)
    init = (nn.with_logical_partitioning(nn.initializers.zeros, tuple(self.logical_axes)) if self.zero_init
            else dense_init(self.logical_axes, self.num_in_axes))
    lead = x.shape[:x.ndim - self.num_in_axes]
    fan_in, fan_out = math.prod(in_shape), math.prod(out_shape)
    if self.lora is not None and self.lora.quant is not None:
      kernel = self.quantized_kernel(in_shape + out_shape)
    else:
      kernel = self.param("kernel", init, in_shape + out_shape, self.param_dtype)
    flat = x.reshape(-1, fan_in).astype(self.dtype)
    y = matmul(flat, kernel.reshape(fan_in, fan_out).astype(self.dtype))
    if self.lora is not None and self.lora.adapters:
      y = y + self.adapter(flat, in_shape, out_shape)
    y = y.reshape(lead + out_shape)
    if self.use_bias:
      bias_axes = tuple(self.logical_axes[self.num_in_axes:])
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes), out_shape,
                        self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y

  def quantized_kernel(self, shape):
    """W~ [*in_shape, *out_shape] in the compute dtype from the params `kernel_q` and `kernel_scale` (their init:
    the float init, quantized)."""
    quant, axes, axis = self.lora.quant, tuple(self.logical_axes), self.num_in_axes - 1
    codes_shape, scales_shape = quant.shapes(shape, axis)
    initial = (None, None)
    if self.is_initializing() and not self.has_variable("params", "kernel_q"):
      draw = nn.initializers.zeros if self.zero_init else kernel_init(len(shape), self.num_in_axes)
      initial = quantize(draw(self.make_rng("params"), shape, self.param_dtype), quant, axis)
    scale_axes = axes[:axis] + (None,) + axes[axis + 1:]  # the blocked axis whole: split as the kernel's out axes
    codes = self.param("kernel_q", nn.with_logical_partitioning(lambda *_: initial[0], axes), codes_shape)
    scales = self.param("kernel_scale", nn.with_logical_partitioning(lambda *_: initial[1], scale_axes), scales_shape)
    return dequantize(codes, scales, quant, self.dtype)

  def adapter(self, flat, in_shape, out_shape):
    """s (dropout(x) A) B for x flattened to [tokens, k] -> [tokens, n]; A, B float32 params."""
    lora, axes = self.lora, tuple(self.logical_axes)
    in_axes, out_axes = axes[:self.num_in_axes] + (LORA_AXIS,), (LORA_AXIS,) + axes[self.num_in_axes:]
    a = self.param("lora_a", nn.with_logical_partitioning(kaiming_uniform_init(len(in_shape)), in_axes),
                   in_shape + (lora.rank,), jnp.float32)
    b = self.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros, out_axes), (lora.rank,) + out_shape,
                   jnp.float32)
    if lora.dropout > 0:
      flat = nn.Dropout(rate=lora.dropout)(flat, deterministic=lora.deterministic)
    return lora_delta(flat, a.reshape(-1, lora.rank), b.reshape(lora.rank, -1), lora.scale)
