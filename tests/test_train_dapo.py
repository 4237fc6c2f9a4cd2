"""DAPO in the GRPO trainer: dynamic sampling drops all-right / all-wrong groups and refills from the deterministic
refill stream, the cap, overlong filtering and the overlong punishment on real rollouts, bitwise resume.

The policy is a from-scratch micro model (no SFT: fast); its verifier scores are scripted per prompt so that the
group kinds are known: answer % 3 == 0 -> all wrong, 1 -> all right, 2 -> mixed (rollout i right iff i is even).
"""

import dataclasses
import re

import jax
import numpy as np
import pytest

from experiments.configs import dapo_tiny
import jaxpt
from jaxpt.config import ConfigError, from_section
from jaxpt.rl import dapo
from jaxpt.trainers.grpo import GRPORunConfig, replace_hooks
from jaxpt.engine.metrics import read_metrics

G, B, T = 4, 4, 8
OVERRIDES = {
    "model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
    "model.num_kv_heads": 2, "model.mlp_dim": 64, "model.max_seq_len": 64, "model.norm_scheme": "pre",
    "task.num_steps": 1, "task.max_value": 9, "task.ops": "+", "task.train_size": 64, "task.test_size": 8,
    "steps": 4, "log_every": 1, "eval_every": 0, "checkpoint_every": 2, "progress": False,
    "data.prompts_per_step": B, "data.max_prompt_len": 40, "data.eval_prompts": 0,
    "sampling.max_new_tokens": T, "grpo.group_size": G, "grpo.minibatches": 2,
    "optim.learning_rate": 1e-2, "optim.warmup_steps": 0, "dapo.max_rounds": 4, "dapo.overlong_buffer": 4,
    # the static sampler: `script` replaces the collector's `rollouts`, which the engine's streamed rounds do not
    # call (they are tested against these with a scripted verifier instead)
    "engine.enabled": False,
}


def dapo_config(**extra):
  config = dapo_tiny.get_config()
  config.update_from_flattened_dict({**OVERRIDES, **extra})
  return config


def kind(answer: str) -> str:
  return ("wrong", "right", "mixed")[int(answer) % 3]


def script(trainer, log=None):
  """trainer.hooks.collector.rollouts with scores (and rewards, labels) by `kind`; the overlong punishment kept. Logs
  each call's answers when `log` is a list."""
  real = type(trainer.hooks.collector).rollouts

  def rollouts(params, batch, rng):
    ro = real(trainer.hooks.collector, params, batch, rng)
    scores = np.asarray([{"wrong": 0, "right": 1, "mixed": 1 - i % 2}[kind(a)] for a in batch["answers"]
                         for i in range(G)], np.float32)
    ro = dict(ro, rewards=ro["rewards"] - ro["scores"] + scores, scores=scores, labels=(scores > 0).astype(np.int32))
    if log is not None:
      log.append(dict(ro, answers=list(batch["answers"])))
    return ro

  trainer.hooks.collector.rollouts = rollouts
  return trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  return jaxpt.build("grpo", dapo_config(), str(tmp_path_factory.mktemp("dapo")))


def with_dapo(trainer, **fields):
  """A copy of `trainer` (sharing its compiled functions) with config.dapo fields replaced, scores scripted."""
  config = dataclasses.replace(trainer.config, dapo=dataclasses.replace(trainer.config.dapo, **fields))
  return replace_hooks(trainer, config=config)


def first_step_with_both_dropped_kinds(collector):
  for step in range(50):
    kinds = [kind(a) for a in collector.prompts.batch(step)["answers"]]
    if "right" in kinds and "wrong" in kinds and "mixed" in kinds:
      return step
  raise AssertionError("no step mixes the kinds")


