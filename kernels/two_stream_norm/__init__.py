"""Fused two-stream-norm boundaries of SiameseNorm (spec: shared/specs/siamesenorm.md, "Hot path").

`post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps=..., impl=...)` -> (xh, y, h)
    p = xh_prev + z/c ; xh = LN_post(p) ; y = y_prev + z ; h = LN_in(xh + LN_pre(y))
`hybrid_entry(x, y, c1, norm_y, eps=..., impl=...)` -> h = c1 * x + N_y(y)
`hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, eps=..., impl=...)` -> (x, y, h)
    x = x_prev + z/c ; y = y_prev + z ; h = c1 * x + N_y(y)    (after the previous block's MLP output z)

`impl="pallas"` runs the fused Pallas kernels (Mosaic on TPU, Triton on GPU, interpret mode elsewhere);
`impl="reference"` the pure-JAX ground truth. Row arrays are `[..., d]`, float32 or bfloat16.
"""

from __future__ import annotations

from . import entry, post_pre, reference

IMPLS = ("reference", "pallas")


def _check(impl: str) -> None:
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r}: must be one of {', '.join(IMPLS)}")


def post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, *, eps: float, impl: str = "pallas", **tiling):
  _check(impl)
  if impl == "reference":
    return reference.post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps)
  return post_pre.post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps=eps, **tiling)


def hybrid_entry(x, y, c1, norm_y, *, eps: float, impl: str = "pallas", **tiling):
  _check(impl)
  if impl == "reference":
    return reference.hybrid_entry(x, y, c1, norm_y, eps)
  return entry.hybrid_entry(x, y, c1, norm_y, eps=eps, **tiling)


def hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, *, eps: float, impl: str = "pallas", **tiling):
  _check(impl)
  if impl == "reference":
    return reference.hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, eps)
  return entry.hybrid_entry_update(x_prev, y_prev, z, c, c1, norm_y, eps=eps, **tiling)


__all__ = ["IMPLS", "hybrid_entry", "hybrid_entry_update", "post_pre_boundary", "reference"]
