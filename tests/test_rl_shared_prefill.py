"""Shared-prompt prefill (`make_sampler(..., group_size=G)`): each prompt prefilled once, its G rows decoding over
that shared K/V, against the same rows prefilled one by one (group_size 1) with the same key: the same tokens,
masks and lengths, the same log-probs and hidden states to rounding; and a GRPO run (DAPO refills, CLIPO) whose
metrics are those of the same run through the one-by-one sampler."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

import jaxpt
from jaxpt.engine.metrics import read_metrics
from jaxpt.models.transformer import TransformerLM, init_cache
from jaxpt.rl.rollouts import repeat_prompts
from jaxpt.rl.sampler import SamplingConfig, make_sampler, prompt_layout
from jaxpt.trainers.grpo import replace_hooks
from tests.micro_grpo import DAPO, even_length, micro_config
from tests.test_models_hyper_connections import randomise_connections
from tests.test_rl_sampler import PROMPT_LEN, left_padded_prompts, model_for

G = 3
NEW_TOKENS = 6
# left-padded prompts of different lengths (6, 3, 1, 4 real tokens), each repeated G times: rows p*G .. p*G + G-1
SAMPLED = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, top_k=40, return_hidden=True, cache_segments=2)
KEY = jax.random.PRNGKey(11)


@functools.lru_cache(maxsize=None)
def sampler(cfg, sampling, group_size):
  return make_sampler(cfg, sampling, PROMPT_LEN, group_size=group_size)


def model(scheme):
  if scheme == "mhc_lite":
    cfg, params = model_for(scheme, hc_streams=2, hc_sinkhorn_iterations=4)
    return cfg, randomise_connections(params)
  return model_for(scheme)


def repeated_rows(cfg, group_size=G):
  tokens, mask = left_padded_prompts(cfg)
  tokens, mask, _ = repeat_prompts(tokens, mask, group_size)
  return tokens, mask


def assert_same_rollouts(got, want, atol=2e-5):
  """Tokens, masks and lengths equal; log-probs and hidden states to rounding."""
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=2e-5, atol=atol)
  if want.hidden is not None:
    np.testing.assert_allclose(got.hidden, want.hidden, rtol=2e-5, atol=atol)


@pytest.fixture(scope="module", params=["pre", pytest.param("siamese_hybrid_pre", marks=pytest.mark.slow),
                                        pytest.param("post", marks=pytest.mark.slow),
                                        pytest.param("hybrid", marks=pytest.mark.slow),
                                        pytest.param("siamese_post_pre", marks=pytest.mark.slow),
                                        pytest.param("mhc_lite", marks=pytest.mark.slow)])
def free_rollouts(request):
  """(cfg, params, rows, row mask, shared-prefill output, one-by-one output) of sampled rollouts without EOS."""
  cfg, params = model(request.param)
  tokens, mask = repeated_rows(cfg)
  shared = sampler(cfg, SAMPLED, G)(params, tokens, mask, KEY)
  one_by_one = sampler(cfg, SAMPLED, 1)(params, tokens, mask, KEY)
  return cfg, params, tokens, mask, shared, one_by_one


def test_shared_prefill_equals_one_prefill_per_row(free_rollouts):
  *_, shared, one_by_one = free_rollouts
  assert_same_rollouts(shared, one_by_one)
  assert shared.tokens.shape == (4 * G, NEW_TOKENS) and np.all(np.asarray(shared.lengths) == NEW_TOKENS)
  tokens = np.asarray(shared.tokens).reshape(4, G, NEW_TOKENS)
  assert all(len({tuple(row) for row in group}) > 1 for group in tokens)  # a group's rows draw their own tokens


def test_shared_prefill_with_eos_equals_one_prefill_per_row(free_rollouts):
  """An EOS that some rows sample (after a few tokens) and others never: the rows stop where they emit it."""
  cfg, params, tokens, mask, shared, _ = free_rollouts
  eos = int(np.asarray(shared.tokens)[0, 2])
  sampling = dataclasses.replace(SAMPLED, eos_id=eos, pad_id=cfg.vocab_size - 1)
  got = sampler(cfg, sampling, G)(params, tokens, mask, KEY)
  assert_same_rollouts(got, sampler(cfg, sampling, 1)(params, tokens, mask, KEY))
  assert int(got.lengths[0]) == 3 and int(np.max(got.lengths)) == NEW_TOKENS


def test_group_size_one_and_greedy_groups():
  """G = 1 (distinct prompts, as eval and `generate` sample) and a greedy G = 4 (every row of a group alike)."""
  cfg, params = model("pre")
  tokens, mask = left_padded_prompts(cfg)
  greedy = SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True, cache_segments=1)
  plain = sampler(cfg, greedy, 1)(params, tokens, mask, KEY)
  rows, row_mask = repeated_rows(cfg, 4)
  grouped = sampler(cfg, greedy, 4)(params, rows, row_mask, KEY)
  np.testing.assert_array_equal(grouped.tokens, np.repeat(np.asarray(plain.tokens), 4, axis=0))
  np.testing.assert_allclose(grouped.logprobs, np.repeat(np.asarray(plain.logprobs), 4, axis=0), atol=2e-5)


def test_bfloat16_shared_prefill_equals_one_prefill_per_row():
  cfg, params = model("pre")
  tokens, mask = repeated_rows(cfg)
  sampling = dataclasses.replace(SAMPLED, rollout_dtype="bfloat16", cache_segments=1)
  assert_same_rollouts(sampler(cfg, sampling, G)(params, tokens, mask, KEY),
                       sampler(cfg, sampling, 1)(params, tokens, mask, KEY), atol=1e-2)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_decode_over_a_shared_prefix_equals_the_prompt_in_each_rows_cache(scan_layers):
  """The model, two decode steps: rows reading their prompt from a shared prefix (`KVCache.prefix`, one row per
  prompt) against rows holding their own copy of it in their cache; scanned and unrolled layers."""
  cfg, params = model_for("siamese_post_pre", scan_layers=scan_layers)
  model = TransformerLM(cfg)
  apply = jax.jit(lambda tokens, positions, segment_ids=None, *, cache, cache_index: model.apply(
      {"params": params}, tokens, positions, segment_ids, return_hidden=True, cache=cache, cache_index=cache_index))
  prompts, prompt_mask = left_padded_prompts(cfg)
  tokens, mask = repeat_prompts(prompts, prompt_mask, G)[:2]
  new = np.random.default_rng(2).integers(1, cfg.vocab_size, (len(tokens), 2)).astype(np.int32)
  segment_ids, positions, lengths = prompt_layout(mask)
  _, _, own = apply(tokens, positions, segment_ids, cache=init_cache(cfg, len(tokens), PROMPT_LEN + 2),
                    cache_index=0)
  segment_ids, positions, _ = prompt_layout(prompt_mask)
  _, _, prefix = apply(prompts, positions, segment_ids, cache=init_cache(cfg, len(prompts), PROMPT_LEN),
                       cache_index=0)
  shared = init_cache(cfg, len(tokens), 2).replace(prefix=prefix)
  for t in range(2):
    position = (lengths + t)[:, None]
    want_logits, want_hidden, own = apply(new[:, t:t + 1], position, cache=own, cache_index=PROMPT_LEN + t)
    logits, hidden, shared = apply(new[:, t:t + 1], position, cache=shared, cache_index=t)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-5, atol=1e-5)
  for got, want in zip(shared.key + shared.value, own.key + own.value):
    np.testing.assert_allclose(got, want[:, :, PROMPT_LEN:], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(shared.prefix.segment_ids, prompt_mask)


def test_group_size_must_divide_the_rows():
  cfg, params = model("pre")
  tokens, mask = left_padded_prompts(cfg)
  with pytest.raises(ValueError, match="group_size=3 does not divide the 4 prompt rows"):
    make_sampler(cfg, SAMPLED, PROMPT_LEN, group_size=3)(params, tokens, mask, KEY)
  with pytest.raises(ValueError, match="group_size=0"):
    make_sampler(cfg, SAMPLED, PROMPT_LEN, group_size=0)


@pytest.mark.slow  # ~25 s: two GRPO runs; every default-suite GRPO run samples through the shared prefill, which the
# sampler-level tests above check equal to a prefill per row (free, EOS, bf16, G = 1, the decode over the prefix)
def test_grpo_run_with_shared_prefill_has_the_metrics_of_one_prefill_per_row(tmp_path):
  """The micro GRPO run (CLIPO on, DAPO's dynamic sampling refilling its groups) through the trainer's own sampler
  (shared prefill, group_size G) and through a group_size 1 sampler: the same metrics to rounding."""
  config = micro_config(clipo=True, **{**DAPO, "dapo.overlong_filtering": False, "steps": 2, "eval_every": 0,
                                       "data.eval_prompts": 0})
  trainer = replace_hooks(jaxpt.build("grpo", config, str(tmp_path / "shared")), reward_fn=even_length)
  collector = trainer.hooks.collector
  sampling = dataclasses.replace(collector.config.sampling, eos_id=collector.tokenizer.eos_id,
                                 pad_id=collector.tokenizer.pad_id, return_hidden=True)  # as the collector's
  one_by_one = make_sampler(collector.config.model, sampling, config.data.max_prompt_len, collector.layout)
  runs = {}
  for name, built in [("shared", trainer), ("one_by_one", replace_hooks(trainer, sample=one_by_one))]:
    jaxpt.train("grpo", config, str(tmp_path / name), built=built)
    runs[name] = read_metrics(str(tmp_path / name))
  assert len(runs["shared"]) == 2 and any(row.get("dapo_rounds", 1) > 1 for row in runs["shared"])
  for got, want in zip(runs["shared"], runs["one_by_one"]):
    for key, value in want.items():
      if key in ("steps_per_sec", "tokens_per_sec") or not isinstance(value, (int, float)):
        continue
      np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
