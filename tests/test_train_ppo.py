"""PPO with a learned critic end to end: a micro SFT run, a micro reward model started from it (so the two share one
tokenizer), then `jaxpt ppo` rewarded by that RM with the critic started from it: the critic-only warm-up (its loss
falls, the policy does not move), the policy and critic updates after it, a bitwise resume and the refusals."""

import os

import jax
import numpy as np
import pytest

from experiments.configs import ppo_tiny
import jaxpt
from jaxpt.config import ConfigError
from jaxpt.engine.metrics import read_metrics
from jaxpt.trainers.grpo import REWARD_HACKING_PNG
from tests.runs import flat, sft_and_reward_model

MODEL = {"vocab_size": 512, "d_model": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "mlp_dim": 64,
         "max_seq_len": 64}
TASK = {"task.num_steps": 1, "task.max_value": 9, "task.ops": "+", "task.train_size": 64, "task.test_size": 8}
QUIET = {"log_every": 1, "eval_every": 0, "progress": False, "optim.warmup_steps": 0}
STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(sft workdir, rm workdir): 3 SFT steps, then 2 BT steps of an RM whose backbone and tokenizer are the SFT
  run's."""
  return sft_and_reward_model(tmp_path_factory, MODEL, TASK, QUIET)


def ppo_config(sft: str, rm: str, **extra):
  config = ppo_tiny.get_config()
  config.update_from_flattened_dict({**flat("model", MODEL), **TASK, **QUIET, "steps": STEPS, "checkpoint_every": 2,
                                     "init_from": sft, "data.prompts_per_step": 4, "data.max_prompt_len": 32,
                                     "data.eval_prompts": 0, "sampling.max_new_tokens": 16, "ppo.minibatches": 2,
                                     "ppo.epochs": 2, "ppo.value_warmup_steps": 2, "ppo.critic_init": rm,
                                     "ppo.critic_learning_rate": 3e-3, "optim.learning_rate": 1e-3,
                                     "reward.model": rm, "reward.verifier_weight": 0.0, **extra})
  return config


@pytest.fixture(scope="module")
def ppo_run(runs, tmp_path_factory):
  """(config, built, workdir, result): an uninterrupted run of STEPS steps (2 of them the critic's warm-up)."""
  config = ppo_config(*runs)
  workdir = str(tmp_path_factory.mktemp("ppo"))
  built = jaxpt.build("ppo", config, workdir)
  return config, built, workdir, jaxpt.train("ppo", config, workdir, built=built)


def test_warmup_moves_only_the_critic_and_its_loss_falls(ppo_run):
  config, built, _, _ = ppo_run
  state = built.init_state()
  policy0 = jax.tree.map(np.asarray, state.params["policy"])
  critic0 = jax.tree.map(np.asarray, state.params["critic"])
  policy_opt0 = jax.tree.map(np.asarray, state.opt_state["policy"])
  batch = built.hooks.collector.prompts.batch(0)
  losses = []
  for _ in range(3):  # the same prompts three times: the critic fits their returns
    state, metrics = built.hooks.train_step(built.training, state.replace(step=state.step * 0), batch)
    assert metrics["value_warmup"] == 1.0 and "pg_loss" not in metrics and "rm_score" in metrics
    losses.append(metrics["value_loss"])
  assert losses[-1] < losses[0], losses
  for got, want in zip(jax.tree.leaves(state.params["policy"]), jax.tree.leaves(policy0)):
    np.testing.assert_array_equal(np.asarray(got), want)  # frozen, bit for bit
  for got, want in zip(jax.tree.leaves(state.opt_state["policy"]), jax.tree.leaves(policy_opt0)):
    np.testing.assert_array_equal(np.asarray(got), want)  # its optimizer neither counts nor accumulates moments
  assert any(not np.array_equal(np.asarray(g), w)
             for g, w in zip(jax.tree.leaves(state.params["critic"]), jax.tree.leaves(critic0)))
  # the critic started from the reward model: backbone as it is, the score head as the value head
  from jaxpt.engine.saved_model import load_run
  rm = load_run(config.ppo.critic_init)
  for got, want in zip(jax.tree.leaves(critic0["backbone"]), jax.tree.leaves(rm.params["backbone"])):
    np.testing.assert_array_equal(got, np.asarray(want))
  np.testing.assert_array_equal(critic0["head"]["kernel"], np.asarray(rm.params["head"]["kernel"]))


