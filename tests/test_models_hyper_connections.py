"""The multi-stream schemes (HC, dynamic HC, mHC, mHC-lite) against the float64 NumPy statement in
`reference_model.py`: logits, gradients, the mixing matrices' constraints, and the n = 1 reduction to Pre-Norm."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.hyper_connections import HyperConnection, sinkhorn
from jaxpt.models.transformer import TransformerLM, init_params, unstack_layers
from tests import reference_model
from tests.test_models_transformer import randomise_norms, tokens_for

HC_SCHEMES = reference_model.HC_SCHEMES
TINY = ModelConfig(vocab_size=40, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=24,
                   scan_layers=False, max_seq_len=32)


def randomise_connections(params, seed=2, spread=0.5):
  """Move every connection parameter (`attn_hc`, `mlp_hc`) off its initial value, so that each enters the outputs."""
  rng = np.random.default_rng(seed)

  def move(path, leaf):
    if "_hc'" not in jax.tree_util.keystr(path):
      return leaf
    return leaf + jnp.asarray(rng.normal(0.0, spread, leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map_with_path(move, params)


def model_for(scheme, streams, seed=0, **overrides):
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, hc_streams=streams, **overrides)
  return cfg, randomise_connections(randomise_norms(init_params(cfg, jax.random.PRNGKey(seed))))


def cross_entropy(logits, tokens):
  logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def reference_cross_entropy(logits, tokens):
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)
  return -np.mean(np.take_along_axis(logp, np.asarray(tokens)[:, 1:, None], axis=-1))


@pytest.mark.parametrize("streams", [2, 4])
@pytest.mark.parametrize("scheme", HC_SCHEMES)
def test_forward_matches_plain_equations(scheme, streams):
  cfg, params = model_for(scheme, streams)
  tokens = tokens_for(cfg, seq=6)
  logits, hidden = jax.jit(lambda p: TransformerLM(cfg).apply({"params": p}, tokens, return_hidden=True))(params)
  ref_logits, ref_hidden = reference_model.forward(params, tokens, cfg)
  np.testing.assert_allclose(hidden, ref_hidden, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("scheme,streams", [("hc", 2), ("hc_dynamic", 2), ("mhc", 2), ("mhc_lite", 4)])
def test_gradients_match_the_plain_equations(scheme, streams):
  """<grad, u> of the model's loss (float32) equals the float64 central difference of the NumPy statement's loss
  along u: for each connection parameter (all its layers and sub-layers at once), and for all parameters at once.
  The gradient is compiled, under the suite's XLA flags (no backend optimisation, conftest.py): there mHC's
  Sinkhorn gave NaN gradients while it took a gradient through a max shift (0 / 0 in max's rule)."""
  cfg, params = model_for(scheme, streams, remat="full")
  tokens = tokens_for(cfg, seq=5)
  loss = lambda p: cross_entropy(TransformerLM(cfg).apply({"params": p}, tokens[:, :-1]), tokens)
  grads = jax.jit(jax.grad(loss))(params)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  grad_leaves = treedef.flatten_up_to(grads)
  reference_loss = lambda p: reference_cross_entropy(reference_model.forward(p, tokens[:, :-1], cfg)[0], tokens)
  rng = np.random.default_rng(0)
  directions = [rng.normal(size=np.shape(leaf)) for _, leaf in leaves]
  groups = {}  # one direction per kind of connection parameter (its name), over both sub-layers and layers
  for i, (path, _) in enumerate(leaves):
    if "_hc'" in jax.tree_util.keystr(path):
      groups.setdefault(jax.tree_util.keystr(path[-1:]), []).append(i)
  assert len(groups) >= 3
  eps = 1e-5
  for name, indices in list(groups.items()) + [("all parameters", list(range(len(leaves))))]:
    shifted = lambda h: jax.tree_util.tree_unflatten(treedef, [
        np.asarray(leaf, np.float64) + (h * directions[i] if i in indices else 0.0)
        for i, (_, leaf) in enumerate(leaves)])
    numeric = (reference_loss(shifted(eps)) - reference_loss(shifted(-eps))) / (2 * eps)
    analytic = sum(np.sum(np.asarray(grad_leaves[i], np.float64) * directions[i]) for i in indices)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-3, atol=2e-6, err_msg=name)


