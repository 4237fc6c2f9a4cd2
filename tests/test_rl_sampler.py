"""The KV-cache sampler against decoding by full recomputation, and its log-probs against teacher forcing."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache, init_params
from jaxpt.rl.logprobs import response_logprobs, rollout_inputs
from jaxpt.rl.sampler import SamplingConfig, categorical, decode_segments, filter_logits, make_sampler
from tests import reference_model
from tests.test_models_hyper_connections import randomise_connections
from tests.test_models_transformer import randomise_norms

SCHEMES = reference_model.SCHEMES
TINY = ModelConfig(vocab_size=96, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=48,
                   max_seq_len=64)
PROMPT_LEN, NEW_TOKENS = 6, 7
REAL_LENGTHS = np.array([6, 3, 1, 4])  # real tokens per row; rows are left-padded to PROMPT_LEN


def left_padded_prompts(cfg, lengths=REAL_LENGTHS, prompt_len=PROMPT_LEN, seed=0):
  mask = (np.arange(prompt_len)[None, :] >= prompt_len - lengths[:, None]).astype(np.int32)
  tokens = np.random.default_rng(seed).integers(1, cfg.vocab_size, mask.shape)
  return np.where(mask == 1, tokens, 0).astype(np.int32), mask


def layout(mask):
  """Plain statement of the convention: segment 1 on real tokens, positions from 0 at a row's first real token."""
  mask = np.asarray(mask)
  positions = np.zeros_like(mask)
  for b in range(mask.shape[0]):
    real = np.flatnonzero(mask[b])
    positions[b, real] = np.arange(len(real))
  return mask.astype(np.int32), positions.astype(np.int32)


def greedy_by_recomputation(cfg, params, tokens, mask, steps):
  """argmax decoding without a cache: each step runs the model on the whole sequence so far (right-padded to a
  fixed width with segment 0, which causal attention never lets earlier positions see)."""
  forward = jax.jit(lambda p, t, pos, seg: TransformerLM(cfg).apply({"params": p}, t, pos, seg))
  batch, prompt_len = tokens.shape
  seq = np.zeros((batch, prompt_len + steps), np.int32)
  seg = np.zeros_like(seq)
  seq[:, :prompt_len], seg[:, :prompt_len] = tokens, mask
  out = []
  for t in range(steps):
    width = prompt_len + t
    segment_ids, positions = layout(seg)
    logits = forward(params, seq, positions, segment_ids)
    token = np.argmax(np.asarray(logits[:, width - 1]), axis=-1)
    out.append(token)
    seq[:, width], seg[:, width] = token, 1
  return np.stack(out, axis=1)


@functools.lru_cache(maxsize=None)
def sampler_for(cfg, sampling, prompt_len=PROMPT_LEN):
  """One compiled sampler per (model config, sampling config), shared by the tests."""
  return make_sampler(cfg, sampling, prompt_len)


GREEDY = SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True)


