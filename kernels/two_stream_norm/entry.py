"""Fused hybrid_pre attention-input boundary: Pallas forward/backward kernels tied by `jax.custom_vjp`.

Row arrays `[rows, d]` (any leading shape is flattened), float32 or bfloat16, float32 math inside.
Forward (reads x, y once; writes h once plus row statistics `[rows, 8]`):
    h = c1 * x + N_y(y)                      c1: learnable `[d]` vector
Backward, with dh the cotangent of h:
    dx = c1 * dh ;  dy = N_y'(dh) ;  dc1 = sum_rows(dh * x) ;  dw_y, db_y = the norm's weight gradients
(per-block partial sums `[grid, 8, d]`, reduced afterwards).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from kernels.two_stream_norm import layout
from kernels.two_stream_norm import rowmath as rm

C1, W_Y, B_Y = range(3)
M_Y, R_Y = range(2)


@dataclasses.dataclass(frozen=True)
class Static:
  plan: layout.Plan
  kind: str
  eps: float
  dtype: str


def _forward_kernel(static: Static, x_ref, y_ref, prm_ref, h_ref, st_ref):
  plan, dtype = static.plan, jnp.dtype(static.dtype)
  prm = prm_ref[...]
  mask = rm.column_mask((1, plan.d_pad), plan.d, plan.d_pad)

  def body(rows, carry):
    x = x_ref[rows, :].astype(jnp.float32)
    y = y_ref[rows, :].astype(jnp.float32)
    yn, mean, rstd = rm.norm_forward(y, rm.param_row(prm, W_Y), rm.param_row(prm, B_Y), static.kind, static.eps,
                                     plan.d, mask)
    h_ref[rows, :] = (rm.param_row(prm, C1) * x + yn).astype(dtype)
    st_ref[rows, :] = rm.pack_cols([mean, rstd], layout.SLOTS)
    return carry

  layout.chunk_loop(plan, body, 0)


def _backward_kernel(static: Static, x_ref, y_ref, st_ref, prm_ref, dh_ref, dx_ref, dy_ref, part_ref):
  plan, dtype, kind = static.plan, jnp.dtype(static.dtype), static.kind
  prm = prm_ref[...]
  mask = rm.column_mask((1, plan.d_pad), plan.d, plan.d_pad)

  def body(rows, acc):
    st = st_ref[rows, :]
    rstd = rm.stat_col(st, R_Y)
    x = x_ref[rows, :].astype(jnp.float32)
    xhat = rm.normalised(y_ref[rows, :].astype(jnp.float32), rm.stat_col(st, M_Y), rstd, kind, mask)
    dh = dh_ref[rows, :].astype(jnp.float32)
    dy, dw, db = rm.norm_backward(dh, xhat, rstd, rm.param_row(prm, W_Y), kind, plan.d, mask)
    dx_ref[rows, :] = (rm.param_row(prm, C1) * dh).astype(dtype)
    dy_ref[rows, :] = dy.astype(dtype)
    dc1 = jnp.sum(dh * x, axis=0, keepdims=True)
    return acc + rm.pack_rows([dc1, dw, db], layout.SLOTS, plan.d_pad)

  part_ref[...] = layout.chunk_loop(plan, body, jnp.zeros((layout.SLOTS, plan.d_pad), jnp.float32))


def _forward(static: Static, params, x, y):
  dt = jnp.dtype(static.dtype)
  h, stats = layout.call(functools.partial(_forward_kernel, static), static.plan, (x, y, params),
                         ("row", "row", "params"), ("row", "stats"), (dt, jnp.float32), dt.itemsize)
  return h, stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(static: Static, params, x, y):
  return _forward(static, params, x, y)[0]


def _fused_fwd(static: Static, params, x, y):
  h, stats = _forward(static, params, x, y)
  return h, (x, y, stats, params)


def _fused_bwd(static: Static, residuals, dh):
  dt = jnp.dtype(static.dtype)
  x, y, stats, params = residuals
  dx, dy, partial = layout.call(functools.partial(_backward_kernel, static), static.plan,
                                (x, y, stats, params, dh.astype(dt)),
                                ("row", "row", "stats", "params", "row"), ("row", "row", "partial"),
                                (dt, dt, jnp.float32), dt.itemsize)
  return jnp.sum(partial, axis=0), dx, dy


_fused.defvjp(_fused_fwd, _fused_bwd)


def hybrid_entry(x, y, c1, norm_y, *, eps: float, platform: str | None = None, block_rows: int | None = None,
                 chunk_rows: int | None = None):
  """Fused `h = c1 * x + N_y(y)`, shaped and typed like x (`[..., d]`).

  c1: `[d]`; norm_y: `{"scale": [d]}` (RMSNorm) or `{"scale": [d], "bias": [d]}` (LayerNorm).
  """
  shape, dtype = x.shape, x.dtype
  d = shape[-1]
  if y.shape != shape or y.dtype != dtype:
    raise ValueError(f"x and y must share shape {shape} and dtype {dtype}")
  rows_n = math.prod(shape[:-1])
  kind = rm.LAYERNORM if "bias" in norm_y else rm.RMSNORM
  plan = layout.make_plan(rows_n, d, platform, block_rows, chunk_rows, jnp.dtype(dtype).itemsize)
  params = layout.pack_params([c1, norm_y["scale"], norm_y.get("bias", 0.0)], plan)
  static = Static(plan, kind, float(eps), jnp.dtype(dtype).name)
  h = _fused(static, params, *(layout.pad_rows(a.reshape(rows_n, d), plan) for a in (x, y)))
  return layout.unpad_rows(h, plan).reshape(shape)
