"""SFT end to end on the real TransformerLM, task data and shared loop, shrunk to run in seconds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import sft_tiny
import jaxpt
from jaxpt.data import math_task
from jaxpt.config import ConfigError, from_section
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.evaluate import evaluate_run
from jaxpt.engine.metrics import read_metrics
from jaxpt.rl.rewards import extract_answer, math_reward
from jaxpt.rl.sampler import SamplingConfig, make_sampler
from jaxpt.engine.run import run_command
from jaxpt.trainers.sft import SFTRunConfig, answer_accuracy

MICRO = {
    "steps": 30, "log_every": 5, "eval_every": 15, "checkpoint_every": 0, "progress": False,
    "model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
    "model.num_kv_heads": 2, "model.mlp_dim": 64, "model.max_seq_len": 80,
    "data.seq_len": 80, "data.batch_size": 16, "data.eval_batches": 2,
    "optim.warmup_steps": 5, "optim.learning_rate": 1e-2,
    "task.max_value": 15, "task.train_size": 400, "task.test_size": 64,
    "decode.prompt_len": 48, "decode.max_new_tokens": 32, "decode.eval_problems": 32, "decode.batch_size": 16,
}


def micro_config(**extra):
  config = sft_tiny.get_config()
  config.update_from_flattened_dict({**MICRO, **extra})
  return config


@pytest.fixture(scope="module")
def micro_setup(tmp_path_factory):
  config = micro_config()
  return config, jaxpt.build("sft", config, str(tmp_path_factory.mktemp("sft_setup")))


@pytest.fixture(scope="module")
def micro_run(micro_setup, tmp_path_factory):
  config, setup = micro_setup
  workdir = str(tmp_path_factory.mktemp("sft_run"))
  return workdir, jaxpt.train("sft", config, workdir, built=setup)


def test_loss_falls_and_eval_reports_answer_accuracy(micro_run):
  workdir, result = micro_run
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
  assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], [r["loss"] for r in rows]
  evals = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in evals] == [15, 30]
  assert evals[1]["eval_loss"] < evals[0]["eval_loss"] < np.log(512)
  for row in evals:
    for key in ("eval_answer_accuracy", "eval_sample_accuracy"):
      assert 0.0 <= row[key] <= 1.0 and row[key] * 32 == round(row[key] * 32)  # a share of 32 problems
  assert int(result.state.step) == 30


def test_resume_gives_bitwise_identical_params(micro_setup, micro_run, tmp_path):
  config, setup = micro_setup
  assert int(jaxpt.train("sft", config, str(tmp_path), built=setup, stop_at=13).state.step) == 13
  resumed = jaxpt.train("sft", config, str(tmp_path), built=setup).state
  for got, want in zip(jax.tree.leaves(resumed), jax.tree.leaves(micro_run[1].state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_answer_accuracy_equals_reward_of_unpadded_argmax_decoding(micro_setup, micro_run):
  """Greedy responses to left-padded prompt batches (the eval's sampler) equal argmax decoding of each prompt
  alone without padding or cache (full recomputation), and the eval accuracy is their mean reward."""
  config, setup = micro_setup
  params = micro_run[1].state.params
  tokenizer = setup.data.tokenizer
  problems = math_task.task_problems(config.task, "test")[:4]
  batch = math_task.prompt_batches(tokenizer, problems, 4, 48)[0]
  assert len(set(batch["prompt_mask"].sum(1).tolist())) > 1  # prompts of different lengths
  # Reference: each prompt alone, right-padded to a fixed width (causal, so later padding changes nothing).
  apply = jax.jit(lambda ids: setup.training.model.apply({"params": params}, ids))
  texts = []
  for row in range(4):
    ids = list(batch["prompt_tokens"][row][batch["prompt_mask"][row] > 0])
    want = []
    while len(want) < 32 and (not want or want[-1] != tokenizer.eos_id):
      length = len(ids) + len(want)
      logits = apply(jnp.asarray([ids + want + [0] * (80 - length)], jnp.int32))
      want.append(int(jnp.argmax(logits[0, length - 1])))
    texts.append(tokenizer.decode(want))
  # Rows 0 and 2 ask for the answer the reference boxes (reward 1 if the sampler agrees); 1 and 3 keep theirs.
  for row in (0, 2):
    problems[row] = dataclasses.replace(problems[row], answer=extract_answer(texts[row]) or "none")
  batches = math_task.prompt_batches(tokenizer, problems, 4, 48)
  sample = make_sampler(setup.config.model, SamplingConfig(32, greedy=True, eos_id=tokenizer.eos_id), 48)
  out = jax.device_get(sample(params, batches[0]["prompt_tokens"], batches[0]["prompt_mask"],
                              jax.random.PRNGKey(0)))
  assert [tokenizer.decode(t[m > 0]) for t, m in zip(out.tokens, out.mask)] == texts
  got = answer_accuracy(sample, params, batches, tokenizer, jax.random.PRNGKey(0))
  assert got == np.mean([math_reward(t, p.answer) for t, p in zip(texts, problems)])


def test_init_from_and_run_sft_summary(micro_run, tmp_path, capsys):
  """A steps=0 run started from the micro run's workdir saves its initial state: the micro run's params."""
  run_workdir, result = micro_run
  assert run_command("sft", micro_config(init_from=run_workdir, steps=0), str(tmp_path)) == 0
  assert f"jaxpt sft: finished step 0 in {tmp_path}" in capsys.readouterr().out
  checkpointer = Checkpointer(str(tmp_path))
  assert checkpointer.latest_step() == 0
  params = checkpointer.restore_params(result.state.params)
  checkpointer.close()
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(result.state.params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("key, value, message", [
    ("task.ops", "+/", r"config\.task\.ops='\+/'"),
    ("task.name", "mnist", r"config\.task\.name='mnist'"),
    ("decode.eval_problems", 40, r"config\.decode\.eval_problems=40: must be a multiple"),
    ("decode.max_new_tokens", 64, r"config\.decode\.max_new_tokens=64: .*max_seq_len=80"),
    ("init_from", "/nonexistent", r"config\.init_from='/nonexistent'"),
    ("eval_split", "train", r"config\.eval_split='train'"),
    ("eval_split", "validation", r"config\.eval_split='validation': .*validation_size > 0"),
    ("model.d_model", 30, r"config\.model\.d_model=30"),
])
def test_config_errors_name_the_field(key, value, message):
  with pytest.raises(ConfigError, match=message):
    from_section(SFTRunConfig, micro_config(**{key: value}), "config")


def test_default_config_is_valid():
  run = from_section(SFTRunConfig, sft_tiny.get_config(), "config")
  model_config, task, decode = run.model, run.task, run.decode
  assert task.name == "arithmetic" and model_config.norm_scheme == "siamese_post_pre" and decode.temperature == 1.0


def test_jaxpt_eval_rebuilds_the_sft_run_and_gives_its_own_eval(micro_run):
  """`jaxpt eval` rebuilds the micro run from its config.json (the trainer table's build) and reproduces its last
  eval row, the decoded answers' accuracy included."""
  workdir, result = micro_run
  row = evaluate_run(workdir)
  assert row["run"] == "sft" and row["step"] == int(result.state.step)
  for key in ("eval_loss", "eval_answer_accuracy"):
    assert row[key] == pytest.approx(result.last_row[key], rel=1e-5, abs=1e-7), key


def test_eval_split_validation_never_reads_the_test_split(tmp_path, monkeypatch):
  """With eval_split='validation' the SFT run (its tokenizer, training rows, eval rows and eval prompts) never asks
  the task generator for a 'test' problem, and its eval rows are the validation problems'."""
  asked = []
  generate = math_task.GENERATED["multipath"].generate

  def recording(config, count, seed, split="train"):
    asked.append(split)
    return generate(config, count, seed, split)

  monkeypatch.setitem(math_task.GENERATED, "multipath", type("Recorded", (), dict(
      generate=staticmethod(recording), VERSION=math_task.GENERATED["multipath"].VERSION)))
  config = micro_config(**{"task.name": "multipath", "task.validation_size": 64, "task.num_steps": 2,
                           "eval_split": "validation"})
  built = jaxpt.build("sft", config, str(tmp_path))
  assert asked and "test" not in asked, asked
  task = math_task.task_config(config.task)
  rows = built.data.eval_batches()[0]["inputs"]
  prompt = math_task.prompt_text(math_task.task_problems(task, "validation")[0].question)
  assert built.tokenizer.decode(rows[0][rows[0] > 0].tolist()).startswith(prompt.strip()[:40])
  math_task.task_problems(task, "test")
  assert asked[-1] == "test"  # the recorder sees a test read
