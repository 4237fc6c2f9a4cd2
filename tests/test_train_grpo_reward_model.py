"""GRPO against a jaxpt reward model (`reward.model`): a micro SFT run, a micro RM started from it (so the two share
one tokenizer), 2 GRPO steps rewarded by the RM alone, and the rewards checked against the RM's scores of the same
rollouts computed independently (both token layouts: the rollouts' own tokens and the re-tokenized text)."""

import jax
import numpy as np
import pytest

from experiments.configs import grpo_tiny
import jaxpt
from jaxpt.config import ConfigError
from jaxpt.data.math_task import prompt_message
from jaxpt.data.preference_batches import response_sequences
from jaxpt.models.reward import RewardModel
from jaxpt.rl.reward_sources import RewardModelSource
from jaxpt.trainers.grpo import REWARD_HACKING_PNG, replace_hooks
from jaxpt.data import text_bias
from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.saved_model import load_reward_run
from tests.runs import flat, sft_and_reward_model

MODEL = {"vocab_size": 512, "d_model": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "mlp_dim": 64,
         "max_seq_len": 64}
TASK = {"task.num_steps": 1, "task.max_value": 9, "task.ops": "+", "task.train_size": 64, "task.test_size": 8}
QUIET = {"log_every": 1, "eval_every": 0, "progress": False, "optim.warmup_steps": 0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(sft workdir, rm workdir): 3 SFT steps, then 2 ODIN steps of an RM whose backbone and tokenizer are the SFT
  run's (two score heads: the RL reward reads the quality head, column 0)."""
  return sft_and_reward_model(tmp_path_factory, MODEL, TASK, QUIET, rm_loss="odin")


def grpo_config(sft: str, rm: str, **extra):
  config = grpo_tiny.get_config()
  config.update_from_flattened_dict({**flat("model", MODEL), **TASK, **QUIET, "steps": 2, "checkpoint_every": 0,
                                     "init_from": sft, "data.prompts_per_step": 2, "data.max_prompt_len": 32,
                                     "data.eval_prompts": 0, "sampling.max_new_tokens": 16, "grpo.group_size": 4,
                                     "grpo.minibatches": 1, "reward.model": rm, "reward.verifier_weight": 0.0,
                                     **extra})
  return config


class Recorder:
  """The hooks' reward-model source, recording each call's rollouts (host copies) and scores."""

  def __init__(self, source):
    self.source, self.calls = source, []

  def scores(self, ro, questions):
    got = self.source.scores(ro, questions)
    self.calls.append(({**{k: np.asarray(jax.device_get(ro[k])) for k in ("prompt_tokens", "prompt_mask", "tokens",
                                                                             "mask", "scores")},
                        "questions": list(questions)}, got))
    return got


@pytest.fixture(scope="module")
def built_grpo(runs, tmp_path_factory):
  """(config, built): the GRPO run rewarded by the RM alone, built (compiled) once for the tests below."""
  config = grpo_config(*runs)
  return config, jaxpt.build("grpo", config, str(tmp_path_factory.mktemp("grpo_built")))


def test_grpo_is_rewarded_by_the_reward_models_scores_of_its_rollouts(runs, built_grpo, tmp_path):
  _, rm = runs
  config, built = built_grpo
  source = built.hooks.reward_model
  assert source.shared  # the RM started from the SFT run: the policy's tokenizer, plain prompts
  recorder = Recorder(source)
  assemble, outputs = built.hooks.assemble, []

  def recording_assemble(*arrays):
    rewards, stats = assemble(*arrays)
    outputs.append(np.asarray(rewards))
    return rewards, stats

  built = replace_hooks(built, reward_model=recorder, assemble=recording_assemble)
  jaxpt.train("grpo", config, str(tmp_path), built=built)
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2]
  assert len(recorder.calls) == len(outputs) == 2

  model = jaxpt.load(rm)
  assert model.kind == "reward" and model.num_scores == 2
  tokenizer = model.tokenizer
  apply = jax.jit(lambda params, tokens, last: RewardModel(model.config, num_scores=2).apply(
      {"params": params}, tokens, last)[0][:, 0])  # the quality head
  for row, (ro, scores), rewards in zip(rows, recorder.calls, outputs):
    # independently: the RM's layout built with preference_batches.response_sequences, scored by a plain forward
    prompts = [[int(x) for x in t[m > 0]] for t, m in zip(ro["prompt_tokens"], ro["prompt_mask"])]
    responses = [[int(x) for x, m in zip(t, ms) if m and x != tokenizer.eos_id and x < tokenizer.vocab_size]
                 for t, ms in zip(ro["tokens"], ro["mask"])]
    tokens, last = response_sequences(prompts, responses, source.seq_len, tokenizer.pad_id, tokenizer.eos_id)
    want = np.asarray(apply(model.params, tokens, last))
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rewards, scores)  # verifier weight 0, model weight 1, no shaping
    assert row["rm_score"] == pytest.approx(float(np.mean(scores)), rel=1e-6)
    assert row["reward_mean"] == pytest.approx(float(np.mean(scores)), rel=1e-5, abs=1e-6)
    assert row["gold_score"] == pytest.approx(float(np.mean(ro["scores"])))  # the verifier's, weight 0 or not
    texts = [tokenizer.decode(r) for r in responses]
    for name in text_bias.TEXT_BIASES.names():  # the bias monitors: the shares of flagged responses
      detector = text_bias.TEXT_BIASES.get(name)
      assert row[f"bias_{name}_share"] == pytest.approx(np.mean([detector(t) for t in texts]))
  assert (tmp_path / REWARD_HACKING_PNG).stat().st_size > 0

  # the re-tokenizing layout (an RM of another tokenizer or prompt format) on the same rollouts: Model.score of
  # (what the policy was asked, the decoded response); a plain policy was asked its whole decoded prompt
  calls = recorder.calls[0][0]
  ro = {k: built.training.put(v) for k, v in calls.items() if k != "questions"}
  decode = lambda t, m, eos: tokenizer.decode([int(x) for x, k in zip(t, m) if k and x != eos
                                               and x < tokenizer.vocab_size])
  prompt_texts = [decode(t, m, None) for t, m in zip(calls["prompt_tokens"], calls["prompt_mask"])]
  response_texts = [decode(t, m, tokenizer.eos_id) for t, m in zip(calls["tokens"], calls["mask"])]
  group = len(response_texts) // len(calls["questions"])
  assert prompt_texts == [prompt_message(q) for q in calls["questions"] for _ in range(group)]
  # as for a chat policy (its prompt tokens would decode to its chat template's text): the RM reads the user turn
  retokenizing = RewardModelSource.create(model.config, source.params, model.num_scores, model.tokenizer, "plain",
                                          source.policy_tokenizer, "chat", built.training.layout, 32, 16)
  assert not retokenizing.shared and not retokenizing.chat
  asked = [prompt_message(q, "chat") for q in calls["questions"] for _ in range(group)]
  np.testing.assert_allclose(retokenizing.scores(ro, calls["questions"]), model.score(asked, response_texts)[:, 0],
                             rtol=1e-5, atol=1e-5)


