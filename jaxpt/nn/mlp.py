"""Feed-forward sub-layers: `[batch, seq, d_model] -> [batch, seq, d_model]`.

SwiGLU: W_out (silu(x W_gate) * (x W_up));  GELU: W_out gelu(x W_in).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxpt.nn.dense import Dense


class MLP(nn.Module):
  mlp_dim: int
  mlp_type: str = "swiglu"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    d_model = x.shape[-1]

    def dense(features, axes, name):
      return Dense((features,), axes, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

    if self.mlp_type == "swiglu":
      hidden = nn.silu(dense(self.mlp_dim, ("embed", "mlp"), "wi_gate")(x)) * dense(
          self.mlp_dim, ("embed", "mlp"), "wi_up")(x)
    else:
      hidden = nn.gelu(dense(self.mlp_dim, ("embed", "mlp"), "wi")(x))
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return dense(d_model, ("mlp", "embed"), "wo")(hidden)
