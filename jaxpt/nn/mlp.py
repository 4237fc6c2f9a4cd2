"""Feed-forward sub-layers: `[batch, seq, d_model] -> [batch, seq, d_model]`.

SwiGLU: W_out (silu(x W_gate) * (x W_up));  GELU: W_out gelu(x W_in), with
    gelu (tanh):        0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))
    gelu_exact (erf):   0.5 u (1 + erf(u / sqrt(2)))              (ViT/DeiT, torch.nn.GELU())
`use_bias` adds a bias to every projection (ViT: W_in, W_out with biases); `lora` adapters on W_gate, W_up / W_in
(target mlp_in) and W_out (mlp_out), `jaxpt.nn.lora`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxpt.nn.dense import Dense
from jaxpt.nn.lora import LoRA


class MLP(nn.Module):
  mlp_dim: int
  mlp_type: str = "swiglu"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_bias: bool = False
  lora: LoRA | None = None

  @nn.compact
  def __call__(self, x):
    d_model = x.shape[-1]

    def dense(features, axes, name):
      target = "mlp_out" if name == "wo" else "mlp_in"
      return Dense((features,), axes, dtype=self.dtype, param_dtype=self.param_dtype, use_bias=self.use_bias,
                   lora=None if self.lora is None else self.lora.at(target), name=name)

    if self.mlp_type == "swiglu":
      hidden = nn.silu(dense(self.mlp_dim, ("embed", "mlp"), "wi_gate")(x)) * dense(
          self.mlp_dim, ("embed", "mlp"), "wi_up")(x)
    else:
      hidden = nn.gelu(dense(self.mlp_dim, ("embed", "mlp"), "wi")(x), approximate=self.mlp_type != "gelu_exact")
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return dense(d_model, ("mlp", "embed"), "wo")(hidden)