def test_dynamic_sampling_drops_uninformative_groups_and_refills_from_the_refill_stream(trainer):
  log = []
  t = script(with_dapo(trainer), log)
  step = first_step_with_both_dropped_kinds(t.hooks.collector)
  rng = jax.random.PRNGKey(3)
  ro, metrics = t.hooks.collector.step_rollouts(t.training.init_state().params, t.hooks.collector.prompts.batch(step),
                                                step, rng)
  rounds = metrics["dapo_rounds"]
  assert rounds == len(log) >= 2 and metrics["dapo_groups_drawn"] == rounds * B
  assert log[0]["answers"] == t.hooks.collector.prompts.batch(step)["answers"]  # round 0: the step's own prompts
  for r in range(1, rounds):  # round r: the refill stream at its fixed position
    assert log[r]["answers"] == t.hooks.collector.prompts.refill_batch(step * (4 - 1) + r - 1)["answers"]
  drawn = [(r, g) for r in range(rounds) for g in range(B)]
  informative = [(r, g) for r, g in drawn if kind(log[r]["answers"][g]) == "mixed"]
  assert metrics["dapo_groups_informative"] == len(informative) >= B and metrics["dapo_groups_filled"] == 0
  assert any(kind(log[0]["answers"][g]) == k for g in range(B) for k in ("right", "wrong"))  # some were dropped
  want = informative[:B]
  for key in ("tokens", "old_logp", "mask", "prompt_tokens", "rewards"):
    np.testing.assert_array_equal(ro[key], np.concatenate([log[r][key][g * G:(g + 1) * G] for r, g in want]))
  assert len(ro["scores"]) == B * G
  np.testing.assert_array_equal(ro["group_ids"], np.repeat(np.arange(B), G))
  assert metrics["dapo_step_accuracy"] == pytest.approx(float(log[0]["scores"].mean()))
  # the same call again draws exactly the same (the draws are a function of the step and the key)
  again, _ = t.hooks.collector.step_rollouts(t.training.init_state().params, t.hooks.collector.prompts.batch(step),
                                             step, rng)
  np.testing.assert_array_equal(again["tokens"], ro["tokens"])


def scripted_verifier(response: str, answer: str) -> float:
  """Groups of known kinds from the real verifier's seat: right / wrong by the answer, mixed by the response."""
  return {"wrong": 0.0, "right": 1.0, "mixed": float(len(response) % 2)}[kind(answer)]


def test_refill_rounds_through_the_engine_draw_what_the_static_sampler_draws(tmp_path_factory):
  """With engine.enabled a step's generation rounds stream through one engine (`Engine.rounds`, round r + 1's
  rollouts starting in round r's tail), or with engine.stream_rounds off one engine call per round: the trained
  rows, their scores and the DAPO metrics equal the static sampler's drawing per-rollout keys (sampling.row_keys),
  refills included."""
  collectors = {}
  engine = {"engine.enabled": True, "engine.num_slots": 6, "engine.page_size": 8}
  for name, extra in (("static", {}), ("engine", engine), ("per_round", {**engine, "engine.stream_rounds": False})):
    built = jaxpt.build("grpo", dapo_config(**{"sampling.row_keys": True, **extra}), str(tmp_path_factory.mktemp(name)))
    built.hooks.collector.reward_fn = scripted_verifier
    collectors[name] = built.hooks.collector, built.training.init_state().params
  assert collectors["engine"][0].engine is not None and collectors["per_round"][0].engine is None
  static, params = collectors["static"]
  step = first_step_with_both_dropped_kinds(static)
  want, want_metrics = static.step_rollouts(params, static.prompts.batch(step), step, jax.random.PRNGKey(3))
  assert want_metrics["dapo_rounds"] >= 2
  for name in ("engine", "per_round"):
    collector, params = collectors[name]
    assert collector.sampler_memory["peak_mib"] > 0
    got, got_metrics = collector.step_rollouts(params, collector.prompts.batch(step), step, jax.random.PRNGKey(3))
    assert got_metrics == want_metrics, name
    for key in ("prompt_tokens", "tokens", "mask", "scores", "rewards", "group_ids", "lengths"):
      np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=f"{name} {key}")
    np.testing.assert_allclose(np.asarray(got["old_logp"]), np.asarray(want["old_logp"]), rtol=1e-5, atol=1e-5)


def test_at_the_cap_fill_trains_on_dropped_groups_and_error_stops(trainer):
  t = script(with_dapo(trainer, max_rounds=1, at_cap="fill"))
  step = first_step_with_both_dropped_kinds(t.hooks.collector)
  params = t.training.init_state().params
  state, metrics = t.train_step(t.training.init_state(), t.hooks.collector.prompts.batch(step))
  mixed = sum(kind(a) == "mixed" for a in t.hooks.collector.prompts.batch(step)["answers"])
  assert metrics["dapo_rounds"] == 1 and metrics["dapo_groups_filled"] == B - mixed
  assert np.isfinite(metrics["loss"]) and int(state.step) == 1
  t = script(with_dapo(trainer, max_rounds=1, at_cap="error"))
  with pytest.raises(RuntimeError, match=re.escape(f"gave {mixed} informative groups of the {B} needed")):
    t.hooks.collector.step_rollouts(params, t.hooks.collector.prompts.batch(step), step, jax.random.PRNGKey(0))


