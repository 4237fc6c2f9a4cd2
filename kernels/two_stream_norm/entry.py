"""Fused hybrid_pre attention-input boundary: Pallas forward/backward kernels tied by `jax.custom_vjp`.

Row arrays `[rows, d]` (any leading shape is flattened), float32 or bfloat16, float32 math inside; c1 is the
learnable `[d]` vector.
Entry form (reads x, y once; writes h once plus row statistics `[rows, 8]`):
    h = c1 * x + N_y(y)
  backward, with dh the cotangent of h:
    dx = c1 * dh ;  dy = N_y'(dh) ;  dc1 = sum_rows(dh * x) ;  dw_y, db_y = the norm's weight gradients
Update form, the boundary after the previous block's MLP output z (reads x_prev, y_prev, z; writes x, y, h):
    x = x_prev + z/c ;  y = y_prev + z ;  h = c1 * x + N_y(y)
  backward, with dx, dy, dh the cotangents of x, y, h:
    dx_tot = dx + c1 * dh ; dy_tot = dy + N_y'(dh) ; dz = dy_tot + dx_tot/c ; dx_prev = dx_tot ;
    dy_prev = dy_tot ; d(1/c) = sum(dx_tot * z)
Weight gradients are per-block partial sums `[grid, 8, d]`, reduced afterwards.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from . import layout
from . import rowmath as rm

C1, W_Y, B_Y, INV_C = range(4)
M_Y, R_Y = range(2)


@dataclasses.dataclass(frozen=True)
class Static:
  plan: layout.Plan
  kind: str
  eps: float
  has_update: bool
  dtype: str


def _forward_kernel(static: Static, *refs):
  plan, dtype = static.plan, jnp.dtype(static.dtype)
  if static.has_update:
    xp_ref, yp_ref, z_ref, prm_ref, x_ref, y_ref, h_ref, st_ref = refs
  else:
    xp_ref, yp_ref, prm_ref, h_ref, st_ref = refs
  prm = prm_ref[...]
  mask = rm.column_mask((1, plan.d_pad), plan.d, plan.d_pad)

  def body(rows, carry):
    x = xp_ref[rows, :].astype(jnp.float32)
    y = yp_ref[rows, :].astype(jnp.float32)
    if static.has_update:  # the backward recomputes from the stored x and y
      z = z_ref[rows, :].astype(jnp.float32)
      x_out, y_out = (x + z * rm.param_row(prm, INV_C)).astype(dtype), (y + z).astype(dtype)
      x_ref[rows, :], y_ref[rows, :] = x_out, y_out
      x, y = x_out.astype(jnp.float32), y_out.astype(jnp.float32)
    yn, mean, rstd = rm.norm_forward(y, rm.param_row(prm, W_Y), rm.param_row(prm, B_Y), static.kind, static.eps,
                                     plan.d, mask)
    h_ref[rows, :] = (rm.param_row(prm, C1) * x + yn).astype(dtype)
    st_ref[rows, :] = rm.pack_cols([mean, rstd], layout.SLOTS)
    return carry

  layout.chunk_loop(plan, body, 0)


def _backward_kernel(static: Static, *refs):
  plan, dtype, kind = static.plan, jnp.dtype(static.dtype), static.kind
  if static.has_update:
    x_ref, y_ref, z_ref, st_ref, prm_ref, dx_ref, dy_ref, dh_ref, dxp_ref, dyp_ref, dz_ref, part_ref = refs
  else:
    x_ref, y_ref, st_ref, prm_ref, dh_ref, dxp_ref, dyp_ref, part_ref = refs
  prm = prm_ref[...]
  mask = rm.column_mask((1, plan.d_pad), plan.d, plan.d_pad)

  def body(rows, acc):
    st = st_ref[rows, :]
    rstd = rm.stat_col(st, R_Y)
    x = x_ref[rows, :].astype(jnp.float32)
    xhat = rm.normalised(y_ref[rows, :].astype(jnp.float32), rm.stat_col(st, M_Y), rstd, kind, mask)
    dh = dh_ref[rows, :].astype(jnp.float32)
    dy_tot, dw, db = rm.norm_backward(dh, xhat, rstd, rm.param_row(prm, W_Y), kind, plan.d, mask)
    dx_tot = rm.param_row(prm, C1) * dh
    partials = [jnp.sum(dh * x, axis=0, keepdims=True), dw, db]
    if static.has_update:
      dx_tot = dx_tot + dx_ref[rows, :].astype(jnp.float32)
      dy_tot = dy_tot + dy_ref[rows, :].astype(jnp.float32)
      dz_ref[rows, :] = (dy_tot + dx_tot * rm.param_row(prm, INV_C)).astype(dtype)
      partials.append(jnp.sum(dx_tot * z_ref[rows, :].astype(jnp.float32), axis=0, keepdims=True))
    dxp_ref[rows, :] = dx_tot.astype(dtype)
    dyp_ref[rows, :] = dy_tot.astype(dtype)
    return acc + rm.pack_rows(partials, layout.SLOTS, plan.d_pad)

  part_ref[...] = layout.chunk_loop(plan, body, jnp.zeros((layout.SLOTS, plan.d_pad), jnp.float32))


def _forward(static: Static, params, *rows):
  dt = jnp.dtype(static.dtype)
  n_out = 3 if static.has_update else 1
  outs = layout.call(functools.partial(_forward_kernel, static), static.plan, (*rows, params),
                     ("row",) * len(rows) + ("params",), ("row",) * n_out + ("stats",),
                     (dt,) * n_out + (jnp.float32,), dt.itemsize)
  return tuple(outs[:-1]), outs[-1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(static: Static, params, *rows):
  return _forward(static, params, *rows)[0]


def _fused_fwd(static: Static, params, *rows):
  outs, stats = _forward(static, params, *rows)
  if static.has_update:
    x, y, _ = outs
    return outs, (x, y, rows[2], stats, params)
  return outs, (rows[0], rows[1], stats, params)


def _fused_bwd(static: Static, residuals, cotangents):
  dt = jnp.dtype(static.dtype)
  *saved_rows, stats, params = residuals
  cotangents = tuple(ct.astype(dt) for ct in cotangents)
  n_out = 3 if static.has_update else 2
  outs = layout.call(functools.partial(_backward_kernel, static), static.plan,
                     (*saved_rows, stats, params, *cotangents),
                     ("row",) * len(saved_rows) + ("stats", "params") + ("row",) * len(cotangents),
                     ("row",) * n_out + ("partial",), (dt,) * n_out + (jnp.float32,), dt.itemsize)
  return (jnp.sum(outs[-1], axis=0), *outs[:-1])


_fused.defvjp(_fused_fwd, _fused_bwd)


def _run(rows_in, c, c1, norm_y, eps, platform, block_rows, chunk_rows, num_warps):
  shape, dtype = rows_in[0].shape, rows_in[0].dtype
  if any(a.shape != shape or a.dtype != dtype for a in rows_in):
    raise ValueError(f"row inputs must share shape {shape} and dtype {dtype}")
  d, rows_n = shape[-1], math.prod(shape[:-1])
  has_update = len(rows_in) == 3
  kind = rm.LAYERNORM if "bias" in norm_y else rm.RMSNORM
  plan = layout.make_plan(rows_n, d, platform, block_rows, chunk_rows, jnp.dtype(dtype).itemsize, num_warps)
  inv_c = 1.0 / jnp.asarray(c, jnp.float32) if has_update else 0.0
  params = layout.pack_params([c1, norm_y["scale"], norm_y.get("bias", 0.0), inv_c], plan)
  static = Static(plan, kind, float(eps), has_update, jnp.dtype(dtype).name)
  outs = _fused(static, params, *(layout.pad_rows(a.reshape(rows_n, d), plan) for a in rows_in))
  return tuple(layout.unpad_rows(o, plan).reshape(shape) for o in outs)


def hybrid_entry(x, y, c1, norm_y, *, eps: float, platform: str | None = None, block_rows: int | None = None,
                 chunk_rows: int | None = None, num_warps: int | None = None):
  """Fused `h = c1 * x + N_y(y)`, shaped and typed like x (`[..., d]`).

  c1: `[d]`; norm_y: `{"scale": [d]}` (RMSNorm) or `{"scale": [d], "bias": [d]}` (LayerNorm).
  """
  return _run((x, y), None, c1, norm_y, eps, platform, block_rows, chunk_rows, num_warps)[0]


def hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, *, eps: float, platform: str | None = None,
                        block_rows: int | None = None, chunk_rows: int | None = None,
                        num_warps: int | None = None):
  """Fused `x = x_prev + z/c ; y = y_prev + z ; h = c1 * x + N_y(y)` -> (x, y, h), each like x_prev."""
  return _run((x_prev, y_prev, z), c, c1, norm_y, eps, platform, block_rows, chunk_rows, num_warps)
