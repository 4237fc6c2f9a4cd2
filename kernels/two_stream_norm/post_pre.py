"""Fused post_pre boundary: Pallas forward/backward kernels tied by `jax.custom_vjp`.

Row arrays `[rows, d]` (any leading shape is flattened), float32 or bfloat16, float32 math inside.
Forward (reads xh_prev, y_prev, z once; writes xh, y, h once, plus row statistics `[rows, 8]`):
    p = xh_prev + z/c ;  xh = LN_post(p) ;  y = y_prev + z ;  h = LN_in(xh + LN_pre(y))
Backward (spec): with dxh, dy, dh the cotangents of xh, y, h
    ds = LN_in'(dh) ; dxh_tot = dxh + ds ; dy_tot = dy + LN_pre'(ds)
    dp = LN_post'(dxh_tot) ; dz = dy_tot + dp/c ; dxh_prev = dp ; dy_prev = dy_tot
    d(1/c) = sum(dp * z), and the three norms' weight/bias gradients, as per-block partial sums `[grid, 8, d]`
    reduced afterwards.
The backward re-reads xh_prev, z and the saved y and recomputes every xhat from the saved statistics.
Without z (the block-entry boundary) p = xh_prev, y = y_prev: no y output, no dy input, no dz.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from . import layout
from . import rowmath as rm

# packed parameter rows
W_POST, B_POST, W_PRE, B_PRE, W_IN, B_IN, INV_C = range(7)
# statistics columns
M_POST, M_PRE, M_IN, R_POST, R_PRE, R_IN = range(6)


@dataclasses.dataclass(frozen=True)
class Static:
  plan: layout.Plan
  kind: str
  eps: float
  has_update: bool
  dtype: str


def _norm_fwd(static, x, prm, w_row, mask):
  return rm.norm_forward(x, rm.param_row(prm, w_row), rm.param_row(prm, w_row + 1), static.kind, static.eps,
                         static.plan.d, mask)


def _forward_kernel(static: Static, *refs):
  plan, dtype = static.plan, jnp.dtype(static.dtype)
  if static.has_update:
    xp_ref, yp_ref, z_ref, prm_ref, xh_ref, y_ref, h_ref, st_ref = refs
  else:
    (xp_ref, yp_ref, prm_ref, xh_ref, h_ref, st_ref), z_ref, y_ref = refs, None, None
  prm = prm_ref[...]
  mask = rm.column_mask((1, plan.d_pad), plan.d, plan.d_pad)

  def body(rows, carry):
    p = xp_ref[rows, :].astype(jnp.float32)
    y = yp_ref[rows, :].astype(jnp.float32)
    if static.has_update:
      z = z_ref[rows, :].astype(jnp.float32)
      p = p + z * rm.param_row(prm, INV_C)
      y_out = (y + z).astype(dtype)
      y_ref[rows, :] = y_out
      y = y_out.astype(jnp.float32)  # the backward recomputes from the stored y
    xh, m_post, r_post = _norm_fwd(static, p, prm, W_POST, mask)
    yn, m_pre, r_pre = _norm_fwd(static, y, prm, W_PRE, mask)
    h, m_in, r_in = _norm_fwd(static, xh + yn, prm, W_IN, mask)
    xh_ref[rows, :] = xh.astype(dtype)
    h_ref[rows, :] = h.astype(dtype)
    st_ref[rows, :] = rm.pack_cols([m_post, m_pre, m_in, r_post, r_pre, r_in], layout.SLOTS)
    return carry

  layout.chunk_loop(plan, body, 0)


def _backward_kernel(static: Static, *refs):
  plan, dtype, kind, d = static.plan, jnp.dtype(static.dtype), static.kind, static.plan.d
  if static.has_update:
    xp_ref, z_ref, y_ref, st_ref, prm_ref, dxh_ref, dy_ref, dh_ref, dxp_ref, dyp_ref, dz_ref, part_ref = refs
  else:
    xp_ref, y_ref, st_ref, prm_ref, dxh_ref, dh_ref, dxp_ref, dyp_ref, part_ref = refs
  prm = prm_ref[...]
  w = lambda k: rm.param_row(prm, k)
  mask = rm.column_mask((1, plan.d_pad), d, plan.d_pad)

  def body(rows, acc):
    st = st_ref[rows, :]
    s = lambda k: rm.stat_col(st, k)
    p = xp_ref[rows, :].astype(jnp.float32)
    if static.has_update:
      z = z_ref[rows, :].astype(jnp.float32)
      p = p + z * w(INV_C)
    y = y_ref[rows, :].astype(jnp.float32)
    xhat_post = rm.normalised(p, s(M_POST), s(R_POST), kind, mask)
    xhat_pre = rm.normalised(y, s(M_PRE), s(R_PRE), kind, mask)
    xh = xhat_post * w(W_POST) + w(B_POST)
    yn = xhat_pre * w(W_PRE) + w(B_PRE)
    xhat_in = rm.normalised(xh + yn, s(M_IN), s(R_IN), kind, mask)

    dh = dh_ref[rows, :].astype(jnp.float32)
    ds, dw_in, db_in = rm.norm_backward(dh, xhat_in, s(R_IN), w(W_IN), kind, d, mask)
    dxh_tot = dxh_ref[rows, :].astype(jnp.float32) + ds
    dy_tot, dw_pre, db_pre = rm.norm_backward(ds, xhat_pre, s(R_PRE), w(W_PRE), kind, d, mask)
    dp, dw_post, db_post = rm.norm_backward(dxh_tot, xhat_post, s(R_POST), w(W_POST), kind, d, mask)
    partials = [dw_post, db_post, dw_pre, db_pre, dw_in, db_in]
    if static.has_update:
      dy_tot = dy_tot + dy_ref[rows, :].astype(jnp.float32)
      dz_ref[rows, :] = (dy_tot + dp * w(INV_C)).astype(dtype)
      partials.append(jnp.sum(dp * z, axis=0, keepdims=True))
    dxp_ref[rows, :] = dp.astype(dtype)
    dyp_ref[rows, :] = dy_tot.astype(dtype)
    return acc + rm.pack_rows(partials, layout.SLOTS, plan.d_pad)

  part_ref[...] = layout.chunk_loop(plan, body, jnp.zeros((layout.SLOTS, plan.d_pad), jnp.float32))


def _forward(static: Static, params, *rows):
  itemsize = jnp.dtype(static.dtype).itemsize
  dt = jnp.dtype(static.dtype)
  if static.has_update:
    roles, out_roles, out_dtypes = ("row", "row", "row", "params"), ("row", "row", "row", "stats"), (dt,) * 3
  else:
    roles, out_roles, out_dtypes = ("row", "row", "params"), ("row", "row", "stats"), (dt,) * 2
  outs = layout.call(functools.partial(_forward_kernel, static), static.plan, (*rows, params), roles, out_roles,
                     out_dtypes + (jnp.float32,), itemsize)
  return tuple(outs[:-1]), outs[-1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(static: Static, params, *rows):
  return _forward(static, params, *rows)[0]


def _fused_fwd(static: Static, params, *rows):
  outs, stats = _forward(static, params, *rows)
  if static.has_update:
    xp, _, z = rows
    residuals = (xp, z, outs[1], stats, params)
  else:
    residuals = (rows[0], rows[1], stats, params)
  return outs, residuals


def _fused_bwd(static: Static, residuals, cotangents):
  plan, dt = static.plan, jnp.dtype(static.dtype)
  cotangents = tuple(ct.astype(dt) for ct in cotangents)
  if static.has_update:
    dxh, dy, dh = cotangents
    *saved, params = residuals
    inputs = (*saved, params, dxh, dy, dh)
    roles = ("row", "row", "row", "stats", "params", "row", "row", "row")
    out_roles = ("row", "row", "row", "partial")
  else:
    dxh, dh = cotangents
    *saved, params = residuals
    inputs = (*saved, params, dxh, dh)
    roles = ("row", "row", "stats", "params", "row", "row")
    out_roles = ("row", "row", "partial")
  n_rows_out = len(out_roles) - 1
  outs = layout.call(functools.partial(_backward_kernel, static), plan, inputs, roles, out_roles,
                     (dt,) * n_rows_out + (jnp.float32,), dt.itemsize)
  d_params = jnp.sum(outs[-1], axis=0)
  d_rows = outs[:-1]
  if static.has_update:
    dxp, dyp, dz = d_rows
    return (d_params, dxp, dyp, dz)
  return (d_params, *d_rows)


_fused.defvjp(_fused_fwd, _fused_bwd)


def post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, *, eps: float, platform: str | None = None,
                      block_rows: int | None = None, chunk_rows: int | None = None, num_warps: int | None = None):
  """Fused boundary -> (xh, y, h), each shaped and typed like xh_prev (`[..., d]`).

  post/pre/in_norm: `{"scale": [d]}` (RMSNorm) or `{"scale": [d], "bias": [d]}` (LayerNorm), all the same kind.
  z None: block-entry form (p = xh_prev, y = y_prev returned as is). c: a scalar, possibly traced.
  """
  shape, dtype = xh_prev.shape, xh_prev.dtype
  d = shape[-1]
  rows_n = math.prod(shape[:-1])
  kinds = {"bias" in n for n in (post, pre, in_norm)}
  if len(kinds) != 1:
    raise ValueError("post, pre and in_norm must be the same norm kind")
  kind = rm.LAYERNORM if kinds.pop() else rm.RMSNORM
  arrays = (xh_prev, y_prev) if z is None else (xh_prev, y_prev, z)
  if any(a.shape != shape or a.dtype != dtype for a in arrays):
    raise ValueError(f"row inputs must share shape {shape} and dtype {dtype}")
  plan = layout.make_plan(rows_n, d, platform, block_rows, chunk_rows, jnp.dtype(dtype).itemsize, num_warps)
  bias = lambda n: n.get("bias", 0.0) if kind == rm.LAYERNORM else 0.0
  inv_c = 1.0 if z is None else 1.0 / jnp.asarray(c, jnp.float32)
  params = layout.pack_params(
      [post["scale"], bias(post), pre["scale"], bias(pre), in_norm["scale"], bias(in_norm), inv_c], plan)
  static = Static(plan, kind, float(eps), z is not None, jnp.dtype(dtype).name)
  rows = [layout.pad_rows(a.reshape(rows_n, d), plan) for a in arrays]
  outs = [layout.unpad_rows(o, plan).reshape(shape) for o in _fused(static, params, *rows)]
  if z is None:
    xh, h = outs
    return xh, y_prev, h
  return tuple(outs)
