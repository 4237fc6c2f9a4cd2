"""The routed MoE MLP against a float64 NumPy loop over each token's chosen experts, its auxiliary losses against
their formulas, and the way those losses reach the LM training loss."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.nn.moe import MoE, aux_losses
from jaxpt.trainers.lm import make_lm_loss_fn
from tests import reference_model

EXPERTS, TOP_K, D_MODEL, MLP_DIM = 4, 2, 16, 24


def plain_moe(p, x, mlp_type, capacity_factor):
  """y_t = sum over t's top-k experts e (kept under the capacity) of g_te MLP_e(x_t), one token at a time."""
  tokens = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  p = reference_model.as64(p)
  logits = tokens @ p["router"]["kernel"]
  probs = reference_model.softmax(logits)
  chosen = np.argsort(-probs, axis=-1)[:, :TOP_K]  # [T, k], best first
  kept = np.ones(chosen.shape, bool)
  if capacity_factor > 0:  # first choices of all tokens before second choices, token order within a choice
    capacity = int(np.ceil(capacity_factor * len(tokens) * TOP_K / EXPERTS))
    taken = np.zeros(EXPERTS, int)
    for j in range(TOP_K):
      for t in range(len(tokens)):
        kept[t, j] = taken[chosen[t, j]] < capacity
        taken[chosen[t, j]] += 1
  cfg = ModelConfig(mlp_type=mlp_type)
  out = np.zeros_like(tokens)
  for t in range(len(tokens)):
    gates = probs[t, chosen[t]] / probs[t, chosen[t]].sum()
    for j, e in enumerate(chosen[t]):
      if kept[t, j]:
        expert = {name: {"kernel": p[name][e]} for name in ("wi_gate", "wi_up", "wi", "wo") if name in p}
        out[t] += gates[j] * reference_model.mlp(expert, tokens[t][None], cfg)[0]
  return out.reshape(x.shape), logits, probs, chosen


def moe_and_inputs(mlp_type, capacity_factor, seed=0):
  module = MoE(EXPERTS, TOP_K, MLP_DIM, mlp_type, capacity_factor)
  x = jax.random.normal(jax.random.PRNGKey(seed), (2, 6, D_MODEL))
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(1), x)["params"])
  params["router"]["kernel"] = params["router"]["kernel"] * 4.0  # spread the routing over the experts
  return module, params, x


@pytest.mark.parametrize("mlp_type,capacity_factor", [("swiglu", 0.0), ("gelu", 0.0), ("swiglu", EXPERTS / TOP_K),
                                                      ("swiglu", 0.5)])
def test_routed_output_equals_a_dense_loop_over_the_chosen_experts(mlp_type, capacity_factor):
  """Dropless (ragged_dot), capacity with room for every assignment, and capacity 0.5 (some dropped)."""
  module, params, x = moe_and_inputs(mlp_type, capacity_factor)
  out, state = module.apply({"params": params}, x, mutable=["losses"])
  want, logits, probs, chosen = plain_moe(params, x, mlp_type, capacity_factor)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  assert len(np.unique(chosen)) == EXPERTS  # every expert is used: the loop above covers each group

  fraction = np.bincount(chosen.reshape(-1), minlength=EXPERTS) / chosen.size
  balance = EXPERTS * np.sum(fraction * probs.mean(0))
  lse = np.log(np.exp(logits).sum(-1))
  np.testing.assert_allclose(state["losses"]["moe_load_balance"][0], balance, rtol=1e-5)
  np.testing.assert_allclose(state["losses"]["moe_router_z"][0], np.mean(lse ** 2), rtol=1e-5)


def test_dropping_changes_the_output_and_dropless_gradients_match_capacity_ones():
  """With room for every assignment the capacity path is the dropless one, gradients included; at 0.5 it is not."""
  module, params, x = moe_and_inputs("swiglu", 0.0)
  room = MoE(EXPERTS, TOP_K, MLP_DIM, "swiglu", EXPERTS / TOP_K)
  grads = lambda m: jax.grad(lambda p: jnp.sum(jnp.sin(m.apply({"params": p}, x))))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads(module), grads(room))
  tight = MoE(EXPERTS, TOP_K, MLP_DIM, "swiglu", 0.5)
  assert not np.allclose(tight.apply({"params": params}, x), module.apply({"params": params}, x))


TINY = ModelConfig(vocab_size=40, d_model=D_MODEL, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=MLP_DIM,
                   max_seq_len=32, num_experts=EXPERTS, experts_per_token=TOP_K, moe_load_balance_coef=0.5,
                   moe_router_z_coef=0.25)


@pytest.mark.parametrize("scheme,scan", [("pre", True), ("hc", False)])
def test_aux_losses_reach_the_lm_loss(scheme, scan):
  """LM loss = cross-entropy + 0.5 mean_l balance_l + 0.25 mean_l z_l, under nn.scan (stacked) or unrolled."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, hc_streams=2, scan_layers=scan)
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, cfg.vocab_size)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": jnp.ones((2, 6))}
  loss, metrics = jax.jit(make_lm_loss_fn(TransformerLM(cfg), z_loss=0.0))(params, batch, jax.random.PRNGKey(0))
  logits, state = jax.jit(lambda p, t: TransformerLM(cfg).apply({"params": p}, t, mutable=["losses"]))(
      params, batch["inputs"])
  per_layer = {name: np.concatenate([np.ravel(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(
      state["losses"]) if name in jax.tree_util.keystr(path)]) for name in ("moe_load_balance", "moe_router_z")}
  assert all(len(values) == cfg.num_layers for values in per_layer.values())
  logp = jax.nn.log_softmax(logits)
  nll = -np.mean(np.take_along_axis(np.asarray(logp), np.asarray(batch["targets"])[..., None], axis=-1))
  want = nll + 0.5 * per_layer["moe_load_balance"].mean() + 0.25 * per_layer["moe_router_z"].mean()
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(metrics["moe_router_z"], per_layer["moe_router_z"].mean(), rtol=1e-5)
  assert set(aux_losses({})) == {"moe_load_balance", "moe_router_z"}


@pytest.mark.parametrize("values, message", [
    (dict(num_experts=-1), "model.num_experts=-1: must be a non-negative integer"),
    (dict(num_experts=4, experts_per_token=5), r"model.experts_per_token=5: must be in \[1, model.num_experts=4\]"),
    (dict(num_experts=4, moe_capacity_factor=-1.0), "model.moe_capacity_factor=-1.0: must be non-negative"),
])
def test_impossible_moe_configs_name_the_field(values, message):
  with pytest.raises(ConfigError, match=message):
    from_section(ModelConfig, values, "model")
