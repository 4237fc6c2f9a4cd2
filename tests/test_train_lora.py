"""Every fine-tuning trainer with LoRA on (`config.lora.rank > 0`), on micro configs: only the adapters (and a reward
model's new head) change and have optimizer state, the loss falls, a killed run resumes bitwise, and DPO's / GRPO's
reference policy is the base with its adapters off (no copy of the params)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

import jaxpt
from experiments.configs import dpo_tiny, grpo_tiny, kto_tiny, rm_tiny, sft_lora_tiny
from jaxpt.config import from_section
from jaxpt.engine.init_from import init_params
from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.saved_model import load_run
from jaxpt.nn import lora as lora_lib
from jaxpt.trainers import dpo
from jaxpt.trainers.grpo import replace_hooks
from tests.micro_grpo import OVERRIDES as GRPO_MICRO
from tests.micro_grpo import even_length

LORA = {"lora.rank": 4, "lora.alpha": 8.0}
PAIRS = {"log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False, "model.d_model": 32,
         "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
         "data.synthetic_train_pairs": 128, "data.synthetic_test_pairs": 32, "data.batch_size": 16,
         "optim.learning_rate": 2e-2, "optim.warmup_steps": 1, **LORA}
SFT = {"steps": 12, "log_every": 3, "eval_every": 12, "checkpoint_every": 0, "progress": False,
       "model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
       "model.num_kv_heads": 2, "model.mlp_dim": 64, "model.max_seq_len": 80, "data.seq_len": 80,
       "data.batch_size": 16, "data.eval_batches": 1, "optim.warmup_steps": 2, "optim.learning_rate": 3e-2,
       "task.max_value": 15, "task.train_size": 200, "task.test_size": 16, "decode.prompt_len": 48,
       "decode.max_new_tokens": 32, "decode.eval_problems": 16, "decode.batch_size": 16, **LORA}


def config_of(module, overrides):
  config = module.get_config()
  config.update_from_flattened_dict(overrides)
  return config


def leaf_paths(tree):
  return {jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def changed_leaves(before, after):
  """The paths of the params leaves that differ between two params trees."""
  flat_after = dict(jax.tree_util.tree_leaves_with_path(after))
  return {jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(before)
          if not np.array_equal(np.asarray(leaf), np.asarray(flat_after[path]))}


def is_adapter(path):
  return path.endswith(("['lora_a']", "['lora_b']"))


def run_twice(trainer, config, root, stop_at):
  """(built, initial params, the whole run, the run killed at `stop_at` and resumed, the whole run's metrics, its
  workdir). GRPO is rewarded by the micro run's verifier (`even_length`: every group mixes rewards; the math
  verifier gives a from-scratch policy 0 everywhere, no advantage, no update)."""
  built = jaxpt.build(trainer, config, str(root / "whole"))
  if trainer == "grpo":
    built = replace_hooks(built, reward_fn=even_length)
  initial = jax.device_get(built.training.init_state().params)
  whole = jaxpt.train(trainer, config, str(root / "whole"), built=built)
  jaxpt.train(trainer, config, str(root / "split"), built=built, stop_at=stop_at)
  resumed = jaxpt.train(trainer, config, str(root / "split"), built=built)
  return built, initial, whole, resumed, read_metrics(str(root / "whole")), str(root / "whole")


def assert_bitwise(a, b):
  for x, y in zip(jax.tree.leaves((a.params, a.opt_state, a.aux)), jax.tree.leaves((b.params, b.opt_state, b.aux))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
  return run_twice("sft", config_of(sft_lora_tiny, SFT), tmp_path_factory.mktemp("sft_lora"), stop_at=5)


def test_sft_with_lora_trains_the_adapters_alone_and_resumes_bitwise(sft_runs):
  _, initial, whole, resumed, rows, _ = sft_runs
  assert rows[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
  changed = changed_leaves(initial, jax.device_get(whole.state.params))
  assert changed and all(is_adapter(p) for p in changed), changed
  moments = [p for p in leaf_paths(whole.state.opt_state) if ".mu" in p or ".nu" in p]
  assert moments and all(is_adapter(p) for p in moments), moments
  assert_bitwise(resumed.state, whole.state)


def test_sft_with_lora_evaluates_the_merged_policy(sft_runs):
  built, _, whole, _, rows, _ = sft_runs
  assert 0.0 <= rows[-1]["eval_answer_accuracy"] <= 1.0 and np.isfinite(rows[-1]["eval_loss"])
  params = whole.state.params
  tokens = (np.arange(8, dtype=np.int32)[None] * 7) % 100
  lora_logits = jax.jit(built.training.model.apply)({"params": params}, tokens)
  merged = jax.jit(built.training.model.clone(lora=None).apply)({"params": built.training.merged_params(params)},
                                                                 tokens)
  np.testing.assert_allclose(lora_logits, merged, rtol=1e-4, atol=1e-4)


def test_init_from_a_lora_run_starts_from_its_merged_params(sft_runs):
  built, _, whole, _, _, workdir = sft_runs
  plain = built.training.model.clone(lora=None)
  template = jax.jit(lambda: nn.meta.unbox(plain.init(jax.random.PRNGKey(1), np.zeros((1, 8), np.int32))["params"]))()
  started = init_params(workdir, built.config.model, template)
  want = built.training.merged_params(whole.state.params)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(started), jax.device_get(want))


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory):
  return run_twice("dpo", config_of(dpo_tiny, {**PAIRS, "steps": 6}), tmp_path_factory.mktemp("dpo_lora"), stop_at=2)


def test_dpo_with_lora_references_the_base_without_a_copy_and_resumes_bitwise(dpo_runs):
  built, initial, whole, resumed, rows, _ = dpo_runs
  assert built.hooks.ref_params is None  # nothing copied
  params = whole.state.params
  base = built.hooks.reference_params(params)
  assert all(a is b for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(lora_lib.base_params(params))))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(base), lora_lib.base_params(initial))
  changed = changed_leaves(initial, jax.device_get(params))
  assert changed and all(is_adapter(p) for p in changed), changed
  assert_bitwise(resumed.state, whole.state)
  losses = [row["dpo_loss"] for row in rows]
  assert losses[0] == pytest.approx(np.log(2.0), abs=1e-6)  # B = 0: the policy starts as its reference
  assert losses[-1] < losses[0], losses


def test_rm_with_lora_trains_the_head_whole_and_the_backbone_adapters(tmp_path):
  config = config_of(rm_tiny, {**PAIRS, "steps": 3})
  built = jaxpt.build("rm", config, str(tmp_path))
  initial = jax.device_get(built.training.init_state().params)
  state = jaxpt.train("rm", config, str(tmp_path), built=built).state
  changed = changed_leaves(initial, jax.device_get(state.params))
  assert {p for p in changed if not is_adapter(p)} == {"['head']['kernel']"}, changed
  # jaxpt.load's reader merges the adapters: the plain RewardModel on them scores as the LoRA one
  saved = load_run(str(tmp_path))
  assert not any(is_adapter(p) for p in leaf_paths(saved.params))


@pytest.mark.slow
def test_kto_with_lora_runs_on_the_base_reference(tmp_path):
  config = config_of(kto_tiny, {**PAIRS, "steps": 2})
  built = jaxpt.build("kto", config, str(tmp_path))
  result = jaxpt.train("kto", config, str(tmp_path), built=built)
  assert built.hooks.ref_params is None and int(result.state.step) == 2


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
  config = config_of(grpo_tiny, {**GRPO_MICRO, **LORA, "checkpoint_every": 1})
  return run_twice("grpo", config, tmp_path_factory.mktemp("grpo_lora"), stop_at=1)


def test_grpo_with_lora_samples_the_merged_policy_and_references_the_base(grpo_runs):
  built, initial, whole, resumed, rows, _ = grpo_runs
  assert built.hooks.ref_params is None and built.config.grpo.uses_reference
  assert any(0 < row["reward_mean"] < 1 for row in rows if "reward_mean" in row)  # advantages that are not 0
  changed = changed_leaves(initial, jax.device_get(whole.state.params))
  assert changed and all(is_adapter(p) for p in changed), changed
  assert_bitwise(resumed.state, whole.state)


def test_lora_config_round_trips_through_config_json(dpo_runs):
  built = dpo_runs[0]
  config = from_section(dpo.DPORunConfig, json.loads(json.dumps(jaxpt.config.as_dict(built.config))), "config")
  assert config.lora == built.config.lora and config.lora.rank == 4