def test_critic_value_is_the_reward_models_score_of_the_prefix(ppo_run):
  """V_t of a rollout (the critic started from the RM, before any update) is the RM's score of prompt + response
  tokens before t, scored in the RM's own layout (right-padded, positions from 0, the score at the last token)."""
  from jaxpt.models.reward import RewardModel
  from jaxpt.trainers.ppo import critic_values

  config, built, _, _ = ppo_run
  state = built.init_state()
  critic_config = built.hooks.critic_start.config
  ro = built.hooks.collector.rollouts(state.params["policy"], built.hooks.collector.prompts.batch(0),
                                     jax.random.PRNGKey(3))
  keys = ("prompt_tokens", "prompt_mask", "tokens", "mask")
  values = np.asarray(jax.jit(lambda p, *a: critic_values(critic_config, p, *a))(
      state.params["critic"], *(ro[k] for k in keys)))
  host = {k: np.asarray(jax.device_get(ro[k])) for k in keys}
  score = jax.jit(lambda tokens, last: RewardModel(critic_config).apply({"params": state.params["critic"]}, tokens,
                                                                         last)[0])
  checked = 0
  for b in range(host["tokens"].shape[0]):
    prompt = host["prompt_tokens"][b][host["prompt_mask"][b] > 0]
    for t in range(int(host["mask"][b].sum())):
      prefix = np.concatenate([prompt, host["tokens"][b][:t]])
      row = np.zeros((1, critic_config.max_seq_len), np.int32)
      row[0, :len(prefix)] = prefix
      want = float(score(row, np.array([len(prefix) - 1], np.int32))[0])
      np.testing.assert_allclose(values[b, t], want, rtol=1e-4, atol=1e-5, err_msg=f"row {b}, token {t}")
      checked += 1
  assert checked > 0 and np.all(values[host["mask"] == 0] == 0)


def test_run_logs_warmup_then_policy_updates(ppo_run):
  _, _, workdir, result = ppo_run
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  assert [r["value_warmup"] for r in rows] == [1.0, 1.0, 0.0, 0.0]
  for row in rows:
    assert np.isfinite(row["value_loss"]) and row["response_length"] > 0
    for key in ("rm_score", "reward_mean", "kl_ref", "vf_clip_frac", "returns_mean"):
      assert key in row, key
  for row in rows[2:]:
    assert abs(row["ppo_kl"]) < 0.05 and 0.0 <= row["clip_frac"] <= 1.0  # sampler and teacher forcing agree
  assert abs(rows[0]["kl_ref"]) < 1e-6  # the policy has not moved yet (sampler vs teacher forcing: rounding)
  assert os.path.getsize(os.path.join(workdir, REWARD_HACKING_PNG)) > 0  # RM score vs gold vs length, as GRPO's


def test_resume_is_bitwise(ppo_run, tmp_path):
  """Stopped after step 2 (the end of the warm-up) and resumed: params of policy and critic and both optimizer
  states equal the uninterrupted run's, bit for bit."""
  config, built, _, uninterrupted = ppo_run
  workdir = str(tmp_path)
  first = jaxpt.train("ppo", config, workdir, built=built, stop_at=2)
  assert int(first.state.step) == 2
  second = jaxpt.train("ppo", config, workdir, built=built)
  assert int(second.state.step) == STEPS
  got, want = (jax.tree.leaves((r.state.params, r.state.opt_state)) for r in (second, uninterrupted))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # one more PPO build; GRPO's engine tests (tests/test_train_grpo.py) are the default ones
def test_ppo_samples_through_the_engine(runs, tmp_path):
  """engine.enabled: PPO's collector draws its rollouts through the rollout engine, the same rollouts as the static
  sampler with per-rollout keys, and a step trains on them."""
  import dataclasses

  from jaxpt.rl.engine import Engine
  from jaxpt.rl.sampler import make_sampler

  config = ppo_config(*runs, **{"engine.enabled": True, "engine.num_slots": 4, "engine.page_size": 8})
  built = jaxpt.build("ppo", config, str(tmp_path))
  collector, state = built.hooks.collector, built.init_state()
  assert isinstance(collector.sample, Engine)
  rng, batch = jax.random.PRNGKey(5), collector.prompts.batch(0)
  ro = collector.rollouts(state.params["policy"], batch, rng)
  sampling = dataclasses.replace(built.config.sampling, eos_id=built.tokenizer.eos_id, pad_id=built.tokenizer.pad_id)
  static = make_sampler(built.config.model, sampling, built.config.data.max_prompt_len,
                        group_size=built.config.group_size, row_keys=True)
  want = static(state.params["policy"], ro["prompt_tokens"], ro["prompt_mask"], rng)
  np.testing.assert_array_equal(np.asarray(ro["tokens"]), np.asarray(want.tokens))
  np.testing.assert_allclose(np.asarray(ro["old_logp"]), np.asarray(want.logprobs), rtol=1e-5, atol=1e-5)
  state, metrics = built.train_step(state, batch)
  assert int(state.step) == 1 and np.isfinite(metrics["value_loss"])