def model_for(scheme, **overrides):
  cfg = dataclasses.replace(TINY, norm_scheme=scheme, **overrides)
  return cfg, randomise_norms(init_params(cfg, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("scheme,overrides", [(s, {}) for s in SCHEMES] + [
    pytest.param("siamese_post_pre", {"scan_layers": False}, marks=pytest.mark.slow)])
def test_greedy_with_cache_equals_recomputation(scheme, overrides):
  assert_greedy_equals_recomputation(*model_for(scheme, **overrides))


@pytest.mark.parametrize("scheme,streams", [pytest.param("hc_dynamic", 4, marks=pytest.mark.slow),
                                            pytest.param("mhc", 2, marks=pytest.mark.slow), ("mhc_lite", 4)])
def test_multi_stream_greedy_with_cache_equals_recomputation(scheme, streams):
  """(Static hc is hc_dynamic's path without the tanh terms; 4 Sinkhorn iterations keep mhc's compiles short.) The
  cache is the streams' whatever mixes them, so one multi-stream scheme in the default suite, the others `slow`
  (each scheme's mixing is checked against its equations in tests/test_models_hyper_connections.py)."""
  cfg, params = model_for(scheme, hc_streams=streams, hc_sinkhorn_iterations=4)
  assert_greedy_equals_recomputation(cfg, randomise_connections(params))


def assert_greedy_equals_recomputation(cfg, params):
  tokens, mask = left_padded_prompts(cfg)
  out = sampler_for(cfg, GREEDY)(params, tokens, mask, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(out.tokens, greedy_by_recomputation(cfg, params, tokens, mask, NEW_TOKENS))
  np.testing.assert_array_equal(out.mask, np.ones((len(tokens), NEW_TOKENS)))
  np.testing.assert_array_equal(out.lengths, NEW_TOKENS)


def test_greedy_equals_recomputation_with_every_cache_segmentation():
  """cache_segments 1 (every step reads the whole cache) and one per step: the same greedy tokens as
  recomputation (the 4-segment default is the test above, for every scheme; the segmentation is the cache's, not
  the scheme's, so one two-stream scheme here)."""
  for scheme in ("siamese_post_pre",):
    cfg, params = model_for(scheme)
    tokens, mask = left_padded_prompts(cfg)
    expected = greedy_by_recomputation(cfg, params, tokens, mask, NEW_TOKENS)
    for segments in (1, NEW_TOKENS):
      out = make_sampler(cfg, dataclasses.replace(GREEDY, cache_segments=segments), PROMPT_LEN)(
          params, tokens, mask, jax.random.PRNGKey(0))
      np.testing.assert_array_equal(out.tokens, expected, err_msg=f"{scheme}, {segments} segments")


def test_decode_segments_cover_every_step_once():
  assert decode_segments(128, 4) == [32, 64, 96, 128]
  assert decode_segments(7, 4) == [2, 4, 5, 7]
  assert decode_segments(7, 100) == [2, 3, 4, 5, 6, 7]  # at most one per decode step
  assert decode_segments(1, 4) == [1]  # no decode step at all


@pytest.mark.parametrize("scheme", ["pre", "siamese_post_pre"])
def test_last_logits_only_is_the_full_forwards_last_column(scheme):
  """With and without a cache (a prefill): the logits of the last column alone, hidden states whole; the cache
  then grows by empty slots."""
  cfg, params = model_for(scheme)
  model = TransformerLM(cfg)
  tokens, mask = left_padded_prompts(cfg)
  segment_ids, positions = layout(mask)
  full_logits, full_hidden = model.apply({"params": params}, tokens, positions, segment_ids, return_hidden=True)
  logits, hidden = model.apply({"params": params}, tokens, positions, segment_ids, return_hidden=True,
                               last_logits_only=True)
  assert logits.shape == (len(tokens), 1, cfg.vocab_size)
  np.testing.assert_array_equal(logits[:, 0], full_logits[:, -1])
  np.testing.assert_array_equal(hidden, full_hidden)
  prefill_logits, _, cache = model.apply({"params": params}, tokens, positions, segment_ids, return_hidden=True,
                                         cache=init_cache(cfg, len(tokens), PROMPT_LEN), cache_index=0,
                                         last_logits_only=True)
  np.testing.assert_allclose(prefill_logits[:, 0], full_logits[:, -1], rtol=1e-5, atol=1e-5)
  grown = cache.grow(PROMPT_LEN + 3)
  assert grown.max_len == PROMPT_LEN + 3
  np.testing.assert_array_equal(grown.segment_ids[:, :PROMPT_LEN], cache.segment_ids)
  np.testing.assert_array_equal(grown.segment_ids[:, PROMPT_LEN:], 0)
  np.testing.assert_array_equal(grown.key[1][:, :, :PROMPT_LEN], cache.key[1])
  np.testing.assert_array_equal(grown.value[0][:, :, PROMPT_LEN:], 0)


def test_bfloat16_rollouts_sample_near_the_float32_policy():
  """bf16 weights, activations and cache: the tokens are valid, and their log-probs (the bf16 policy's) are close
  to the fp32 policy's teacher-forced ones, which are what a trainer must use as old log-probs."""
  cfg, params = model_for("siamese_post_pre", scan_layers=False)
  tokens, mask = left_padded_prompts(cfg)
  sampling = dataclasses.replace(SAMPLED, rollout_dtype="bfloat16")
  out = make_sampler(cfg, sampling, PROMPT_LEN)(params, tokens, mask, jax.random.PRNGKey(7))
  assert out.logprobs.dtype == jnp.float32 and out.hidden.dtype == jnp.float32
  logp = response_logprobs(TransformerLM(cfg), params, tokens, mask, out.tokens, out.mask,
                           temperature=sampling.temperature)
  assert np.all(np.isfinite(np.asarray(out.logprobs))) and np.all(np.asarray(out.logprobs) <= 0)
  np.testing.assert_allclose(out.logprobs, logp, atol=0.1)
  assert not np.array_equal(np.asarray(out.logprobs), np.asarray(logp))  # it did decode in bf16


@pytest.mark.slow
def test_greedy_with_pallas_boundaries_equals_recomputation():
  cfg, params = model_for("siamese_post_pre", kernel="pallas", num_layers=1)
  tokens, mask = left_padded_prompts(cfg, lengths=np.array([6, 2]))
  sampler = make_sampler(cfg, SamplingConfig(max_new_tokens=3, greedy=True), PROMPT_LEN)
  out = sampler(params, tokens, mask, jax.random.PRNGKey(0))
  reference_cfg = dataclasses.replace(cfg, kernel="reference")
  np.testing.assert_array_equal(out.tokens, greedy_by_recomputation(reference_cfg, params, tokens, mask, 3))


def test_decode_at_per_row_indices_matches_full_forward():
  """Right-padded rows of different lengths each write their next token at their own slot (cache_index [B])."""
  cfg, params = model_for("siamese_post_pre")
  model = TransformerLM(cfg)
  lengths = np.array([5, 2, 3])
  full = np.random.default_rng(1).integers(1, cfg.vocab_size, (3, 6)).astype(np.int32)
  prompt_seg = (np.arange(5)[None, :] < lengths[:, None]).astype(np.int32)
  apply = jax.jit(lambda *args: model.apply({"params": params}, *args[:3], cache=args[3], cache_index=args[4]))
  _, cache = apply(full[:, :5], None, prompt_seg, init_cache(cfg, 3, 8), 0)
  next_tokens = full[np.arange(3), lengths][:, None]
  logits, cache = apply(next_tokens, lengths[:, None], None, cache, jnp.asarray(lengths))
  expected = model.apply({"params": params}, full)  # causal: position n sees exactly full[:, :n + 1]
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(logits[b, 0], expected[b, n], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.segment_ids[b], (np.arange(8) <= n).astype(np.int32))


def test_filter_logits_keeps_exactly_the_allowed_set():
  probs = np.array([0.4, 0.05, 0.25, 0.2, 0.1])
  logits = jnp.log(jnp.asarray(probs))[None]
  allowed = lambda **kw: np.isfinite(np.asarray(filter_logits(logits, **kw)[0]))
  np.testing.assert_array_equal(allowed(top_k=2), [1, 0, 1, 0, 0])
  np.testing.assert_array_equal(allowed(top_p=0.39), [1, 0, 0, 0, 0])    # the top token alone reaches 0.39
  np.testing.assert_array_equal(allowed(top_p=0.41), [1, 0, 1, 0, 0])
  np.testing.assert_array_equal(allowed(top_p=0.86), [1, 0, 1, 1, 1])
  np.testing.assert_array_equal(allowed(top_p=0.01), [1, 0, 0, 0, 0])    # always at least the top token
  np.testing.assert_array_equal(allowed(top_k=3, top_p=0.6), [1, 0, 1, 0, 0])  # nucleus of the renormalised top 3
  np.testing.assert_array_equal(allowed(top_k=3, top_p=0.8), [1, 0, 1, 1, 0])


def test_categorical_draws_follow_the_softmax():
  """Frequencies of 40k draws per row against softmax(logits) (5 sigma), never a -inf token."""
  logits = np.array([[0.0, 1.0, -np.inf, 2.0, -1.0, -np.inf], [3.0, -np.inf, 0.0, 0.0, 1.0, 2.5]], np.float32)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  draws = 40000
  keys = jax.random.split(jax.random.PRNGKey(0), draws)
  tokens = np.asarray(jax.jit(jax.vmap(lambda k: categorical(k, jnp.asarray(logits))))(keys))  # [draws, 2]
  for row in range(2):
    freq = np.bincount(tokens[:, row], minlength=6) / draws
    np.testing.assert_array_less(np.abs(freq - probs[row]), 5 * np.sqrt(probs[row] * (1 - probs[row]) / draws) + 1e-9)


def test_sampled_tokens_lie_in_the_allowed_set():
  """A model whose next-token distribution is known: zero layers' contribution, untied head = fixed logits."""
  cfg, params = model_for("pre", tie_embeddings=False)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(jnp.zeros_like, params)
  params["output"]["final_norm"]["scale"] = jnp.ones((cfg.d_model,))
  bias_logits = rng.normal(0.0, 2.0, cfg.vocab_size).astype(np.float32)
  # hidden = RMSNorm(embedding) of a one-hot-ish embedding row; make every embedding row the same unit vector
  params["embedding"] = jnp.zeros_like(params["embedding"]).at[:, 0].set(1.0)
  params["head"]["kernel"] = jnp.zeros_like(params["head"]["kernel"]).at[0].set(bias_logits / np.sqrt(cfg.d_model))
  tokens, mask = left_padded_prompts(cfg)
  for top_k, top_p in [(8, 0.7)]:
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.7, top_k=top_k, top_p=top_p)
    out = make_sampler(cfg, sampling, PROMPT_LEN)(params, tokens, mask, jax.random.PRNGKey(3))
    allowed = np.flatnonzero(np.isfinite(np.asarray(filter_logits(jnp.asarray(bias_logits) / 0.7, top_k, top_p))))
    assert np.isin(np.asarray(out.tokens), allowed).all(), (top_k, top_p)
    assert len(np.unique(np.asarray(out.tokens))) > 1  # it does sample


def test_temperature_to_zero_is_greedy():
  cfg, params = model_for("siamese_post_pre")
  tokens, mask = left_padded_prompts(cfg)
  cold = make_sampler(cfg, SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1e-6), PROMPT_LEN)
  np.testing.assert_array_equal(cold(params, tokens, mask, jax.random.PRNGKey(5)).tokens,
                                sampler_for(cfg, GREEDY)(params, tokens, mask, jax.random.PRNGKey(0)).tokens)


@pytest.mark.parametrize("given_as", ["eos_id", "stop_ids"])
def test_eos_stops_rows_pads_after_and_max_new_tokens(given_as):
  """A row stops at its first stop token, given as eos_id or as one of stop_ids (an end-of-turn id) without eos_id
  (`tests/test_rl_engine.py` runs both at once)."""
  cfg, params = model_for("pre")
  tokens, mask = left_padded_prompts(cfg)
  eos_sampler = None
  for batch in (tokens, np.repeat(tokens[1:2], len(tokens), axis=0)):  # rows of different lengths, then all alike
    batch_mask = mask if batch is tokens else np.repeat(mask[1:2], len(tokens), axis=0)
    free = np.asarray(sampler_for(cfg, GREEDY)(params, batch, batch_mask, jax.random.PRNGKey(0)).tokens)
    if eos_sampler is None:
      eos = int(free[1, 2])  # row 1 emits it by step 2; pad with a token id the rows do not emit before EOS
      stop = dict(eos_id=eos) if given_as == "eos_id" else dict(eos_id=None, stop_ids=(eos,))
      eos_sampler = make_sampler(cfg, dataclasses.replace(GREEDY, pad_id=95, **stop), PROMPT_LEN)
    out = eos_sampler(params, batch, batch_mask, jax.random.PRNGKey(0))
    got = np.asarray(out.tokens)
    assert got.shape == (len(batch), NEW_TOKENS)
    for b in range(len(batch)):
      hits = np.flatnonzero(free[b] == eos)
      n = hits[0] + 1 if len(hits) else NEW_TOKENS
      np.testing.assert_array_equal(got[b, :n], free[b, :n])
      np.testing.assert_array_equal(got[b, n:], 95)
      np.testing.assert_array_equal(out.mask[b], (np.arange(NEW_TOKENS) < n).astype(np.float32))
      assert out.lengths[b] == n
      np.testing.assert_array_equal(np.asarray(out.logprobs[b, n:]), 0.0)
    assert out.lengths[1] <= 3 and out.lengths.min() < NEW_TOKENS


def test_stop_ids_given_as_a_list_are_a_tuple_a_sampler_cache_can_key_on():
  assert SamplingConfig(4, stop_ids=[3, 5]).stop_ids == (3, 5)
  assert hash(SamplingConfig(4, stop_ids=[3, 5])) == hash(SamplingConfig(4, stop_ids=(3, 5)))


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", 0.0), ("top_k", -1),
                                         ("top_p", 0.0), ("top_p", 1.5), ("eos_id", -2), ("stop_ids", (3, -1)),
                                         ("pad_id", -1),
                                         ("rollout_dtype", "float16"), ("cache_segments", 0)])
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ConfigError, match=rf"^{field}="):
    dataclasses.replace(SamplingConfig(max_new_tokens=4), **{field: value})
  with pytest.raises(ConfigError, match=rf"^sampling\.{field}="):
    from_section(SamplingConfig, {"max_new_tokens": 4, field: value}, "sampling")


