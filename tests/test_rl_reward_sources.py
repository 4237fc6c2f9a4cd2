"""The `reward` section (jaxpt.rl.reward_sources): the reward assembly against a float64 NumPy statement, its
properties, the reward model's token layout against `preference_batches.response_sequences`, and the refusals."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from jaxpt.config import ConfigError, from_section
from jaxpt.data.preference_batches import response_sequences
from jaxpt.rl.reward_sources import (EPS, RewardConfig, assemble_rewards, init_running_stats, raw_rewards,
                                     rm_sequences, check_model_fits)
from jaxpt.engine.saved_model import load_reward_run
from jaxpt.engine.trainers import TRAINER_KEY
from jaxpt.models.config import ModelConfig


def reference(settings: RewardConfig, scores, rm, extra, truncated, history=()):
  """The module docstring's statement in float64; `history`: the raw rewards of the earlier steps (running)."""
  raw = (settings.verifier_weight * np.float64(scores) + np.float64(extra) + settings.model_weight * np.float64(rm)
         - settings.eos_missing_penalty * np.asarray(truncated, np.float64))
  if settings.normalize == "batch":
    std = raw.std()
    raw = (raw - raw.mean()) / (std if std > EPS * (1 + abs(raw.mean())) else 1.0)
  elif settings.normalize == "running":
    seen = np.concatenate([*history, raw])
    std = seen.std()
    raw = (raw - seen.mean()) / (std if std > EPS * (1 + abs(seen.mean())) else 1.0)
  if settings.clip > 0:
    raw = np.clip(raw, -settings.clip, settings.clip)
  return raw


def raw_of(settings, scores, rm, extra, truncated):
  return reference(RewardConfig(verifier_weight=settings.verifier_weight, model="x" if settings.model else "",
                                model_weight=settings.model_weight,
                                eos_missing_penalty=settings.eos_missing_penalty), scores, rm, extra, truncated)


@pytest.mark.parametrize("normalize", ["none", "batch", "running"])
@pytest.mark.parametrize("clip", [0.0, 0.8])
def test_assembly_matches_the_float64_statement_over_three_steps(normalize, clip):
  settings = RewardConfig(verifier_weight=0.5, model="rm", model_weight=2.0, clip=clip, normalize=normalize,
                          eos_missing_penalty=0.3)
  rng = np.random.default_rng(0)
  stats, history = init_running_stats(), []
  assemble = jax.jit(lambda *a: assemble_rewards(settings, *a))
  for step in range(3):
    n = 16
    scores = rng.integers(0, 2, n).astype(np.float32)
    rm = rng.normal(step, 1.5, n).astype(np.float32)
    extra = -rng.uniform(0, 0.5, n).astype(np.float32)
    truncated = rng.random(n) < 0.3
    got, stats = assemble(scores, rm, extra, truncated, stats if normalize == "running" else None)
    want = reference(settings, scores, rm, extra, truncated, history)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    history.append(raw_of(settings, scores, rm, extra, truncated))
  if normalize == "running":
    seen = np.concatenate(history)
    assert float(stats["count"]) == len(seen)
    np.testing.assert_allclose(float(stats["mean"]), seen.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(stats["m2"]) / len(seen), seen.var(), rtol=1e-4)


def test_raw_rewards_on_the_host_and_on_device_match_the_float64_statement():
  """`raw_rewards` (what DAPO's filter reads, with numpy) is the unnormalised, unclipped statement, in numpy and in
  jax.numpy alike."""
  settings = RewardConfig(verifier_weight=0.5, model="rm", model_weight=2.0, clip=0.8, normalize="batch",
                          eos_missing_penalty=0.3)
  rng = np.random.default_rng(1)
  scores, rm = rng.integers(0, 2, 16).astype(np.float32), rng.normal(0, 1.5, 16).astype(np.float32)
  extra, truncated = -rng.uniform(0, 0.5, 16).astype(np.float32), rng.random(16) < 0.3
  want = raw_of(settings, scores, rm, extra, truncated)
  host = raw_rewards(settings, scores, rm, extra, truncated, np)
  assert isinstance(host, np.ndarray) and host.dtype == np.float32
  np.testing.assert_allclose(host, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(raw_rewards(settings, scores, rm, extra, truncated)), want, rtol=1e-6,
                             atol=1e-6)


