"""The one switch from the model blocks to the fused two-stream-norm kernels (`jaxpt.kernels.two_stream_norm`).

`config.kernel == "pallas"`: the siamese blocks compute each sub-layer boundary with one fused row-wise op
(Pallas kernels; interpret mode on CPU). Anything else: the blocks' unfused reference path (separate norm
modules). Row arrays are `[batch, seq, d_model]`; norm parameters are `{"scale"[, "bias"]}` dicts of `[d_model]`.
The kernels are built for the default backend unless traced under `kernel_platform(...)` (exporting for another
platform: `jax.export` from a CPU host for TPU or GPU).

    post_pre_boundary: p = xh_prev + z/c ; xh = LN_post(p) ; y = y_prev + z ; h = LN_in(xh + LN_pre(y))
    hybrid_entry:      h = c1 * x + N_y(y)
"""

from __future__ import annotations

import jax

from jaxpt.kernels import two_stream_norm

PLATFORMS = ("tpu", "gpu", "cuda", "rocm", "cpu")
# part of JAX's trace context: a jitted function traced under another platform is traced again, not reused
_platform = jax.make_user_context(default_value=None)


def kernel_platform(platform: str | None):
  """Context: the fused kernels traced inside it are built for `platform` (one of PLATFORMS; "cpu": interpret mode)
  instead of the default backend, e.g. `with kernel_platform("tpu"): jax.export.export(step, platforms=["tpu"])`.
  None: the default backend."""
  if platform is not None and platform not in PLATFORMS:
    raise ValueError(f"kernel_platform({platform!r}): must be one of {', '.join(PLATFORMS)} or None")
  return _platform(platform)


def use_fused(config) -> bool:
  """True when the siamese blocks should call the fused kernels."""
  return config.kernel == "pallas" and config.is_siamese


def post_pre_boundary(config, xh_prev, y_prev, z, c, post, pre, in_norm):
  """-> (xh, y, h); z None is the block-entry form (p = xh_prev, y = y_prev)."""
  return two_stream_norm.post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, eps=config.norm_eps,
                                           impl="pallas", platform=_platform.value)


def hybrid_entry(config, x, y, c1, norm_y):
  """-> h = c1 * x + N_y(y)."""
  return two_stream_norm.hybrid_entry(x, y, c1, norm_y, eps=config.norm_eps, impl="pallas",
                                      platform=_platform.value)