# ---------------------------------------------------------------------------------------------------------------
# Teacher forcing (jaxpt.rl.logprobs)
# ---------------------------------------------------------------------------------------------------------------

SAMPLED = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.7, top_k=20, top_p=0.9, return_hidden=True)


@pytest.fixture(scope="module", params=["siamese_post_pre", pytest.param("pre", marks=pytest.mark.slow)])
def sampled_rollouts(request):
  """(cfg, params, prompt tokens, prompt mask, SampleOutput) of sampled rollouts whose EOS ends some rows early."""
  cfg, params = model_for(request.param, scan_layers=False)
  tokens, mask = left_padded_prompts(cfg)
  free = make_sampler(cfg, SAMPLED, PROMPT_LEN)(params, tokens, mask, jax.random.PRNGKey(7))
  eos = int(free.tokens[0, 2])
  out = make_sampler(cfg, dataclasses.replace(SAMPLED, eos_id=eos), PROMPT_LEN)(
      params, tokens, mask, jax.random.PRNGKey(7))
  assert out.lengths.min() < NEW_TOKENS  # EOS cut at least row 0
  return cfg, params, tokens, mask, out


def test_rollout_inputs_layout():
  inputs = rollout_inputs(np.array([[0, 0, 5, 6], [7, 8, 9, 4]]), np.array([[0, 0, 1, 1], [1, 1, 1, 1]]),
                          np.array([[1, 2, 3], [4, 5, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
  np.testing.assert_array_equal(inputs["tokens"], [[0, 0, 5, 6, 1, 2, 3], [7, 8, 9, 4, 4, 5, 0]])
  np.testing.assert_array_equal(inputs["positions"], [[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]])
  np.testing.assert_array_equal(inputs["segment_ids"], [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]])


def test_sampler_logprobs_and_hidden_equal_teacher_forcing(sampled_rollouts):
  cfg, params, tokens, mask, out = sampled_rollouts
  logp, hidden = response_logprobs(TransformerLM(cfg), params, tokens, mask, out.tokens, out.mask,
                                   temperature=SAMPLED.temperature, return_hidden=True)
  np.testing.assert_allclose(logp, out.logprobs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(hidden, out.hidden, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(out.logprobs)[np.asarray(out.mask) == 0] == 0)


def unpadded_logprobs_numpy(cfg, params, tokens, mask, response, response_mask, temperature):
  """Plain float64 statement, row by row: the real prompt tokens followed by the real response tokens, run from
  position 0 with no padding at all (tests/reference_model.py), log-softmax of the tempered logits."""
  logp = np.zeros(response.shape)
  hidden = np.zeros(response.shape + (cfg.d_model,))
  for b in range(len(tokens)):
    n = int(response_mask[b].sum())
    prompt = tokens[b][mask[b] == 1]
    seq = np.concatenate([prompt, response[b, :n]])[None]
    logits, h = reference_model.forward(params, seq, cfg)
    scaled = logits[0, len(prompt) - 1:len(prompt) - 1 + n] / temperature
    scaled = scaled - scaled.max(-1, keepdims=True)
    log_softmax = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
    logp[b, :n] = log_softmax[np.arange(n), response[b, :n]]
    hidden[b, :n] = h[0, len(prompt) - 1:len(prompt) - 1 + n]
  return logp, hidden


def test_response_logprobs_match_the_unpadded_numpy_statement(sampled_rollouts):
  cfg, params, tokens, mask, out = sampled_rollouts
  response, response_mask = np.asarray(out.tokens), np.asarray(out.mask)
  logp, hidden = response_logprobs(TransformerLM(cfg), params, tokens, mask, response, response_mask,
                                   temperature=0.7, return_hidden=True)
  ref_logp, ref_hidden = unpadded_logprobs_numpy(cfg, params, tokens, mask, response, response_mask, 0.7)
  np.testing.assert_allclose(logp, ref_logp, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(hidden, ref_hidden, rtol=1e-4, atol=1e-5)


def test_response_logprobs_gradient_equals_the_unpadded_rows(sampled_rollouts):
  """d/dparams of sum_t w_t logp_t: padding neither contributes nor leaks into real tokens' gradients."""
  cfg, params, tokens, mask, out = sampled_rollouts
  model = TransformerLM(cfg)
  response, response_mask = np.asarray(out.tokens), np.asarray(out.mask)
  weights = np.random.default_rng(0).normal(size=response.shape).astype(np.float32)

  def padded(p):
    return jnp.sum(weights * response_logprobs(model, p, tokens, mask, response, response_mask))

  def row_by_row(p):
    total = 0.0
    for b in range(len(tokens)):
      n, prompt = int(response_mask[b].sum()), tokens[b][mask[b] == 1]
      seq = np.concatenate([prompt, response[b, :n]])[None]
      logp = jax.nn.log_softmax(model.apply({"params": p}, seq)[0, len(prompt) - 1:-1])
      total += jnp.sum(weights[b, :n] * logp[np.arange(n), response[b, :n]])
    return total

  (value, grads), (ref_value, ref_grads) = [jax.jit(jax.value_and_grad(f))(params) for f in (padded, row_by_row)]
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  # float32 rounding of two batchings, scaled to each leaf (a leak would move gradients by their own size)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=5e-6 * np.abs(b).max()),
                         grads, ref_grads)