def test_bad_input_names_the_field(runs, tmp_path):
  sft, rm = runs
  cases = [({"ppo.critic_init": sft}, "config.ppo.critic_init"),  # an LM run starts no critic
           ({"ppo.critic_init": str(tmp_path / "none")}, "config.ppo.critic_init"),
           ({"ppo.critic_init": "hf:/models/none"}, "config.ppo.critic_init"),  # no score head there
           ({"ppo.minibatches": 3}, "ppo.minibatches"),
           ({"ppo.group_size": 2, "ppo.minibatches": 8}, "ppo.minibatches"),  # 8 rollouts, but 4 groups
           ({"ppo.gamma": 1.5}, "config.ppo.gamma"),
           ({"ppo.value_warmup_steps": STEPS}, "ppo.value_warmup_steps"),
           ({"init_from": rm}, "init_from")]  # a reward model still starts no policy
  for extra, field in cases:
    with pytest.raises(ConfigError) as e:
      jaxpt.build("ppo", ppo_config(sft, rm, **extra), str(tmp_path / "w"))
    assert field in str(e.value) and "\n" not in str(e.value), (extra, str(e.value))


def test_a_critic_from_a_reward_model_of_other_tokens_is_refused(runs):
  """A policy of another tokenizer than the RM's (here Llama's): the critic cannot start from that RM (one line
  naming ppo.critic_init, saying why and what to do), before any compile."""
  from jaxpt.config import from_section
  from jaxpt.data.tokenizer import load_tokenizer
  from jaxpt.engine.builder import training_mesh
  from jaxpt.engine.saved_model import load_run
  from jaxpt.trainers.ppo import load_critic_start
  from jaxpt.trainers.ppo_config import PPORunConfig

  config = from_section(PPORunConfig, ppo_config(*runs), "config")
  mesh = training_mesh(config, config.minibatch_rows)
  other = load_tokenizer(os.path.join(os.path.dirname(__file__), "assets", "hf", "llama"))
  with pytest.raises(ConfigError, match=r"ppo\.critic_init.*per-token GAE.*leave ppo\.critic_init empty") as e:
    load_critic_start(config, mesh, other)
  assert "\n" not in str(e.value)
  assert load_critic_start(config, mesh, load_run(runs[1]).tokenizer) is not None  # the RM's own tokenizer


def test_a_critic_in_a_grpo_run_is_refused():
  from experiments.configs import grpo_tiny
  from jaxpt.config import from_section
  from jaxpt.trainers.grpo_config import GRPORunConfig

  config = grpo_tiny.get_config()
  config.ppo = {"critic_init": "/rm"}
  with pytest.raises(ConfigError, match=r"^config\.ppo: unknown field"):
    from_section(GRPORunConfig, config, "config")


# -- a PPO run's policy is usable: jaxpt.load, export-hf, init_from (the critic is not part of any) -------------------

def _policy_logits(config, params, ids):
  """float32 [batch, seq, vocab]: TransformerLM of the run's model section applied to `params` directly (jitted, as
  `Model.logits` is: eager and jitted float32 programs may differ in the last bit)."""
  from jaxpt.config import from_section
  from jaxpt.models.config import ModelConfig
  from jaxpt.models.transformer import TransformerLM

  model = TransformerLM(from_section(ModelConfig, config.model.to_dict(), "model"))
  return np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x).astype(np.float32))(params, ids))


def _ids(config):
  return np.random.default_rng(0).integers(0, config.model.vocab_size, (2, 12)).astype(np.int32)