def test_running_normalisation_resumes_bitwise(runs, tmp_path):
  """The running statistics live in state.aux: a run stopped after step 1 and resumed ends where one run ends."""
  sft, rm = runs
  config = grpo_config(sft, rm, **{"reward.normalize": "running", "reward.clip": 3.0, "reward.verifier_weight": 1.0,
                                   "reward.model_weight": 0.5, "checkpoint_every": 1})
  whole = jaxpt.train("grpo", config, str(tmp_path / "whole"))
  built = jaxpt.build("grpo", config, str(tmp_path / "parts"))
  jaxpt.train("grpo", config, str(tmp_path / "parts"), built=built, stop_at=1)
  parts = jaxpt.train("grpo", config, str(tmp_path / "parts"), built=built)
  assert float(whole.state.aux["reward_stats"]["count"]) == 2 * 2 * 4
  for got, want in zip(jax.tree.leaves((parts.state.params, parts.state.aux)),
                       jax.tree.leaves((whole.state.params, whole.state.aux))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert [r["rm_score"] for r in read_metrics(str(tmp_path / "parts"))] == \
      [r["rm_score"] for r in read_metrics(str(tmp_path / "whole"))]


def test_a_language_model_run_as_reward_model_is_refused_before_compiling(runs, tmp_path):
  sft, _ = runs
  with pytest.raises(ConfigError, match="reward.model=.*is the workdir of a jaxpt sft run"):
    jaxpt.build("grpo", grpo_config(sft, sft), str(tmp_path))


def test_an_hf_export_of_the_reward_model_is_the_same_reward_source(runs, tmp_path):
  """reward.model=hf:DIR (the RM run written by export-hf) loads the same scorer as the run directory; an hf:
  language model is refused naming reward.model."""
  sft, rm = runs
  jaxpt.load(rm).save_hf(str(tmp_path / "rm_hf"))
  from_run = load_reward_run(rm, None, "fsdp_tp")
  from_hf = load_reward_run(f"hf:{tmp_path / 'rm_hf'}", None, "fsdp_tp")
  assert (from_hf.kind, from_hf.num_scores, from_hf.prompt_format, from_hf.step) == ("reward", 2, "plain", 0)
  assert from_hf.tokenizer.encode("1 + 2 =") == from_run.tokenizer.encode("1 + 2 =")
  tokens = np.arange(2 * 12, dtype=np.int32).reshape(2, 12) % from_run.config.vocab_size
  last = np.asarray([11, 6], np.int32)
  score = lambda saved: np.asarray(RewardModel(saved.config, num_scores=2).apply({"params": saved.params}, tokens,
                                                                                 last)[0])
  np.testing.assert_allclose(score(from_hf), score(from_run), rtol=1e-6, atol=1e-6)
  jaxpt.load(sft).save_hf(str(tmp_path / "sft_hf"))
  with pytest.raises(ConfigError, match=r"reward.model=.*sft_hf: its config.json is a language model's"):
    jaxpt.build("grpo", grpo_config(sft, f"hf:{tmp_path / 'sft_hf'}"), str(tmp_path / "refused"))


def test_dynamic_sampling_filters_groups_on_the_reward_trained_on(runs, built_grpo):
  """DAPO's filter with a reward model reads the reward the run trains on (0.5 x verifier + the RM's score here),
  not the verifier's: with filter_min_std set between the two groups' std of round 0 (computed independently in
  float64 from the RM's scores of those rollouts), exactly one of them is kept, more rounds are drawn, and the RM
  scores the assembly receives are those of the kept groups (each round scored once), dropped ones after."""
  from jaxpt.config import from_section
  from jaxpt.trainers.grpo import reward_functions
  from jaxpt.trainers.grpo_config import GRPORunConfig

  sft, rm = runs
  extra = {"reward.verifier_weight": 0.5, "dapo.dynamic_sampling": True, "dapo.filter_metric": "reward",
           "dapo.max_rounds": 3}

  def with_config(built, config, **changes):  # the shared build's compiled programs, this config's reward assembly
    config = from_section(GRPORunConfig, config, "config")
    assemble, _ = reward_functions(config, built.training.layout, built.tokenizer, None)
    return replace_hooks(built, config=config, assemble=changes.pop("assemble", assemble), **changes)

  built = with_config(built_grpo[1], grpo_config(sft, rm, **extra))
  hooks, g = built.hooks, 4
  state = hooks.init_state(built.training)
  batch = hooks.collector.prompts.batch(0)
  first = hooks.collector.rollouts(state.params, batch, jax.random.split(state.step_rng(), 3)[0])
  composed = lambda ro, rm_scores: 0.5 * np.asarray(ro["scores"], np.float64) + np.asarray(rm_scores, np.float64)
  stds = composed(first, hooks.reward_model.scores(first, batch["questions"])).reshape(-1, g).std(axis=1)
  assert stds.max() > 1.01 * stds.min(), stds  # the RM's scores differ across groups
  tolerance = float(np.sqrt(stds.min() * stds.max()))
  recorder, outputs = Recorder(hooks.reward_model), []

  def recording_assemble(*arrays):
    outputs.append(np.asarray(arrays[1]))  # the rm_scores the assembly is given
    return hooks.assemble(*arrays)

  built = with_config(built, grpo_config(sft, rm, **extra, **{"dapo.filter_min_std": tolerance}),
                      reward_model=recorder, assemble=recording_assemble)
  _, metrics = built.hooks.train_step(built.training, state, batch)
  kept, dropped = [], []
  for r, (ro, scores) in enumerate(recorder.calls):
    flags = composed(ro, scores).reshape(-1, g).std(axis=1) > tolerance
    kept += [(r, k) for k in np.flatnonzero(flags)]
    dropped += [(r, k) for k in np.flatnonzero(~flags)]
    if r == 0:
      np.testing.assert_array_equal(ro["tokens"], np.asarray(jax.device_get(first["tokens"])))  # the same round 0
      assert flags.sum() == 1, flags
  assert metrics["dapo_rounds"] == len(recorder.calls) >= 2
  assert metrics["dapo_groups_informative"] == len(kept)
  picks = (kept + dropped)[:2]
  want = np.concatenate([recorder.calls[r][1][k * g:(k + 1) * g] for r, k in picks])
  np.testing.assert_array_equal(outputs[0], want)


def test_dynamic_sampling_on_the_verifier_score_with_a_reward_model_is_refused(runs, tmp_path):
  sft, rm = runs
  with pytest.raises(ConfigError, match=r"^config\.dapo\.filter_metric='score': .* use 'reward'") as e:
    jaxpt.build("grpo", grpo_config(sft, rm, **{"dapo.dynamic_sampling": True}), str(tmp_path))
  assert "\n" not in str(e.value)
