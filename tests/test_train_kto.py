"""The KTO trainer (`jaxpt kto`, `jaxpt.trainers.kto`): its mismatched rows and unpairing, a tiny run on the tagged
synthetic preferences whose held-out implicit-reward accuracy rises above chance, bitwise resume, and `jaxpt eval`
of the run reproducing its own last eval row."""

import json
import os

import jax
import numpy as np
import pytest

import jaxpt
from jaxpt.config import from_section
from jaxpt.engine.evaluate import evaluate_run
from jaxpt.trainers import kto


def test_mismatched_rows_pair_each_prompt_with_the_next_rows_response():
  pad, eos = 0, 9
  # row 0: prompt [1, 2], response [3] + EOS; row 1: prompt [4], response [5, 6] + EOS; S = 6
  tokens = np.array([[1, 2, 3, eos, pad, pad], [4, 5, 6, eos, pad, pad]], np.int32)
  last, response_len = np.array([3, 3], np.int32), np.array([1, 2], np.int32)
  out, new_last, new_len = kto.mismatched_rows(tokens, last, response_len, pad)
  np.testing.assert_array_equal(out, [[1, 2, 5, 6, eos, pad], [4, 3, eos, pad, pad, pad]])
  np.testing.assert_array_equal(new_last, [4, 2])
  np.testing.assert_array_equal(new_len, [2, 1])


def test_one_response_per_prompt_keeps_exactly_one_side_of_each_pair_the_same_at_every_epoch():
  rng = np.random.default_rng(0)
  batch = {f"{side}_{k}": v for side in ("chosen", "rejected") for k, v in (
      ("tokens", rng.integers(1, 50, (16, 8)).astype(np.int32)), ("last", np.full(16, 7, np.int32)),
      ("response_len", np.full(16, 3, np.int32)))}
  batch["weights"] = np.array([1.0] * 15 + [0.0], np.float32)  # the last pair pads the batch
  columns = kto.kl_columns(0, seed=3, one_response_per_prompt=True)(batch)
  kept = columns["chosen_weights"] + columns["rejected_weights"]
  np.testing.assert_array_equal(kept, batch["weights"])
  assert 0 < columns["chosen_weights"].sum() < 15  # both sides occur
  again = kto.kl_columns(0, seed=3, one_response_per_prompt=True)(batch)
  np.testing.assert_array_equal(again["chosen_weights"], columns["chosen_weights"])
  both = kto.kl_columns(0, seed=3, one_response_per_prompt=False)(batch)
  np.testing.assert_array_equal(both["chosen_weights"], batch["weights"])
  np.testing.assert_array_equal(both["rejected_weights"], batch["weights"])


def tiny_config(**overrides):
  from experiments.configs import kto_tiny

  config = kto_tiny.get_config()
  config.update_from_flattened_dict(overrides)
  return config


def test_tiny_config_is_valid_and_errors_name_the_field():
  run = from_section(kto.KTORunConfig, tiny_config(), "config")
  assert run.kto.beta == 0.1 and run.init_from == ""
  with pytest.raises(Exception, match=r"config.kto.undesirable_weight=0.0: must be in \(0.0, inf\]"):
    from_section(kto.KTORunConfig, tiny_config(**{"kto.undesirable_weight": 0.0}), "config")
  # one pair a batch: its mismatched row would be its own (matched) response, a wrong reference point
  with pytest.raises(Exception, match=r"config.data.batch_size=1: KTO's reference point pairs"):
    from_section(kto.KTORunConfig, tiny_config(**{"data.batch_size": 1}), "config")
  with pytest.raises(Exception, match=r"data.batch_size=4: .* each of the 4 process\(es\) needs >= 2 pairs"):
    kto.check_pairs_per_process(4, 4)


RUN = {"steps": 30, "log_every": 1, "eval_every": 30, "checkpoint_every": 0, "progress": False, "model.d_model": 32,
       "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
       "data.synthetic_task": "tagged", "data.length_bias": 0.5, "data.synthetic_train_pairs": 512,
       "data.synthetic_test_pairs": 128, "data.batch_size": 16, "optim.learning_rate": 3e-3,
       "optim.warmup_steps": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One build, then the whole 30-step run and the same run killed at step 3 and resumed."""
  root = tmp_path_factory.mktemp("kto")
  config = tiny_config(**RUN)
  built = jaxpt.build("kto", config, str(root / "whole"))
  whole = jaxpt.train("kto", config, str(root / "whole"), built=built)
  first = jaxpt.train("kto", config, str(root / "split"), built=built, stop_at=3)
  resumed = jaxpt.train("kto", config, str(root / "split"), built=built)
  return {"root": root, "whole": whole, "first": first, "resumed": resumed}


def test_held_out_implicit_reward_accuracy_rises_above_chance(runs):
  with open(os.path.join(runs["root"] / "whole", "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert rows[0]["loss"] == pytest.approx(0.5, abs=1e-6)  # policy = reference: r = 0, z0 = 0, L = 1 - sigmoid(0)
  assert rows[-1]["loss"] < 0.45 and rows[-1]["desirable_reward"] > rows[-1]["undesirable_reward"]
  assert runs["whole"].last_row["eval_accuracy"] > 0.7  # 128 held-out pairs, chance 0.5; measured 0.875 at 40 steps


def test_a_killed_run_resumes_bitwise(runs):
  assert int(runs["first"].state.step) == 3 and int(runs["resumed"].state.step) == RUN["steps"]
  got, want = runs["resumed"].state, runs["whole"].state
  for a, b in zip(jax.tree.leaves((got.params, got.opt_state)), jax.tree.leaves((want.params, want.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_jaxpt_eval_rebuilds_the_run_and_gives_its_numbers(runs):
  workdir = str(runs["root"] / "whole")
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["trainer"] == "kto"
  row = evaluate_run(workdir)
  assert row["run"] == "kto" and row["step"] == RUN["steps"]
  assert row["eval_accuracy"] == pytest.approx(runs["whole"].last_row["eval_accuracy"], rel=1e-6)
