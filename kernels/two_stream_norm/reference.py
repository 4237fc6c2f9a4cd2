"""Pure-JAX reference (the ground truth) for the fused two-stream-norm boundaries; autodiff gives its backward.

Row arrays are `[..., d]` in the compute dtype (float32 or bfloat16); norms compute in float32 and round their
output to the compute dtype, exactly like the unfused model (`jaxpt.nn.norms`). A norm's parameters are a dict
`{"scale": [d]}` (RMSNorm) or `{"scale": [d], "bias": [d]}` (LayerNorm).

post_pre boundary (spec, "Hot path for a fused kernel"; also the mid-block boundary of hybrid_pre):
    p = xh_prev + z / c ;  xh = LN_post(p) ;  y = y_prev + z ;  h = LN_in(xh + LN_pre(y))
    (z None: p = xh_prev, y = y_prev -- the block-entry boundary of siamese_post_pre)
hybrid entry (attention input of siamese_hybrid_pre):
    h = c1 * x + N_y(y)
    update form, after the previous block's MLP output z: x = x_prev + z/c ; y = y_prev + z ; h = c1 * x + N_y(y)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def norm(params, x, eps: float):
  """RMSNorm (no "bias") or LayerNorm over the last axis, float32 math, output in x.dtype."""
  x32 = x.astype(jnp.float32)
  if "bias" in params:
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    out = centred * jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + eps)
    out = out * params["scale"].astype(jnp.float32) + params["bias"].astype(jnp.float32)
  else:
    out = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    out = out * params["scale"].astype(jnp.float32)
  return out.astype(x.dtype)


def depth_scaled(z, c):
  """z / c in z's dtype, rounded once (c float32: a bf16 1/c would scale every element by the same error)."""
  return (z.astype(jnp.float32) / jnp.asarray(c, jnp.float32)).astype(z.dtype)


def post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps: float):
  """-> (xh, y, h), each `[..., d]` in the input dtype."""
  if z is None:
    p, y = xh_prev, y_prev
  else:
    p, y = xh_prev + depth_scaled(z, c), y_prev + z
  xh = norm(post, p, eps)
  return xh, y, norm(in_norm, xh + norm(pre, y, eps), eps)


def hybrid_entry(x, y, c1, norm_y, eps: float):
  """-> h = c1 * x + N_y(y), `[..., d]` in the input dtype."""
  return c1.astype(x.dtype) * x + norm(norm_y, y, eps)


def hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, eps: float):
  """-> (x, y, h), each `[..., d]` in the input dtype."""
  x, y = x_prev + depth_scaled(z, c), y_prev + z
  return x, y, hybrid_entry(x, y, c1, norm_y, eps)
