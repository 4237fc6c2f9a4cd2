"""The transformer family against the plain NumPy re-statement in `reference_model.py`."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.nn import attention
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import DecoderStack, TransformerLM, init_params
from tests import reference_model

SCHEMES = reference_model.SCHEMES
TINY = ModelConfig(vocab_size=50, d_model=16, num_layers=3, num_heads=4, num_kv_heads=2, mlp_dim=24,
                   scan_layers=False, max_seq_len=64)
# What Hugging Face checkpoints bring (jaxpt.models.hf): q/k/v and output biases, Llama-3 RoPE scaling (at
# head_dim 8 the bands L/4 = 16 and L/1 = 64 put one frequency in each branch), head_dim != d_model / heads.
HF_OPTIONS = dict(qkv_bias=True, attn_out_bias=True, rope_scaling="llama3", rope_scaling_factor=4.0,
                  rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=64, head_dim=8,
                  qk_norm=True, tie_embeddings=False)


randomise_norms = reference_model.randomise_norms  # tests/test_rl_sampler.py imports it from here


def tokens_for(cfg, batch=2, seq=7, seed=0):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, seq), 0, cfg.vocab_size)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("variant", ["rms_swiglu_tied", "ln_gelu_untied_qknorm", "hf_options"])
def test_forward_matches_plain_equations(scheme, variant):
  cfg = dataclasses.replace(TINY, norm_scheme=scheme)
  if variant == "ln_gelu_untied_qknorm":
    cfg = dataclasses.replace(cfg, norm_type="layernorm", mlp_type="gelu", tie_embeddings=False, qk_norm=True)
  if variant == "hf_options":
    cfg = dataclasses.replace(cfg, **HF_OPTIONS)
  params = randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))
  tokens = tokens_for(cfg)
  logits, hidden = TransformerLM(cfg).apply({"params": params}, tokens, return_hidden=True)
  ref_logits, ref_hidden = reference_model.forward(params, tokens, cfg)
  np.testing.assert_allclose(hidden, ref_hidden, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-5, atol=2e-5)


def test_schemes_have_their_own_parameters():
  """Six norms per siamese_post_pre block, c1 for hybrid_pre, QKV norms where the spec puts them."""
  layer = lambda scheme: init_params(dataclasses.replace(TINY, norm_scheme=scheme), jax.random.PRNGKey(0))[
      "decoder"]["layers_0"]
  norms = lambda p: sorted(k for k, v in p.items() if isinstance(v, dict) and "scale" in v)
  assert norms(layer("siamese_post_pre")) == ["in1", "in2", "post1", "post2", "pre1", "pre2"]
  hybrid_pre = layer("siamese_hybrid_pre")
  assert norms(hybrid_pre) == ["attn_y_norm", "ff_in_norm", "ff_norm", "ff_y_norm"]
  assert hybrid_pre["c1"].shape == (TINY.d_model,)
  for scheme in ("hybrid", "siamese_hybrid_pre"):
    assert {"query_norm", "key_norm", "value_norm"} <= set(layer(scheme)["attn"])
  assert "query_norm" not in layer("pre")["attn"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scanned_layers_equal_unrolled_layers(scheme):
  cfg = dataclasses.replace(TINY, norm_scheme=scheme)
  unrolled = randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))
  layers = [unrolled["decoder"][f"layers_{l}"] for l in range(cfg.num_layers)]
  scanned = dict(unrolled, decoder={"layers": jax.tree_util.tree_map(lambda *ls: jnp.stack(ls), *layers)})
  tokens = tokens_for(cfg)
  expected = TransformerLM(cfg).apply({"params": unrolled}, tokens)
  for remat in ("none", "full", "dots"):
    scan_cfg = dataclasses.replace(cfg, scan_layers=True, remat=remat)
    np.testing.assert_allclose(TransformerLM(scan_cfg).apply({"params": scanned}, tokens), expected,
                               rtol=1e-5, atol=1e-5)


def lm_loss(cfg, tokens):
  def loss(params):
    logits = TransformerLM(cfg).apply({"params": params}, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
  return loss


def test_hf_options_add_their_parameters_and_change_the_outputs():
  """Biases exist ([heads, head_dim] for q/k/v, [d_model] for out) only when asked for; the Llama-3 scaling
  changes the logits (so the plain-equations test above would see it missing)."""
  cfg = dataclasses.replace(TINY, **HF_OPTIONS)
  params = randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))
  attn = params["decoder"]["layers_0"]["attn"]
  assert attn["query"]["bias"].shape == (4, 8) and attn["key"]["bias"].shape == (2, 8)
  assert attn["value"]["bias"].shape == (2, 8) and attn["out"]["bias"].shape == (16,)
  assert "bias" not in init_params(TINY, jax.random.PRNGKey(0))["decoder"]["layers_0"]["attn"]["query"]
  tokens = tokens_for(cfg)
  scaled = TransformerLM(cfg).apply({"params": params}, tokens)
  plain = TransformerLM(dataclasses.replace(cfg, rope_scaling="none")).apply({"params": params}, tokens)
  assert np.max(np.abs(scaled - plain)) > 1e-3


@pytest.mark.parametrize("scheme", SCHEMES + ("pre_hf_options",))
def test_gradients_match_finite_differences(scheme):
  """For every parameter leaf, <grad, u> equals the central difference along a random unit direction u
  (Richardson-extrapolated over steps h and h/2, so the O(h^2) error cancels in float32)."""
  options = HF_OPTIONS if scheme == "pre_hf_options" else {}
  cfg = dataclasses.replace(TINY, norm_scheme=scheme.removesuffix("_hf_options"), num_layers=2, scan_layers=True,
                            remat="full", **options)
  params = randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))
  loss = jax.jit(lm_loss(cfg, tokens_for(cfg, seq=6)))
  grads = jax.grad(loss)(params)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  grad_leaves = jax.tree_util.tree_leaves(grads)
  rng = np.random.default_rng(0)
  eps = 1e-2
  for index, (leaf, grad) in enumerate(zip(leaves, grad_leaves)):
    direction = rng.normal(size=leaf.shape).astype(np.float32)
    direction /= np.linalg.norm(direction)
    shifted = lambda step: jax.tree_util.tree_unflatten(
        treedef, [l + step * direction if i == index else l for i, l in enumerate(leaves)])
    central = lambda h: (loss(shifted(h)) - loss(shifted(-h))) / (2 * h)
    numeric = (4 * central(eps / 2) - central(eps)) / 3
    analytic = np.sum(np.asarray(grad) * direction)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-4,
                               err_msg=jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(params)[0][index][0]))


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_does_not_change_gradients(remat):
  cfg = dataclasses.replace(TINY, norm_scheme="siamese_post_pre", scan_layers=True)
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = tokens_for(cfg)
  grads = jax.grad(lm_loss(cfg, tokens))(params)
  remat_grads = jax.grad(lm_loss(dataclasses.replace(cfg, remat=remat), tokens))(params)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, remat_grads)


def zero_output_projections(params):
  def zero(path, leaf):
    name = jax.tree_util.keystr(path)
    return jnp.zeros_like(leaf) if ("'out'" in name or "'wo'" in name) else leaf
  return jax.tree_util.tree_map_with_path(zero, params)


@pytest.mark.parametrize("scheme", ["siamese_post_pre", "siamese_hybrid_pre"])
def test_siamese_pre_stream_is_a_clean_identity_path(scheme):
  """With every sub-layer's output projection zeroed: y_L == y_0, dy_L/dy_0 == I exactly, and the post
  stream leaves every block normalised."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, d_model=8, num_heads=2, num_kv_heads=1, mlp_dim=8)
  stack = DecoderStack(cfg)
  positions = jnp.broadcast_to(jnp.arange(4), (1, 4))
  x0 = jax.random.normal(jax.random.PRNGKey(1), (1, 4, cfg.d_model)) * 3.0
  y0 = jax.random.normal(jax.random.PRNGKey(2), (1, 4, cfg.d_model)) * 5.0
  variables = stack.init(jax.random.PRNGKey(0), (x0, y0), positions)
  params = zero_output_projections(nn.meta.unbox(variables["params"]))

  def run(y):
    return stack.apply({"params": params}, (x0, y), positions, capture_intermediates=True)

  (x_last, y_last), state = run(y0)
  np.testing.assert_array_equal(y_last, y0)
  jacobian = jax.jacrev(lambda y: run(y)[0][1])(y0).reshape(y0.size, y0.size)
  np.testing.assert_array_equal(jacobian, np.eye(y0.size))
  for layer in range(cfg.num_layers):
    (x_l, _), _ = state["intermediates"][f"layers_{layer}"]["__call__"][0]
    rms = np.sqrt(np.mean(np.square(np.asarray(x_l)), axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-4)
  assert not np.allclose(x_last, x0)


@pytest.mark.parametrize("scheme", ["pre", "siamese_post_pre"])
def test_packed_documents_do_not_see_each_other(scheme):
  """Two documents packed in one row with segment ids and restarted positions give the same logits as each
  document run alone."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme)
  params = init_params(cfg, jax.random.PRNGKey(0))
  doc_a, doc_b = tokens_for(cfg, batch=1, seq=3, seed=1), tokens_for(cfg, batch=1, seq=4, seed=2)
  packed = jnp.concatenate([doc_a, doc_b], axis=1)
  positions = jnp.array([[0, 1, 2, 0, 1, 2, 3]])
  segments = jnp.array([[1, 1, 1, 2, 2, 2, 2]])
  model = TransformerLM(cfg)
  logits = model.apply({"params": params}, packed, positions=positions, segment_ids=segments)
  np.testing.assert_allclose(logits[:, :3], model.apply({"params": params}, doc_a), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[:, 3:], model.apply({"params": params}, doc_b), rtol=1e-5, atol=1e-5)


def check_packed_attention(cfg, baseline):
  """On two packed documents per row: `cfg` gives the plain equations' logits, and its gradients are the
  `baseline` config's."""
  params = randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))
  tokens = tokens_for(cfg, seq=7)
  positions = jnp.array([[0, 1, 2, 0, 1, 2, 3]] * 2)
  segments = jnp.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 2, 2]])
  logits = TransformerLM(cfg).apply({"params": params}, tokens, positions=positions, segment_ids=segments)
  ref_logits, _ = reference_model.forward(params, tokens, cfg, positions=positions, segment_ids=segments)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-5, atol=2e-5)

  def loss(params, model_cfg):
    model = TransformerLM(model_cfg)
    return jnp.sum(jnp.sin(model.apply({"params": params}, tokens, positions=positions, segment_ids=segments)))

  tested, expected = jax.grad(loss)(params, cfg), jax.grad(loss)(params, baseline)
  # float32 rounding of an entry is relative to the sums it came from, i.e. to the array's scale (logits ~ 25 here)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max()),
                         tested, expected)