def test_overlong_filtering_masks_exactly_the_truncated_rows_and_the_punishment_follows_the_formula(trainer):
  """The sampler's output is edited so that the lengths are known: row % 3 == 0 stops with EOS after 3 tokens,
  row % 3 == 1 ends with EOS exactly at the cap (complete, not truncated), the others run to the cap without EOS."""
  eos, pad = trainer.tokenizer.eos_id, trainer.tokenizer.pad_id
  real_sample = trainer.hooks.collector.sample

  def sample(params, tokens, mask, rng):
    out = real_sample(params, tokens, mask, rng)
    toks, m = np.asarray(out.tokens).copy(), np.ones(out.mask.shape, np.float32)
    toks[toks == eos] = eos + 1  # no EOS but the ones placed here
    rows = np.arange(len(toks))
    toks[rows % 3 == 0, 2], toks[rows % 3 == 0, 3:], m[rows % 3 == 0, 3:] = eos, pad, 0
    toks[rows % 3 == 1, -1] = eos
    return out.replace(tokens=jax.numpy.asarray(toks), mask=jax.numpy.asarray(m),
                       lengths=jax.numpy.asarray(m.sum(1).astype(np.int32)),
                       logprobs=out.logprobs * m)

  t = script(replace_hooks(with_dapo(trainer, dynamic_sampling=False, overlong_filtering=True), sample=sample))
  captured = {}
  real_updates = t.hooks._policy_updates

  def policy_updates(state, experience, *args):
    captured.update(experience)
    return real_updates(state, experience, *args)

  t.hooks._policy_updates = policy_updates
  state, metrics = t.train_step(t.training.init_state(), t.hooks.collector.prompts.batch(0))
  rows = np.arange(B * G)
  want_truncated = rows % 3 == 2
  lengths = np.where(rows % 3 == 0, 3, T)
  np.testing.assert_array_equal(captured["mask"].sum(1) == 0, want_truncated)
  np.testing.assert_array_equal(captured["mask"][~want_truncated].sum(1), lengths[~want_truncated])
  assert metrics["truncated_frac"] == pytest.approx(want_truncated.mean())
  ro = t.hooks.collector.rollouts(state.params, t.hooks.collector.prompts.batch(0), jax.random.PRNGKey(0))
  np.testing.assert_array_equal(ro["truncated"], want_truncated)
  penalty = np.asarray([min(-(n - (T - 4)) / 4, 0.0) for n in lengths])  # L_max 8, L_cache 4: 0 at 3, -1 at 8
  np.testing.assert_allclose(ro["rewards"] - ro["scores"], penalty, rtol=1e-6)
  assert metrics["overlong_penalty_mean"] == pytest.approx(penalty.mean())


def test_resume_with_dynamic_sampling_reaches_the_same_parameters(trainer, tmp_path):
  t = script(with_dapo(trainer))
  uninterrupted = jaxpt.train("grpo", t.config, str(tmp_path / "whole"), built=t)
  first = jaxpt.train("grpo", t.config, str(tmp_path / "resumed"), built=t, stop_at=2)
  assert int(first.state.step) == 2
  second = jaxpt.train("grpo", t.config, str(tmp_path / "resumed"), built=t)  # restores step 2 from the checkpoint
  assert int(second.state.step) == t.config.steps
  for got, want in zip(jax.tree.leaves(second.state.params), jax.tree.leaves(uninterrupted.state.params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  whole, resumed = read_metrics(str(tmp_path / "whole")), read_metrics(str(tmp_path / "resumed"))
  assert [r["dapo_rounds"] for r in whole] == [r["dapo_rounds"] for r in resumed]
  assert max(r["dapo_rounds"] for r in whole) > 1  # refills happened
  assert [r["pg_loss"] for r in whole] == [r["pg_loss"] for r in resumed]


@pytest.mark.parametrize("field, value, message", [
    ("dapo.overlong_buffer", 9, "config.dapo.overlong_buffer=9: must be <= config.sampling.max_new_tokens=8"),
    ("dapo.max_rounds", 0, "config.dapo.max_rounds=0: must be >= 1"),
    ("clipo.in_loss_coef", 0.1, "config.dapo.overlong_filtering=True: cannot be combined with "
                                "config.clipo.in_loss_coef > 0"),
])
def test_config_errors_name_the_field(field, value, message):
  config = dapo_config(**{"dapo.overlong_filtering": True, "clipo.enabled": True})
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ConfigError, match=re.escape(message)) as error:
    from_section(GRPORunConfig, config, "config")
  assert "\n" not in str(error.value)


def test_dapo_tiny_is_grpo_tiny_with_dapo_settings():
  config = from_section(GRPORunConfig, dapo_tiny.get_config(), "config")
  assert (config.grpo.eps_lo, config.grpo.eps_hi, config.grpo.agg, config.grpo.kl_coef) == (0.2, 0.28,
                                                                                             "token-mean", 0.0)
  assert config.dapo == dapo.DAPOConfig(dynamic_sampling=True, max_rounds=3, overlong_buffer=8)