def connection_maps(scheme, streams, spread=2.0, **overrides):
  """(q, p, R) of one randomised connection on random streams [2, 3, n, 16]."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, hc_streams=streams, **overrides)
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 3, streams, cfg.d_model))
  module = HyperConnection(cfg, name="attn_hc")
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), x, 0)["params"])
  params = randomise_connections({"attn_hc": params}, spread=spread)["attn_hc"]
  return module.apply({"params": params}, x, 0)


@pytest.mark.parametrize("streams", [2, 4])
def test_mhc_lite_mixing_is_doubly_stochastic(streams):
  _, _, res = connection_maps("mhc_lite", streams)
  res = np.asarray(res, np.float64)
  assert res.min() >= 0.0 and np.ptp(res) > 0.1  # far from uniform: the check below is not trivially met
  np.testing.assert_allclose(res.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(res.sum(-2), 1.0, atol=1e-6)


def test_mhc_sinkhorn_is_doubly_stochastic_to_its_iteration_tolerance():
  """After t_max iterations the columns sum to 1 (the last step scaled them) and the rows to within the change
  one more iteration makes; the row error shrinks with t_max and reaches float32 rounding."""
  _, _, res = connection_maps("mhc", 4)
  res = np.asarray(res, np.float64)
  np.testing.assert_allclose(res.sum(-2), 1.0, atol=1e-6)
  logits = jax.random.normal(jax.random.PRNGKey(4), (5, 4, 4)) * 2.0
  row_error = lambda t: np.abs(np.asarray(sinkhorn(logits, t), np.float64).sum(-1) - 1.0).max()
  step = np.abs(np.asarray(sinkhorn(logits, 21)) - np.asarray(sinkhorn(logits, 20))).max()
  assert row_error(20) <= 4 * step + 1e-6
  assert row_error(1) > row_error(5) > row_error(20)
  assert row_error(200) < 1e-6


@pytest.mark.parametrize("iterations", [1, 20])
@pytest.mark.parametrize("far", ["row", "column"])
def test_mhc_sinkhorn_is_finite_where_a_row_or_column_lies_far_below_the_rest(far, iterations):
  """A row (or a column) of logits 200 below the others: exp of it is 0 in float32, and Sinkhorn started from
  exp(logits - max) divided it by a sum of 0 (NaN values and gradients). Values and the gradient of <S, w> equal
  the float64 statement (where exp(-200) is representable) and its central differences."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 4))
  third = np.arange(4) == 2
  logits = logits + np.where(third[:, None] if far == "row" else third[None, :], -200.0, 0.0)
  weights = rng.normal(size=logits.shape)
  value, grad = jax.jit(jax.value_and_grad(lambda a: jnp.sum(sinkhorn(a, iterations) * weights)))(
      jnp.asarray(logits, jnp.float32))
  matrix = np.asarray(sinkhorn(jnp.asarray(logits, jnp.float32), iterations))
  assert np.all(np.isfinite(matrix)) and np.all(np.isfinite(np.asarray(grad)))
  # rtol: each float32 step on a logit near -200 rounds it by up to 7.6e-6 (half its ulp), a relative error after exp
  np.testing.assert_allclose(matrix, reference_model.sinkhorn(logits, iterations), rtol=3e-5, atol=2e-6)
  reference = lambda a: np.sum(reference_model.sinkhorn(a, iterations) * weights)
  np.testing.assert_allclose(value, reference(logits), rtol=1e-5, atol=1e-6)
  direction, eps = rng.normal(size=logits.shape), 1e-5
  numeric = (reference(logits + eps * direction) - reference(logits - eps * direction)) / (2 * eps)
  np.testing.assert_allclose(np.sum(np.asarray(grad, np.float64) * direction), numeric, rtol=1e-3, atol=1e-6)


def identity_mixing(params):
  """mHC / mHC-lite connections with q = sigmoid(40) = 1 and p = 2 sigmoid(0) = 1 exactly (a = 0)."""
  def set_leaf(path, leaf):
    name = jax.tree_util.keystr(path)
    if "_hc'" in name and "'scale_" in name:
      return jnp.zeros_like(leaf)
    if "_hc'" in name and "'bias_pre'" in name:
      return jnp.full_like(leaf, 40.0)
    return leaf
  return jax.tree_util.tree_map_with_path(set_leaf, params)


@pytest.mark.parametrize("scheme", HC_SCHEMES)
def test_one_stream_with_identity_mixing_is_pre_norm(scheme):
  """n = 1: HC and dynamic HC at their initialisation, mHC and mHC-lite with q = p = 1 (R = 1 always), on the
  Pre-Norm model's parameters give its logits bit for bit."""
  pre_params = randomise_norms(init_params(TINY, jax.random.PRNGKey(0)))
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, hc_streams=1)
  hc_params = identity_mixing(init_params(cfg, jax.random.PRNGKey(1)))
  params = dict(pre_params, decoder={name: dict(layer, **pre_params["decoder"][name])
                                     for name, layer in hc_params["decoder"].items()})
  tokens = tokens_for(cfg)
  expected = TransformerLM(TINY).apply({"params": pre_params}, tokens)
  np.testing.assert_array_equal(TransformerLM(cfg).apply({"params": params}, tokens), expected)


def test_scanned_layers_equal_unrolled_layers():
  """The connection index k = 2l (+1) reaches each layer under nn.scan as under unrolled layers."""
  cfg, params = model_for("hc", 4, scan_layers=True)
  tokens = tokens_for(cfg)
  scanned = TransformerLM(dataclasses.replace(cfg, remat="dots")).apply({"params": params}, tokens)
  unrolled = TransformerLM(dataclasses.replace(cfg, scan_layers=False)).apply(
      {"params": unstack_layers(params, cfg.num_layers)}, tokens)
  np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("values, message", [
    (dict(norm_scheme="hc", hc_streams=0), "model.hc_streams=0: must be a positive integer"),
    (dict(norm_scheme="mhc_lite", hc_streams=6), "model.hc_streams=6: mhc_lite mixes all hc_streams! permutation"),
    (dict(norm_scheme="mhc", hc_sinkhorn_iterations=0), "model.hc_sinkhorn_iterations=0: must be a positive"),
])
def test_impossible_multi_stream_configs_name_the_field(values, message):
  with pytest.raises(ConfigError, match=message):
    from_section(ModelConfig, values, "model")