def test_load_of_a_ppo_run_is_its_policy(ppo_run):
  """`jaxpt.load(PPO_RUN)`: a language model whose params are the checkpoint's policy (the critic is not read), its
  logits those of TransformerLM applied to the policy params directly; `generate` samples from it."""
  config, _, workdir, result = ppo_run
  policy = result.state.params["policy"]  # the uninterrupted run's final state: its last checkpoint
  model = jaxpt.load(workdir)
  assert model.kind == "lm" and jax.tree.structure(model.params) == jax.tree.structure(policy)
  for got, want in zip(jax.tree.leaves(model.params), jax.tree.leaves(policy)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  ids = _ids(config)
  np.testing.assert_array_equal(np.asarray(model.logits(ids)), _policy_logits(config, policy, ids))
  assert jaxpt.load(workdir, kind="lm").kind == "lm"
  with pytest.raises(ConfigError, match="holds a language model, not a reward model"):
    jaxpt.load(workdir, kind="reward")
  (text,) = model.generate(["1 + 2 ="], max_new_tokens=4)
  assert isinstance(text, str)


def test_export_hf_of_a_ppo_run_writes_its_policy(ppo_run, tmp_path):
  from jaxpt.api import run_export_hf

  config, _, workdir, result = ppo_run
  out = str(tmp_path / "export")
  assert run_export_hf(workdir, None, out) == 0
  exported = jaxpt.load("hf:" + out)
  assert exported.kind == "lm" and exported.tokenizer is not None
  ids = _ids(config)
  np.testing.assert_array_equal(np.asarray(exported.logits(ids)),
                                _policy_logits(config, result.state.params["policy"], ids))


def test_init_from_a_ppo_run_starts_from_its_policy(ppo_run, tmp_path):
  """An SFT run with `init_from=PPO_RUN` starts from exactly the policy's params (and copies its tokenizer)."""
  from experiments.configs import sft_tiny

  ppo_config_, _, workdir, result = ppo_run
  config = sft_tiny.get_config()
  config.update_from_flattened_dict({**flat("model", ppo_config_.model.to_dict()), **TASK, **QUIET, "steps": 1,
                                     "init_from": workdir, "data.seq_len": 48, "data.batch_size": 8,
                                     "data.eval_batches": 0, "decode.eval_problems": 0, "decode.prompt_len": 32,
                                     "decode.max_new_tokens": 16})
  built = jaxpt.build("sft", config, str(tmp_path / "sft"))
  params = built.training.init_state().params
  policy = result.state.params["policy"]
  assert jax.tree.structure(params) == jax.tree.structure(policy)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(policy)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow
def test_eval_of_a_ppo_run_whose_reward_model_is_gone(ppo_run, tmp_path, capfd):
  """`jaxpt eval` of a PPO run rewarded by, and with a critic started from, a reward model that was moved away:
  one note per field, and the same eval numbers as with the reward model in place (the eval scores the policy with
  the verifier; its params alone are restored). The run had no eval set: each copy's record gains one."""
  import json
  import shutil

  from jaxpt import progress
  from jaxpt.engine.evaluate import evaluate_run

  _, _, workdir, _ = ppo_run
  rows = {}
  for name in ("in_place", "gone"):
    run = str(tmp_path / name)
    shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval"))
    with open(f"{run}/config.json") as f:
      recorded = json.load(f)
    recorded["data"].update(eval_prompts=4, max_prompt_len=47)  # longer test prompts; + 16 + EOS = the RM's 64
    recorded["allow_changes"] = "data.eval_prompts,data.max_prompt_len"
    if name == "gone":
      recorded["reward"]["model"] = recorded["ppo"]["critic_init"] = str(tmp_path / "moved_rm")
    with open(f"{run}/config.json", "w") as f:
      json.dump(recorded, f)
    progress.enable("eval")
    try:
      rows[name] = evaluate_run(run)
    finally:
      progress.enable(None)
    notes = [line for line in capfd.readouterr().err.splitlines() if "is gone" in line]
    assert len(notes) == (2 if name == "gone" else 0), notes
  assert rows["gone"] == rows["in_place"] and any(k.startswith("eval_accuracy") for k in rows["gone"])


# -- LoRA: the DIR paper's RLHF recipe is PPO with LoRA (rank 8, alpha 32); here rank 4 at the micro size -------------

LORA = {"lora.rank": 4, "lora.alpha": 16.0, "steps": 2, "checkpoint_every": 1, "ppo.value_warmup_steps": 0}


def _paths(tree):
  return [(jax.tree_util.keystr(path), np.asarray(leaf)) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def _is_adapter(path):
  return path.endswith(("['lora_a']", "['lora_b']"))


@pytest.fixture(scope="module")
def lora_runs(runs, tmp_path_factory):
  """(config, built, initial params, the uninterrupted run, the run stopped after step 1 and resumed): 2 PPO steps
  with LoRA on policy and critic (no value warm-up), the critic started from the RM run."""
  config = ppo_config(*runs, **LORA)
  root = tmp_path_factory.mktemp("ppo_lora")
  built = jaxpt.build("ppo", config, str(root / "whole"))
  initial = jax.device_get(built.init_state().params)  # the hooks': the critic from the RM
  whole = jaxpt.train("ppo", config, str(root / "whole"), built=built)
  jaxpt.train("ppo", config, str(root / "split"), built=built, stop_at=1)
  resumed = jaxpt.train("ppo", config, str(root / "split"), built=built)
  return config, built, initial, whole, resumed


def test_ppo_with_lora_trains_the_adapters_and_the_value_head_alone(lora_runs, runs):
  """The base kernels of policy and critic are bit for bit their start (the SFT run's params; the RM's backbone);
  the adapters of both and the critic's value head move, and only they have AdamW moments; a resumed run is the
  uninterrupted one, bit for bit."""
  from jaxpt.engine.saved_model import load_run
  from jaxpt.nn import lora as lora_lib

  _, _, initial, whole, resumed = lora_runs
  final = jax.device_get(whole.state.params)
  changed = {path for (path, a), (_, b) in zip(_paths(initial), _paths(final)) if not np.array_equal(a, b)}
  assert all(_is_adapter(p) or p.startswith("['critic']['head']") for p in changed), changed
  assert {"['critic']['head']['kernel']"} < changed
  for part in ("['policy']", "['critic']['backbone']"):
    assert any(p.startswith(part) and p.endswith("['lora_b']") for p in changed), (part, changed)
  sft, rm = (load_run(path).params for path in runs)
  for got, want in ((final["policy"], sft), (final["critic"]["backbone"], rm["backbone"])):
    got = lora_lib.base_params(got)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(np.testing.assert_array_equal, got, jax.device_get(want))
  moments = [p for p, _ in _paths(whole.state.opt_state) if ".mu" in p or ".nu" in p]
  assert moments and all(_is_adapter(p) or (p.startswith("['critic']") and "['head']['kernel']" in p)
                             for p in moments), moments
  assert any(p.startswith("['critic']") and "['head']" in p for p in moments)
  assert len(moments) < len(_paths(final))
  got, want = (jax.tree.leaves((r.state.params, r.state.opt_state)) for r in (resumed, whole))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ppo_with_lora_references_the_base_model(lora_runs, runs):
  """No copy of the policy is kept: the reference is the policy's base (adapters off), whose log-probs of a
  rollout are those of the plain model on the SFT run's params, while the trained (merged) policy's are not."""
  from jaxpt.engine.saved_model import load_run
  from jaxpt.models.transformer import TransformerLM
  from jaxpt.rl.logprobs import response_logprobs
  from jaxpt.trainers.grpo import rollout_params

  config, built, _, whole, _ = lora_runs
  hooks = built.hooks
  assert hooks.ref_params is None and built.config.ppo.uses_reference
  policy = whole.state.params["policy"]
  ro = hooks.collector.rollouts(rollout_params(hooks.policy, policy), hooks.collector.prompts.batch(0),
                                jax.random.PRNGKey(5))
  arrays = [ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")]
  ref = np.asarray(hooks.collector.logprobs(hooks.reference_params(policy), *arrays))
  plain = TransformerLM(built.config.model)
  want = np.asarray(jax.jit(lambda p, *a: response_logprobs(plain, p, *a, temperature=config.sampling.temperature))(
      load_run(runs[0]).params, *arrays))
  np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-6)
  trained = np.asarray(hooks.collector.logprobs(rollout_params(hooks.policy, policy), *arrays))
  assert np.abs(trained - want).max() > 1e-4  # the adapters moved the policy away from its reference


def test_ppo_takes_the_lora_section():
  """`jaxpt ppo --config.lora.rank=4` is a LoRA run (it was refused: 'jaxpt ppo trains every parameter')."""
  from jaxpt.config import from_section
  from jaxpt.engine.trainers import TRAINERS
  from jaxpt.trainers.ppo_config import PPORunConfig

  config = ppo_tiny.get_config()
  config.update_from_flattened_dict({"lora.rank": 4})
  assert TRAINERS.get("ppo").lora and from_section(PPORunConfig, config, "config").lora.rank == 4


@pytest.mark.slow  # one more PPO build
def test_ppo_with_qlora_and_a_critic_from_the_policy(runs, tmp_path):
  """QLoRA (int8 base, rollouts unmerged on the codes) with the critic started from the policy: the critic's frozen
  base is the policy's (the same codes), its adapters its own; 2 steps keep every code and move the adapters."""
  from jaxpt.nn import lora as lora_lib

  config = ppo_config(*runs, **LORA, **{"lora.base_quant": "int8", "lora.base_quant_block": 16,
                                        "ppo.critic_init": ""})
  built = jaxpt.build("ppo", config, str(tmp_path))
  assert built.config.lora.samples_unmerged
  initial = jax.device_get(built.init_state().params)
  policy, critic = initial["policy"], initial["critic"]["backbone"]
  jax.tree.map(np.testing.assert_array_equal, lora_lib.base_params(critic), lora_lib.base_params(policy))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(lora_lib.adapter_params(critic)),
                                                      jax.tree.leaves(lora_lib.adapter_params(policy))))
  result = jaxpt.train("ppo", config, str(tmp_path), built=built)
  final = jax.device_get(result.state.params)
  changed = {path for (path, a), (_, b) in zip(_paths(initial), _paths(final)) if not np.array_equal(a, b)}
  assert changed and all(_is_adapter(p) or p.startswith("['critic']['head']") for p in changed), changed
  assert any("kernel_q" in p for p, _ in _paths(final))
  rows = read_metrics(str(tmp_path))
  assert len(rows) == 2 and all(np.isfinite(r["value_loss"]) and np.isfinite(r["kl_ref"]) for r in rows)
  assert abs(rows[0]["kl_ref"]) < 1e-5  # B = 0: the policy starts at its reference, the base


