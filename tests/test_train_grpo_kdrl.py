"""KDRL in the GRPO trainer (`config.grpo.teacher`): a frozen teacher scores the rollouts on the mesh and the policy
loss gains the reverse-KL term to it. The teacher is a 1-step micro GRPO run (tests/micro_grpo.py) of ANOTHER size
(d_model 64, mlp 128) than the micro policy; the policy trains 2 steps from scratch with it, and 2 steps started
FROM it (the same params: the KD term is 0 on the first update's rollouts). kd_only (plain on-policy distillation)
zeroes the RL term; an `hf:` checkpoint is a teacher too; config errors name their field."""

import os
import shutil

import numpy as np
import pytest

import jaxpt
from jaxpt.config import ConfigError
from jaxpt.data.math_task import task_tokenizer
from jaxpt.trainers.grpo import replace_hooks
from jaxpt.engine.metrics import read_metrics
from tests.micro_grpo import even_length, micro_config
from tests.test_train_from_hf import GRPO as HF_GRPO
from tests.test_train_from_hf import checkpoint  # noqa: F401 (the Qwen2 fixture with 512 positions)
from tests.test_train_from_hf import experiment_config

QUIET = {"data.eval_prompts": 0, "eval_every": 0}
TEACHER = {"model.d_model": 64, "model.mlp_dim": 128, "steps": 1, "checkpoint_every": 1, **QUIET}


def train(workdir, **overrides):
  config = micro_config(**{**QUIET, **overrides})
  trainer = replace_hooks(jaxpt.build("grpo", config, workdir), reward_fn=even_length)
  return trainer, jaxpt.train("grpo", config, workdir, built=trainer)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("teacher"))
  train(workdir, **TEACHER)
  return workdir


@pytest.mark.parametrize("kind", ["k2", pytest.param("k3", marks=pytest.mark.slow)])  # k3's term: test_losses_kdrl
def test_two_steps_with_a_teacher_of_another_size(teacher, tmp_path, kind):
  trainer, result = train(str(tmp_path), **{"grpo.teacher": teacher, "grpo.kd_coef": 0.1, "grpo.kd_kind": kind})
  assert int(result.state.step) == 2 and trainer.hooks.teacher.config.d_model == 64
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    for key in ("loss", "pg_loss", "kd", "teacher_kl", "kd_rows", "grad_norm"):
      assert np.isfinite(row[key]), (key, row)
    assert row["kd"] > 0 and row["kd_rows"] == 1.0   # two different models: the term is on