@pytest.mark.parametrize("scheme", ["pre", "siamese_post_pre"])
def test_query_chunked_attention_matches_plain_equations_and_gradients(scheme):
  """Causal attention taken 3 queries at a time (7 = 3 + 3 + 1, packed documents) gives the plain equations'
  logits and the unchunked model's gradients."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, attention_query_chunk=3)
  check_packed_attention(cfg, dataclasses.replace(cfg, attention_query_chunk=0))


@pytest.mark.parametrize("scheme", ["pre", "siamese_post_pre"])
@pytest.mark.parametrize("causal", [True, False])
def test_library_attention_matches_plain_equations_and_gradients(scheme, causal):
  """attention_impl="jax" (jax.nn.dot_product_attention; XLA's on CPU) gives the plain equations' logits and the
  jaxpt attention's gradients: GQA (4 heads, 2 KV heads), packed documents, causal or not."""
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, attention_impl="jax", causal=causal)
  check_packed_attention(cfg, dataclasses.replace(cfg, attention_impl="jaxpt"))


@pytest.mark.parametrize("backend, dtype, packed, fused", [
    ("gpu", jnp.bfloat16, False, True), ("gpu", jnp.float16, False, True), ("gpu", jnp.float32, False, False),
    ("gpu", jnp.bfloat16, True, False), ("cpu", jnp.bfloat16, False, False), ("tpu", jnp.bfloat16, False, False)])
