"""Feed-forward sub-layers: `[batch, seq, d_model] -> [batch, seq, d_model]`.

SwiGLU: W_out (silu(x W_gate) * (x W_up));  GELU: W_out gelu(x W_in), with
    gelu (tanh):        0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))
    gelu_exact (erf):   0.5 u (1 + erf(u / sqrt(2)))              (ViT/DeiT, torch.nn.GELU())
`use_bias` adds a bias to every projection (ViT: W_in, W_out with biases); `lora` adapters on W_gate, W_up / W_in
(target mlp_in) and W_out (mlp_out), `jaxpt.nn.lora`. SwiGLU's product is `swiglu`, whose backward keeps only its
inputs unless the block is rematerialized (the MoE experts use it too).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.nn.dense import Dense
from jaxpt.nn.lora import LoRA


def swiglu(gate, up, recompute: bool = True):
  """silu(gate) * up = gate sigmoid(gate) up, elementwise (any equal shapes, e.g. [batch, seq, mlp_dim]).

  `recompute`: checkpointed, so that the backward keeps gate and up only and recomputes the rest, where JAX's
  derivative of the product would also keep silu(gate) and sigmoid(gate). The train step of
  `benchmarks/train_step.py` (d512 / 8 layers, batch 8 x 256) peaks 7% lower unrolled in float32 and 18% lower
  scanned in bfloat16 (`benchmarks/results_swiglu_memory_cpu.json`) for the same gradients. Off under a block
  remat, which recomputes the whole block anyway (there it would add one [tokens, mlp_dim] array to the peak)."""
  return (_recomputed_swiglu if recompute else _swiglu)(gate, up)


def _swiglu(gate, up):
  return nn.silu(gate) * up


_recomputed_swiglu = jax.checkpoint(_swiglu)


class MLP(nn.Module):
  mlp_dim: int
  mlp_type: str = "swiglu"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_bias: bool = False
  lora: LoRA | None = None
  recompute_hidden: bool = True  # `swiglu`'s `recompute`; the blocks turn it off under ModelConfig.remat

  @nn.compact
  def __call__(self, x):
    d_model = x.shape[-1]

    def dense(features, axes, name):
      target = "mlp_out" if name == "wo" else "mlp_in"
      return Dense((features,), axes, dtype=self.dtype, param_dtype=self.param_dtype, use_bias=self.use_bias,
                   lora=None if self.lora is None else self.lora.at(target), name=name)

    if self.mlp_type == "swiglu":
      hidden = swiglu(dense(self.mlp_dim, ("embed", "mlp"), "wi_gate")(x),
                      dense(self.mlp_dim, ("embed", "mlp"), "wi_up")(x), self.recompute_hidden)
    else:
      hidden = nn.gelu(dense(self.mlp_dim, ("embed", "mlp"), "wi")(x), approximate=self.mlp_type != "gelu_exact")
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return dense(d_model, ("mlp", "embed"), "wo")(hidden)
