"""Projection heads over pooled hidden states: `[N, H] -> [N, D]` (CLIPO's contrastive head).

The official `ContrastiveHead` (github Qwen-Applications/CLIPO @ 13c5fd6, `verl/trainer/ppo/ray_trainer.py`:79-103,
built at :1013-1017 with its default bias=False):
`linear`: z = x W, W `[H, D]` (the spec's z = W x with W in R^{D x H}, stored transposed).
`mlp`:    z = relu(x W1) W2, W1 `[H, hidden]` (hidden = H unless given, as :92), W2 `[hidden, D]`.
No biases. Every kernel starts as torch.nn.Linear's default, W ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
(kaiming_uniform with a = sqrt(5); std 1/sqrt(3 fan_in), not the 1/sqrt(fan_in) of `jaxpt.nn.dense`).
Parameters and compute are float32 whatever the input dtype. The output is NOT normalised (the loss normalises, as
the official forward does at :102). Logical axis names: `embed` (input width), `clipo_hidden`, `clipo_proj` (no
sharding rule names the last two, so they stay whole).
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from jaxpt.nn.dense import matmul

HEAD_KINDS = ("linear", "mlp")

# torch.nn.Linear's default weight init: U(-b, b) with b = sqrt(3 * (1/3) / fan_in) = 1/sqrt(fan_in)
torch_linear_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class _Linear(nn.Module):
  """x `[..., in]` -> x W `[..., features]`, W float32 `[in, features]` (torch_linear_init), no bias."""

  features: int
  axes: tuple[str, str]

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.with_logical_partitioning(torch_linear_init, self.axes),
                        (x.shape[-1], self.features), jnp.float32)
    return matmul(x.reshape(-1, x.shape[-1]), kernel).reshape(x.shape[:-1] + (self.features,))


class ProjectionHead(nn.Module):
  """x `[N, H]` -> z `[N, out_dim]` (float32); `kind` in HEAD_KINDS."""

  out_dim: int = 512
  kind: str = "linear"
  hidden_dim: Optional[int] = None

  @nn.compact
  def __call__(self, x):
    if self.kind not in HEAD_KINDS:
      raise ValueError(f"projection head kind must be one of {', '.join(HEAD_KINDS)}, got {self.kind!r}")
    x = jnp.asarray(x, jnp.float32)
    if self.kind == "linear":
      return _Linear(self.out_dim, ("embed", "clipo_proj"), name="proj")(x)
    h = nn.relu(_Linear(self.hidden_dim or x.shape[-1], ("embed", "clipo_hidden"), name="fc1")(x))
    return _Linear(self.out_dim, ("clipo_hidden", "clipo_proj"), name="fc2")(h)