def test_auto_attention_takes_cudnn_only_where_it_applies(backend, dtype, packed, fused):
  """attention_impl="auto" (the default) routes to cuDNN's fused attention on a GPU in bf16/fp16 without packed
  segments, and to jaxpt's attention everywhere else."""
  assert attention.cudnn_attention_applies(dtype, packed, backend) is fused


def test_bfloat16_compute_keeps_float32_params_and_tracks_float32():
  cfg = dataclasses.replace(TINY, norm_scheme="siamese_hybrid_pre")
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = tokens_for(cfg)
  logits32 = TransformerLM(cfg).apply({"params": params}, tokens)
  logits16 = TransformerLM(dataclasses.replace(cfg, dtype="bfloat16")).apply({"params": params}, tokens)
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params))
  assert logits16.dtype == jnp.float32
  np.testing.assert_allclose(logits16, logits32, atol=5e-2)


@pytest.mark.parametrize("module", ["jaxpt.models.blocks", "jaxpt.kernels.two_stream_norm.reference"])
def test_a_bf16_update_is_divided_by_the_depth_scale_with_one_rounding(module):
  """z / c_l in bf16 (the model's and the kernels' reference): within half a bf16 ulp of the exact quotient and
  unbiased over a layer's elements; multiplying by a bf16-rounded 1/c_l (at l = 13: +0.25%) biased them all alike."""
  import importlib

  from jaxpt.models.blocks import depth_scale
  depth_scaled = importlib.import_module(module).depth_scaled
  z = jnp.asarray(np.random.default_rng(0).normal(size=4096), jnp.bfloat16)
  got = np.asarray(depth_scaled(z, depth_scale(13)).astype(jnp.float32), np.float64)
  exact = np.asarray(z.astype(jnp.float32), np.float64) / np.sqrt(28.0)
  relative = (got - exact) / exact
  assert depth_scaled(z, depth_scale(13)).dtype == jnp.bfloat16
  assert np.abs(relative).max() <= 2.0 ** -8 and abs(relative.mean()) < 2e-4, relative.mean()