def test_default_section_is_the_verifier_as_it_is():
  settings = RewardConfig()
  assert settings.is_default and not settings.uses_model
  scores, extra = np.array([0.0, 1.0, 1.0], np.float32), np.array([0.0, -0.25, 0.0], np.float32)
  got, stats = assemble_rewards(settings, scores, np.zeros(3, np.float32), extra, np.zeros(3, bool))
  np.testing.assert_array_equal(np.asarray(got), scores + extra)
  assert stats is None


rewards = hnp.arrays(np.float32, st.integers(2, 64), elements=st.floats(-100, 100, width=32))


@settings(max_examples=60, deadline=None)
@given(rewards)
def test_batch_whitening_gives_mean_0_and_std_1_for_non_constant_rewards(r):
  got, _ = assemble_rewards(RewardConfig(normalize="batch"), r, np.zeros_like(r), np.zeros_like(r),
                            np.zeros(r.shape, bool))
  got = np.asarray(got, np.float64)
  r64 = np.float64(r)
  if r64.std() > 1e-2 * (1 + abs(r64.mean())):
    assert abs(got.mean()) < 1e-4 and abs(got.std() - 1) < 1e-3
  elif r64.std() == 0:  # constant: the mean taken out, nothing blown up
    assert np.all(np.abs(got) <= 1e-3)


@settings(max_examples=60, deadline=None)
@given(rewards, st.floats(0.01, 50), st.sampled_from(["none", "batch", "running"]))
def test_clipped_rewards_stay_within_the_bound(r, c, normalize):
  got, _ = assemble_rewards(RewardConfig(clip=c, normalize=normalize), r, np.zeros_like(r), np.zeros_like(r),
                            np.zeros(r.shape, bool), init_running_stats())
  assert np.all(np.abs(np.asarray(got)) <= np.float32(c))


