"""Top-k routed mixture-of-experts MLP: `[batch, seq, d_model] -> [batch, seq, d_model]`.

For the T = batch * seq tokens x_t, E experts (each an MLP of `jaxpt.nn.mlp`'s form, weights stacked on a leading
`expert` logical axis) and k experts per token:

    z_t = x_t W_router                       router logits [T, E], float32
    p_t = softmax(z_t)                        router probabilities
    S_t = top-k(p_t)                          the k chosen experts
    g_te = p_te / sum_{e' in S_t} p_te'       gates renormalised over the chosen experts (Mixtral's convention:
                                              the same as a softmax over the chosen logits)
    y_t = sum_{e in S_t} g_te MLP_e(x_t)

Two ways to compute y (the same result when nothing is dropped):
- dropless (`capacity_factor = 0`): the T k (token, expert) assignments are sorted by expert and each expert's
  contiguous group goes through `jax.lax.ragged_dot` (group sizes = tokens per expert); nothing is dropped.
- capacity (`capacity_factor > 0`): each expert takes at most C = ceil(capacity_factor T k / E) assignments, first
  choices of all tokens first (then second choices, ...; token order within a choice), through dense
  dispatch / combine einsums over [T, E, C] (GShard), which shard along `expert`. A dropped assignment adds
  nothing (its token keeps the other experts' gated outputs; the gates are not renormalised again).

Auxiliary losses, sown into the `losses` collection (one value per MoE layer; `aux_losses` averages them):
    moe_load_balance = E sum_e f_e P_e    f_e = (assignments to e) / (T k),  P_e = mean_t p_te   (Switch / GShard;
                                          1 under uniform routing)
    moe_router_z     = mean_t (logsumexp_e z_te)^2                                              (ST-MoE z-loss)
Every token counts (padding included).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.nn.dense import Dense
from jaxpt.nn.mlp import swiglu

AUX_LOSSES = ("moe_load_balance", "moe_router_z")  # names sown into the `losses` collection


class MoE(nn.Module):
  num_experts: int
  experts_per_token: int
  mlp_dim: int
  mlp_type: str = "swiglu"
  capacity_factor: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  recompute_hidden: bool = True  # `jaxpt.nn.mlp.swiglu`'s `recompute`; off under ModelConfig.remat

  @nn.compact
  def __call__(self, x):
    batch, seq, d_model = x.shape
    tokens = x.reshape(batch * seq, d_model)
    logits = Dense((self.num_experts,), ("embed", None), dtype=jnp.float32, param_dtype=self.param_dtype,
                   name="router")(tokens.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    top_probs, experts = jax.lax.top_k(probs, self.experts_per_token)  # [T, k]
    gates = top_probs / jnp.sum(top_probs, axis=-1, keepdims=True)
    self.sow_aux_losses(logits, probs, experts)
    if self.capacity_factor > 0:
      out = self.capacity_experts(tokens, experts, gates)
    else:
      out = self.dropless_experts(tokens, experts, gates)
    return out.reshape(batch, seq, d_model).astype(self.dtype)

  def sow_aux_losses(self, logits, probs, experts):
    assigned = jax.nn.one_hot(experts, self.num_experts, dtype=jnp.float32).sum(axis=1)  # [T, E]
    fraction = jnp.mean(assigned, axis=0) / self.experts_per_token
    self.sow("losses", "moe_load_balance", self.num_experts * jnp.sum(fraction * jnp.mean(probs, axis=0)))
    self.sow("losses", "moe_router_z", jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1))))

  def expert_weights(self, d_model: int) -> dict[str, jax.Array]:
    """The experts' MLP kernels, [E, d_model, mlp_dim] in and [E, mlp_dim, d_model] out, in the compute dtype."""
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2)

    def kernel(name, shape, axes):
      return self.param(name, nn.with_logical_partitioning(init, axes), (self.num_experts,) + shape,
                        self.param_dtype).astype(self.dtype)

    names = ("wi_gate", "wi_up") if self.mlp_type == "swiglu" else ("wi",)
    weights = {name: kernel(name, (d_model, self.mlp_dim), ("expert", "embed", "mlp")) for name in names}
    weights["wo"] = kernel("wo", (self.mlp_dim, d_model), ("expert", "mlp", "embed"))
    return weights

  def hidden(self, weights, matmul):
    """The experts' hidden activations from `matmul(name)` = tokens times kernel `name`."""
    if self.mlp_type == "swiglu":
      return swiglu(matmul("wi_gate"), matmul("wi_up"), self.recompute_hidden)
    return nn.gelu(matmul("wi"), approximate=self.mlp_type != "gelu_exact")

  def dropless_experts(self, tokens, experts, gates):
    """Assignments sorted by expert, each expert's group through ragged_dot, unsorted and gated: [T, d_model]."""
    num_tokens, d_model = tokens.shape
    k = self.experts_per_token
    weights = self.expert_weights(d_model)
    flat_experts = experts.reshape(-1)  # assignment a = t k + j
    order = jnp.argsort(flat_experts, stable=True)
    sorted_tokens = tokens.astype(self.dtype)[order // k]  # [T k, d_model]
    group_sizes = jnp.bincount(flat_experts, length=self.num_experts).astype(jnp.int32)
    ragged = lambda lhs, name: jax.lax.ragged_dot(lhs, weights[name], group_sizes)
    hidden = self.hidden(weights, lambda name: ragged(sorted_tokens, name))
    out = ragged(hidden.astype(self.dtype), "wo")[jnp.argsort(order)].reshape(num_tokens, k, d_model)
    return jnp.einsum("tkd,tk->td", out.astype(jnp.float32), gates)

  def capacity_experts(self, tokens, experts, gates):
    """At most C assignments per expert (first choices first), dispatched and combined with einsums."""
    num_tokens, d_model = tokens.shape
    k, num_experts = self.experts_per_token, self.num_experts
    capacity = math.ceil(self.capacity_factor * num_tokens * k / num_experts)
    weights = self.expert_weights(d_model)
    choice = jax.nn.one_hot(experts.T, num_experts, dtype=jnp.int32)  # [k, T, E], choice-major order
    position = (jnp.cumsum(choice.reshape(k * num_tokens, num_experts), axis=0).reshape(choice.shape) - 1) * choice
    kept = choice * (position < capacity)
    slots = jax.nn.one_hot(position, capacity, dtype=jnp.float32) * kept[..., None]  # [k, T, E, C]
    dispatch = jnp.sum(slots, axis=0)  # [T, E, C]
    combine = jnp.einsum("ktec,tk->tec", slots, gates)
    expert_in = jnp.einsum("tec,td->ecd", dispatch.astype(self.dtype), tokens.astype(self.dtype))
    expert_in = nn.with_logical_constraint(expert_in, ("expert", None, "embed"))
    hidden = self.hidden(weights, lambda name: jnp.einsum("ecd,edf->ecf", expert_in, weights[name]))
    expert_out = jnp.einsum("ecf,efd->ecd", hidden.astype(self.dtype), weights["wo"])
    return jnp.einsum("tec,ecd->td", combine, expert_out.astype(jnp.float32))


def aux_losses(losses: Any) -> dict[str, jax.Array]:
  """{name: mean over the MoE layers} of the `losses` collection that `model.apply(..., mutable=["losses"])`
  returned (each layer's sown value; stacked [layers] under nn.scan). Names missing from it are 0."""
  values: dict[str, list[jax.Array]] = {name: [] for name in AUX_LOSSES}
  for path, leaf in jax.tree_util.tree_flatten_with_path(losses)[0]:
    names = [getattr(key, "key", None) for key in path]
    for name in AUX_LOSSES:
      if name in names:
        values[name].append(jnp.reshape(leaf, (-1,)))
  return {name: jnp.mean(jnp.concatenate(found)) if found else jnp.zeros((), jnp.float32)
          for name, found in values.items()}