def test_dropout_is_active_only_when_not_deterministic():
  cfg = dataclasses.replace(TINY, dropout_rate=0.5)
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = tokens_for(cfg)
  model = TransformerLM(cfg)
  eval_a = model.apply({"params": params}, tokens)
  np.testing.assert_array_equal(eval_a, model.apply({"params": params}, tokens))
  train = lambda seed: model.apply({"params": params}, tokens, deterministic=False,
                                   rngs={"dropout": jax.random.PRNGKey(seed)})
  assert not np.allclose(train(0), eval_a)
  assert not np.allclose(train(0), train(1))


@pytest.mark.parametrize("field, value, message", [
    ("d_model", 30, "model.d_model=30: not divisible by model.num_heads=4"),
    ("norm_scheme", "sandwich", "model.norm_scheme='sandwich': must be one of"),
    ("num_kv_heads", 3, "model.num_kv_heads=3: must divide model.num_heads=4"),
    ("num_layers", 0, "model.num_layers=0: must be a positive integer"),
    ("remat", "some", "model.remat='some'"),
    ("attention_query_chunk", -1, "model.attention_query_chunk=-1: must be a non-negative integer"),
    ("attention_impl", "flash", "model.attention_impl='flash': must be one of auto, jaxpt, jax"),
    ("rope_scaling", "yarn", "model.rope_scaling='yarn': must be one of"),
])
def test_impossible_model_configs_name_the_field(field, value, message):
  values = dataclasses.asdict(TINY)
  values[field] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
    from_section(ModelConfig, values, "model")


def test_llama3_rope_scaling_bands_must_be_ordered():
  with pytest.raises(ConfigError, match=r"model.rope_high_freq_factor=1.0: must exceed model.rope_low_freq_factor=2.0"):
    from_section(ModelConfig, dict(rope_scaling="llama3", rope_low_freq_factor=2.0, rope_high_freq_factor=1.0),
                 "model")


def test_unknown_model_field_is_named():
  with pytest.raises(ConfigError, match="model.d_modle: unknown field"):
    from_section(ModelConfig, {"d_modle": 3}, "model")
