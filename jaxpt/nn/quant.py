"""Blockwise weight quantization of a frozen kernel (QLoRA's base, `jaxpt.nn.lora`): int8 or NF4 codes with one
absmax scale per block of B consecutive inputs of each output.

A kernel W [*pre, k, *post] is cut along its axis k (a projection's last input axis) into blocks of B; viewed as
[m, k, n] (a free reshape), per block b and column j, with a = max_i |W[i, j]| over the block's B rows:

    int8:  s = a / 127,   q = round(W / s) in [-127, 127]     (int8 [*pre, k, *post])   W~ = q s
    nf4:   s = a,         q = argmin_c |W / s - NF4[c]|       (4-bit codes in 0..15)    W~ = NF4[q] s
           two codes per byte along k: byte i = q[2i] | q[2i + 1] << 4  (uint8 [*pre, k / 2, *post])

scales float32 [*pre, k / B, *post] (B > pack, so the blocked axis is the one where codes and scales differ).
NF4 (Dettmers et al. 2023, "QLoRA") is the 4-bit NormalFloat data type: the 16 quantiles of N(0, 1) scaled to
[-1, 1], with an exact 0 (bitsandbytes' table). The error of one element is at most
s / 2 (int8) or s / 2 times the widest gap between neighbouring NF4 values (nf4); a block of zeros has s = 0 and
decodes to 0. No double quantization of the scales (the paper's 0.127 bits per param): scales cost 32 / B bits.

`quantize` runs once, when a QLoRA run gets its base; `dequantize` runs inside every matmul (`jaxpt.nn.dense.Dense`),
elementwise ops that XLA fuses into the producer of the dot's operand.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["NF4", "QUANT_SCHEMES", "Quant", "blocked_axis", "dequantize", "quantize"]

QUANT_SCHEMES = ("int8", "nf4")
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
INT8_MAX = 127.0


@dataclasses.dataclass(frozen=True)
class Quant:
  """A quantization scheme ('int8' | 'nf4') and its block size B along the kernel's blocked axis (B > pack)."""

  scheme: str
  block: int = 64

  @property
  def pack(self) -> int:
    """Codes per stored element: 2 for nf4 (two 4-bit codes a byte), 1 for int8."""
    return 2 if self.scheme == "nf4" else 1

  @property
  def code_dtype(self):
    return jnp.uint8 if self.scheme == "nf4" else jnp.int8

  def shapes(self, shape: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of the codes and scales of a kernel of `shape` blocked along `axis`."""
    k = shape[axis]
    codes, scales = list(shape), list(shape)
    codes[axis], scales[axis] = k // self.pack, k // self.block
    return tuple(codes), tuple(scales)


def _three(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
  """[*pre, k, *post] -> (prod(pre), k, prod(post)): the free reshape that puts the blocked axis in the middle."""
  return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def quantize(w: jax.Array, quant: Quant, axis: int) -> tuple[jax.Array, jax.Array]:
  """w float [..., k, ...] (k at `axis`, k % B == 0) -> (codes int8 | uint8 with k / pack at `axis`, scales
  float32 with k / B at `axis`); see the module docstring."""
  m, k, n = _three(w.shape, axis)
  codes_shape, scales_shape = quant.shapes(w.shape, axis)
  blocks = w.astype(jnp.float32).reshape(m, k // quant.block, quant.block, n)
  absmax = jnp.max(jnp.abs(blocks), axis=2, keepdims=True)
  if quant.scheme == "int8":
    scale = absmax / INT8_MAX
    codes = jnp.round(blocks / jnp.where(scale > 0, scale, 1.0)).astype(jnp.int8)
    return codes.reshape(codes_shape), scale.reshape(scales_shape)
  normed = (blocks / jnp.where(absmax > 0, absmax, 1.0)).reshape(m, k, n)
  midpoints = jnp.asarray((NF4[1:] + NF4[:-1]) / 2)
  codes = jnp.searchsorted(midpoints, normed, side="left").astype(jnp.uint8)  # the nearest NF4 value
  packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
  return packed.reshape(codes_shape), absmax.reshape(scales_shape)


def blocked_axis(codes: jax.Array, scales: jax.Array) -> int:
  """The axis a kernel's codes and scales were blocked along: the one where their sizes differ (k / pack vs k / B)."""
  axes = [i for i, (c, s) in enumerate(zip(codes.shape, scales.shape)) if c != s]
  if len(axes) != 1:
    raise ValueError(f"codes {codes.shape} and scales {scales.shape} differ in {len(axes)} axes, not 1")
  return axes[0]


def dequantize(codes: jax.Array, scales: jax.Array, quant: Quant, dtype=jnp.float32) -> jax.Array:
  """(codes, scales) of `quantize` -> W~ of the kernel's shape in `dtype` (module docstring)."""
  axis = blocked_axis(codes, scales)
  m, rows, n = _three(codes.shape, axis)
  shape = list(codes.shape)
  shape[axis] = rows * quant.pack
  codes = codes.reshape(m, rows, n)
  if quant.scheme == "int8":
    values = codes.astype(jnp.float32)
  else:
    pairs = jnp.stack([codes & 15, codes >> 4], axis=2).reshape(m, 2 * rows, n)
    values = jnp.asarray(NF4)[pairs.astype(jnp.int32)]
  k = rows * quant.pack
  blocks = values.reshape(m, k // quant.block, quant.block, n) * scales.reshape(m, k // quant.block, 1, n)
  return blocks.astype(jnp.float32).reshape(shape).astype(dtype)