def test_started_from_the_teacher_the_term_is_zero_on_the_first_rollouts(teacher, tmp_path):
  workdir = str(tmp_path)
  config = micro_config(**{**QUIET, "model.d_model": 64, "model.mlp_dim": 128, "init_from": teacher,
                           "grpo.teacher": teacher, "grpo.kd_coef": 0.5, "grpo.kd_skip_correct": True})
  trainer = replace_hooks(jaxpt.build("grpo", config, workdir), reward_fn=even_length)
  hooks = trainer.hooks
  state = hooks.init_state(trainer.training)
  batch = next(iter(hooks.collector.batches(0)))
  ro, _ = hooks.collector.step_rollouts(state.params, batch, 0, state.step_rng())
  experience = {k: ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")}
  np.testing.assert_allclose(np.asarray(hooks.teacher_logprobs(experience)), np.asarray(ro["old_logp"]), rtol=1e-6,
                             atol=1e-5)  # the same params, another compiled program
  jaxpt.train("grpo", config, workdir, built=trainer)
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  # reward-guided masking: the rollouts the verifier scores correct carry no KD term
  assert all(0.0 < r["kd_rows"] < 1.0 for r in rows), rows
  assert abs(rows[0]["teacher_kl"]) < 0.05 and all(r["kd"] >= 0 for r in rows)


def test_a_lora_run_teaches_with_its_adapters_merged(tmp_path):
  """A teacher trained with LoRA is read as init_from reads it: W + s A B (what jaxpt.load gives), not refused."""
  import jax

  source = str(tmp_path / "lora_teacher")
  train(source, **{**TEACHER, "lora.rank": 2, "lora.alpha": 4.0})
  config = micro_config(**{**QUIET, "grpo.teacher": source, "grpo.kd_coef": 0.1})
  hooks = replace_hooks(jaxpt.build("grpo", config, str(tmp_path / "student")), reward_fn=even_length).hooks
  loaded = jaxpt.load(source, dtype="float32")
  assert loaded.lora is not None
  for got, want in zip(jax.tree.leaves(jax.device_get(hooks.teacher.params)), jax.tree.leaves(loaded.params)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_kd_only_is_on_policy_distillation(teacher, tmp_path):
  train(str(tmp_path), **{"grpo.teacher": teacher, "grpo.kd_coef": 1.0, "grpo.kd_only": True, "grpo.kl_coef": 0.0})
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:   # the rewards are still measured; the RL term is 0 and the KD term alone moves the policy
    assert 0 < row["accuracy"] < 1 and row["adv_std"] == 0.0 and row["pg_loss"] == 0.0 and row["grad_norm"] > 0.0
    np.testing.assert_allclose(row["loss"], row["kd"], rtol=1e-6)


@pytest.mark.parametrize("overrides,field", [
    ({"grpo.kd_coef": 0.1}, "grpo.kd_coef"),
    ({"grpo.kd_only": True}, "grpo.kd_only"),
    ({"grpo.teacher": "/nonexistent", "grpo.kd_coef": 0.0}, "grpo.kd_coef"),
    ({"grpo.teacher": "/nonexistent", "grpo.kd_coef": 0.1, "grpo.kd_kind": "k1"}, "grpo.kd_kind"),
    ({"grpo.teacher": "/nonexistent", "grpo.kd_coef": 0.1}, "grpo.teacher"),
])
def test_config_errors_name_the_field(tmp_path, overrides, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    jaxpt.build("grpo", micro_config(**{**QUIET, **overrides}), str(tmp_path))


def test_a_teacher_with_another_tokenizer_is_refused(teacher, tmp_path):
  other = str(tmp_path / "other")
  shutil.copytree(teacher, other)
  shutil.rmtree(os.path.join(other, "tokenizer"))
  config = micro_config()
  task_tokenizer(config.task, 400, other)   # another vocabulary in other/tokenizer
  with pytest.raises(ConfigError, match=r"grpo\.teacher.*tokenizer is not the policy's"):
    jaxpt.build("grpo", micro_config(**{**QUIET, "grpo.teacher": other, "grpo.kd_coef": 0.1}),
                str(tmp_path / "student"))


def test_an_hf_teacher_scores_on_the_mesh(request, tmp_path):
  """grpo.teacher='hf:DIR' (the Qwen2 fixture, also the policy's start, so its tokenizer is the policy's): one step
  with the KD term; the teacher's log-probs of the first rollouts are the policy's (the same weights)."""
  hf_checkpoint = request.getfixturevalue("checkpoint")
  config = experiment_config("grpo_hf", hf_checkpoint, **{**HF_GRPO, "steps": 1,
                                                          "grpo.teacher": f"hf:{hf_checkpoint}", "grpo.kd_coef": 0.1})
  trainer = jaxpt.build("grpo", config, str(tmp_path))
  hooks = trainer.hooks
  state = hooks.init_state(trainer.training)
  ro, _ = hooks.collector.step_rollouts(state.params, next(iter(hooks.collector.batches(0))), 0, state.step_rng())
  experience = {k: ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")}
  np.testing.assert_allclose(np.asarray(hooks.teacher_logprobs(experience)), np.asarray(ro["old_logp"]),
                             rtol=1e-6, atol=1e-5)  # the same float32 weights, another compiled program
  jaxpt.train("grpo", config, str(tmp_path), built=trainer)
  rows = read_metrics(str(tmp_path))
  assert len(rows) == 1 and np.isfinite(rows[0]["kd"]) and abs(rows[0]["teacher_kl"]) < 0.05