def test_a_steps_experience_is_the_plain_equations_of_its_rollouts(ppo_run, monkeypatch):
  """One policy step after the warm-up, from the run's final state: the experience its updates read is, in float64
  NumPy from the step's rollouts, the assembled scores at each row's last token minus kl_coef x k1 to the SFT
  start's log-probs (the reference, read here from the SFT run itself), GAE(gamma, lambda) over the critic's
  values, then whitening over the step's response tokens."""
  from jaxpt.engine.saved_model import load_run
  from tests.test_losses_value import np_gae, np_shaped_rewards, np_whiten

  config, built, _, result = ppo_run
  calls = []
  experience = built.hooks.experience

  def recorded(critic, scores, old_logp, ref_logp, mask, *prompt_and_tokens):
    out, metrics = experience(critic, scores, old_logp, ref_logp, mask, *prompt_and_tokens)
    calls.append(jax.device_get((scores, old_logp, mask, prompt_and_tokens, out)))
    return out, metrics

  monkeypatch.setattr(built.hooks, "experience", recorded)
  assert int(result.state.step) >= config.ppo.value_warmup_steps
  state = jax.tree.map(lambda x: x.copy(), result.state)  # the step may donate its input; the fixture's stays whole
  built.hooks.train_step(built.training, state, built.hooks.collector.prompts.batch(int(state.step)))
  (scores, old_logp, mask, (prompt_tokens, prompt_mask, tokens), out), = calls
  mask = np.asarray(mask)
  reference = load_run(config.init_from).params
  ref_logp = np.asarray(built.hooks.collector.logprobs(reference, prompt_tokens, prompt_mask, tokens, mask))
  assert np.abs((old_logp - ref_logp) * mask).max() > 1e-4  # the policy has moved: the KL term is not 0
  rewards = np_shaped_rewards(np.asarray(scores, np.float64), old_logp, ref_logp, mask, config.ppo.kl_coef,
                              config.ppo.kl_kind)
  values = np.asarray(out["old_values"], np.float64)
  advantages, returns = np_gae(rewards, values, mask, config.ppo.gamma, config.ppo.lam)
  np.testing.assert_allclose(out["returns"], returns, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out["advantages"], np_whiten(advantages, mask), rtol=1e-4, atol=1e-4)
