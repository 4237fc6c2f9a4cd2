"""The one switch from the model blocks to the fused two-stream-norm kernels (`jaxpt.kernels.two_stream_norm`).

`config.kernel == "pallas"`: the siamese blocks compute each sub-layer boundary with one fused row-wise op
(Pallas kernels; interpret mode on CPU). Anything else: the blocks' unfused reference path (separate norm
modules). Row arrays are `[batch, seq, d_model]`; norm parameters are `{"scale"[, "bias"]}` dicts of `[d_model]`.

    post_pre_boundary: p = xh_prev + z/c ; xh = LN_post(p) ; y = y_prev + z ; h = LN_in(xh + LN_pre(y))
    hybrid_entry:      h = c1 * x + N_y(y)
"""

from __future__ import annotations

from jaxpt.kernels import two_stream_norm


def use_fused(config) -> bool:
  """True when the siamese blocks should call the fused kernels."""
  return config.kernel == "pallas" and config.is_siamese


def post_pre_boundary(config, xh_prev, y_prev, z, c, post, pre, in_norm):
  """-> (xh, y, h); z None is the block-entry form (p = xh_prev, y = y_prev)."""
  return two_stream_norm.post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps=config.norm_eps,
                                           impl="pallas")


def hybrid_entry(config, x, y, c1, norm_y):
  """-> h = c1 * x + N_y(y)."""
  return two_stream_norm.hybrid_entry(x, y, c1, norm_y, eps=config.norm_eps, impl="pallas")