@settings(max_examples=40, deadline=None)
@given(rewards, st.floats(0, 10))
def test_the_eos_penalty_lowers_exactly_the_truncated_rows(r, penalty):
  truncated = np.arange(len(r)) % 2 == 0
  base, _ = assemble_rewards(RewardConfig(), r, np.zeros_like(r), np.zeros_like(r), np.zeros_like(truncated))
  got, _ = assemble_rewards(RewardConfig(eos_missing_penalty=penalty), r, np.zeros_like(r), np.zeros_like(r),
                            truncated)
  np.testing.assert_allclose(np.asarray(base) - np.asarray(got), penalty * truncated, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("seq_len", [15, 10, 7])
def test_rm_sequences_are_the_preference_batches_layout(seq_len):
  """Left-padded prompts + sampled responses (the stop token, EOS or an end-of-turn id, kept with mask 1; ids beyond
  the vocabulary) -> the RM's right-padded prompt + response + EOS rows, left-truncated when longer than seq_len."""
  rng = np.random.default_rng(1)
  n, p, t, eos, end_of_turn, pad, vocab = 6, 5, 6, 2, 1, 0, 20
  prompt_len = rng.integers(1, p + 1, n)
  prompt_tokens = rng.integers(3, vocab, (n, p)).astype(np.int32)
  prompt_mask = (np.arange(p)[None] >= p - prompt_len[:, None]).astype(np.int32)
  prompt_tokens = np.where(prompt_mask > 0, prompt_tokens, 0)
  tokens = rng.integers(3, vocab + 3, (n, t)).astype(np.int32)  # some ids >= vocab: no text, left out
  lengths = rng.integers(0, t + 1, n)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  ends = lengths < t  # these rows stop at a stop token (the sampler keeps it, mask 1)
  for i in np.flatnonzero(ends & (lengths > 0)):
    tokens[i, lengths[i] - 1] = (eos, end_of_turn)[i % 2]
  tokens = np.where(mask > 0, tokens, pad)
  layout = jax.jit(lambda *a: rm_sequences(*a, eos_id=eos, pad_id=pad, vocab_limit=vocab, seq_len=seq_len,
                                           stop_ids=(end_of_turn,)))
  got_tokens, got_last = layout(prompt_tokens, prompt_mask, tokens, mask)
  prompts = [list(row[m > 0]) for row, m in zip(prompt_tokens, prompt_mask)]
  responses = [[int(x) for x, m in zip(row, ms) if m and x not in (eos, end_of_turn) and x < vocab]
               for row, ms in zip(tokens, mask)]
  want_tokens, want_last = response_sequences(prompts, responses, seq_len, pad, eos)
  np.testing.assert_array_equal(np.asarray(got_tokens), want_tokens)
  np.testing.assert_array_equal(np.asarray(got_last), want_last)


@pytest.mark.parametrize("changes, message", [
    ({"verifier_weight": -1.0}, "verifier_weight=-1.0: must be in [0.0, inf]"),
    ({"model_weight": -0.5, "model": "/rm"}, "model_weight=-0.5"),
    ({"verifier_weight": 0.0}, "verifier_weight=0.0: is 0 and no reward.model is set"),
    ({"model": "/rm", "model_weight": 0.0}, "model_weight=0.0: is 0: the reward model /rm would be loaded"),
    ({"normalize": "whiten"}, "normalize='whiten': must be one of none, batch, running"),
    ({"clip": -1.0}, "clip=-1.0"),
    ({"eos_missing_penalty": -0.1}, "eos_missing_penalty=-0.1"),
])
def test_section_refusals_name_the_field(changes, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    from_section(RewardConfig, changes, "reward")


def test_reward_model_refusals_name_the_field(tmp_path):
  def refused(path, message, fits=None):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
      load_reward_run(str(path), None, "fsdp_tp", fits=fits)
    assert str(e.value).startswith("reward.model="), str(e.value)
    assert "\n" not in str(e.value)

  refused(tmp_path / "missing", "no such directory")
  (tmp_path / "empty").mkdir()
  refused(tmp_path / "empty", "is not a jaxpt run")
  lm = tmp_path / "lm"
  lm.mkdir()
  (lm / "config.json").write_text(json.dumps({TRAINER_KEY: "sft", "model": {}, "task": {}}))
  refused(lm, "is the workdir of a jaxpt sft run (a language model), not of a reward-model run")
  rm = tmp_path / "rm"
  rm.mkdir()
  (rm / "config.json").write_text(json.dumps({TRAINER_KEY: "rm", "model": {"max_seq_len": 32}, "rm": {}}))
  refused(rm, "has no checkpoint")
  (rm / "checkpoints" / "4").mkdir(parents=True)  # a checkpoint folder with nothing in it: cannot be restored
  from jaxpt.engine.record import checkpoint_steps
  if checkpoint_steps(str(rm)):
    refused(rm, "its checkpoint cannot be restored")


def test_an_rm_too_short_for_prompt_and_response_is_refused():
  class Tok:
    pass
  with pytest.raises(ConfigError, match=re.escape("reward.model='/rm': its model.max_seq_len=40 cannot hold "
                                                  "data.max_prompt_len (24) + sampling.max_new_tokens (16) + the "
                                                  "EOS it scores at")):
    check_model_fits(ModelConfig(max_seq_len=40), Tok(), 24, 16, "/rm")  # the row is 41 tokens
  check_model_fits(ModelConfig(max_seq_len=41), Tok(), 24, 16, "/rm")
  with pytest.raises(ConfigError, match="has no tokenizer"):
    check_model_fits(ModelConfig(max_seq_len=64), None, 24, 16, "/rm")
  jnp.zeros(())  # jax initialised for the other tests of this module either way


def test_rlhf_tiny_fits_rm_tiny():
  """experiments/configs/rlhf_tiny.py's prompt + response fit rm_tiny.py's max_seq_len (the issue's pipeline)."""
  from experiments.configs import rlhf_tiny, rm_tiny

  config, rm = rlhf_tiny.get_config(), rm_tiny.get_config()
  check_model_fits(ModelConfig(max_seq_len=rm.model.max_seq_len), object(), config.data.max_prompt_len,
                   config.sampling.max_new_tokens, "rm_tiny")
  assert config.reward.verifier_weight == 0 and config.reward.model == ""  # the RM is the command line's


def test_an_rm_of_another_format_reads_a_chat_policys_question_not_its_template():
  """The re-tokenizing path (an RM whose prompt format, or tokenizer, is not the policy's): each rollout's prompt is
  what the policy was asked, `prompt_message` (a chat policy's user turn), not its prompt tokens decoded (which for a
  chat policy are the chat template's text: 'system\\nYou are ...\\nuser\\n...'). A real chat template: the tiny
  Qwen2 fixture's tokenizer, policy 'chat', RM 'plain'."""
  import os

  from jaxpt.data.math_task import prompt_message, prompt_text
  from jaxpt.data.tokenizer import encode_prompts_as_trained, load_tokenizer
  from jaxpt.rl.reward_sources import RewardModelSource

  tok = load_tokenizer(os.path.join(os.path.dirname(__file__), "assets", "hf", "qwen2"))
  questions, responses, group, width, new = ["What is 2+3?", "What is 7*6?"], ["5", "4 2", "42", "x"], 2, 160, 8
  (stop,) = tok.encode("!")  # a stop id the run's config adds (sampling.stop_ids): left out of the RM's text too
  rendered = encode_prompts_as_trained(tok, [prompt_text(q, tok, "chat") for q in questions], True)
  prompt_tokens = np.zeros((4, width), np.int32)
  prompt_mask = np.zeros((4, width), np.int32)
  tokens = np.full((4, new), tok.pad_id, np.int32)
  mask = np.zeros((4, new), np.int32)
  for i, text in enumerate(responses):
    ids = list(rendered[i // group])
    prompt_tokens[i, width - len(ids):], prompt_mask[i, width - len(ids):] = ids, 1  # left-padded, as the sampler
    out = list(tok.encode(text)) + [tok.eos_id if i != 1 else stop]  # row 1 stops at the run's own stop id
    tokens[i, :len(out)], mask[i, :len(out)] = out, 1
  ro = {k: jnp.asarray(v) for k, v in dict(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
                                            mask=mask).items()}
  source = RewardModelSource(params=None, forward=None, sequences=None, shared=False, tokenizer=tok,
                             policy_tokenizer=tok, chat=False, policy_prompt_format="chat", seq_len=256, layout=None,
                             stop_ids=(*tok.stop_ids, stop))
  got_tokens, got_last = source.retokenized(ro, questions)
  asked = encode_prompts_as_trained(tok, [prompt_message(q, "chat") for q in questions], False)
  want_tokens, want_last = response_sequences([list(asked[i // group]) for i in range(4)],
                                              [list(tok.encode(t)) for t in responses], 256, tok.pad_id, tok.eos_id)
  np.testing.assert_array_equal(got_tokens, want_tokens)
  np.testing.assert_array_equal(got_last, want_last)
  assert "system" not in tok.decode([int(t) for t in got_tokens[0, :got_last[0]]])  # no template text
  with pytest.raises(ValueError, match="need G rollouts a question"):
    source.retokenized(ro, questions[:1] * 3)

  class WithoutEos:  # an RM tokenizer with no EOS: its rows end with the pad id, as Model.score's do
    eos_id = None

    def __getattr__(self, name):
      return getattr(tok, name)

  source.tokenizer = WithoutEos()
  got_tokens, got_last = source.retokenized(ro, questions)
  want_tokens, want_last = response_sequences([list(asked[i // group]) for i in range(4)],
                                              [list(tok.encode(t)) for t in responses], 256, tok.pad_id, tok.pad_id)
  np.testing.assert_array_equal(got_tokens, want_tokens)
  np.testing.assert_array_equal(got_last, want_last)
