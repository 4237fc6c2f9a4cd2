"""Task problems, the task tokenizer, SFT batches (response-only weights) and left-padded RL prompt batches."""

import os

import ml_collections
import numpy as np
import pytest

from jaxpt.config import ConfigError
from jaxpt.data import arithmetic, math_task, sft
from jaxpt.data.config import LMDataConfig
from jaxpt.data.math_prompts import format_prompt, format_response

TASK = dict(name="arithmetic", num_steps=2, max_value=15, ops="+-", max_factor=5, allow_negative=False,
            test_fraction=0.1, train_size=300, test_size=40, seed=0, path="", tfds_data_dir="")


def task_config(**overrides):
  return ml_collections.ConfigDict({**TASK, **overrides})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("sft_data"))


@pytest.fixture(scope="module")
def tokenizer(workdir):
  return math_task.task_tokenizer(task_config(), 512, workdir)


@pytest.fixture(scope="module")
def data(tokenizer, workdir):
  data_config = LMDataConfig(seq_len=80, batch_size=8, eval_batches=2)
  return sft.SFTData.create_for_task(task_config(), data_config, tokenizer, seed=5, workdir=workdir)


def test_task_problems_follow_the_config():
  train = math_task.task_problems(task_config(), "train")
  test = math_task.task_problems(task_config(), "test")
  assert len(train) == 300 and len(test) == 40
  want = arithmetic.generate(arithmetic.ArithmeticConfig(num_steps=2, max_value=15, ops="+-"), 40, 0, "test")
  assert [p.question for p in test] == [p.question for p in want]


def test_tokenizer_is_cached_in_workdir(tokenizer, workdir):
  model_file = os.path.join(workdir, "tokenizer", "spm.model")
  mtime = os.path.getmtime(model_file)
  for config in (task_config(), task_config(test_size=7)):  # the held-out size does not change the tokenizer
    again = math_task.task_tokenizer(config, 512, workdir)
    assert again.model_proto == tokenizer.model_proto and os.path.getmtime(model_file) == mtime
  text = "".join(math_task.example_text(math_task.task_problems(task_config(), "test")[0]))
  assert tokenizer.decode(tokenizer.encode(text)) == text
  assert tokenizer.vocab_size <= 512


def test_sft_batch_weights_only_on_response_tokens(data, tokenizer):
  batch = data.train_batch(3)
  assert set(batch) == {"inputs", "targets", "weights", "positions", "segment_ids"}
  assert batch["inputs"].shape == (8, 80) and batch["weights"].dtype == np.float32
  for key in ("inputs", "targets", "positions", "segment_ids"):
    assert batch[key].dtype == np.int32
  problems = {p.question: p for p in math_task.task_problems(task_config(), "train")}
  for row in range(8):
    inputs = batch["inputs"][row]
    n = int((batch["segment_ids"][row] > 0).sum())
    # Find the problem from the row's prompt text, then re-encode it independently.
    text = tokenizer.decode(inputs[:n])
    question = text[len("Question: "):text.index("\nAnswer:")]
    p = problems[question]
    prompt = tokenizer.encode(format_prompt(p.question))
    response = tokenizer.encode(format_response(p.solution, p.answer))
    assert n == len(prompt) + len(response) + 1
    np.testing.assert_array_equal(inputs[:n], prompt + response + [tokenizer.eos_id])
    np.testing.assert_array_equal(inputs[n:], 0)
    np.testing.assert_array_equal(batch["targets"][row, :-1], inputs[1:])
    want = np.zeros(80, np.float32)
    want[len(prompt) - 1:n - 1] = 1.0  # targets t+1 in [len(prompt), n): response tokens and the EOS
    np.testing.assert_array_equal(batch["weights"][row], want)
    np.testing.assert_array_equal(batch["positions"][row, :n], np.arange(n))
    np.testing.assert_array_equal(batch["positions"][row, n:], 0)
    np.testing.assert_array_equal(batch["segment_ids"][row], (np.arange(80) < n).astype(np.int32))


def test_sft_batches_deterministic_and_resumable(data, tokenizer, workdir):
  data_config = LMDataConfig(seq_len=80, batch_size=8, eval_batches=2)
  other = sft.SFTData.create_for_task(task_config(), data_config, tokenizer, seed=5, workdir=workdir)
  for step in (0, 7, 40):  # 300 problems / 8 per batch: step 40 is in the second epoch
    for key, value in data.train_batch(step).items():
      np.testing.assert_array_equal(value, other.train_batch(step)[key])
  resumed = other.train_batches(start_step=7)
  np.testing.assert_array_equal(next(resumed)["inputs"], data.train_batch(7)["inputs"])
  assert not np.array_equal(data.train_batch(0)["inputs"], data.train_batch(1)["inputs"])
  # One epoch visits every training problem once.
  rows = np.concatenate([data.train_batch(s)["inputs"] for s in range(300 // 8)])
  assert len({r.tobytes() for r in rows}) == len(rows)
  halves = [data.train_batch(2, process_index=i, process_count=2)["inputs"] for i in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), data.train_batch(2)["inputs"])


def test_eval_batches_are_the_held_out_problems(data, tokenizer):
  batches = data.eval_batches()
  assert len(batches) == 2 and all(b["inputs"].shape == (8, 80) for b in batches)
  test_questions = [p.question for p in math_task.task_problems(task_config(), "test")]
  for b in batches:
    for row in range(8):
      text = tokenizer.decode(b["inputs"][row][b["segment_ids"][row] > 0])
      assert text[len("Question: "):text.index("\nAnswer:")] in test_questions
    assert np.all(b["weights"].sum(1) > 0)
  np.testing.assert_array_equal(batches[0]["inputs"], data.eval_batches()[0]["inputs"])


def test_errors_name_the_field(tokenizer, workdir):
  short = LMDataConfig(seq_len=20, batch_size=8, eval_batches=2)
  with pytest.raises(ValueError, match=r"data\.seq_len=20: example 0"):
    sft.SFTData.create_for_task(task_config(), short, tokenizer, seed=0, workdir=workdir)
  many = LMDataConfig(seq_len=80, batch_size=8, eval_batches=6)
  with pytest.raises(ValueError, match=r"data\.eval_batches=6"):
    sft.SFTData.create_for_task(task_config(), many, tokenizer, seed=0, workdir=workdir)
  with pytest.raises(ValueError, match=r"task\.name='mnist'"):
    math_task.task_config(task_config(name="mnist"))
  with pytest.raises(ValueError, match=r"task\.ops='\+/'"):
    math_task.task_config(task_config(ops="+/"))
  with pytest.raises(ValueError, match=r"task\.train_size=0"):
    math_task.task_config(task_config(train_size=0))
  with pytest.raises(ValueError, match=r"task\.path='/nonexistent'"):
    math_task.task_config(task_config(name="gsm8k", path="/nonexistent"))


@pytest.fixture(scope="module")
def prompts(tokenizer):
  return math_task.PromptData.create(task_config(), tokenizer, batch_size=6, prompt_len=48, seed=2)


def test_prompt_batches_left_padded(prompts, tokenizer):
  batch = prompts.batch(4)
  assert batch["prompt_tokens"].shape == (6, 48) and batch["prompt_tokens"].dtype == np.int32
  assert batch["prompt_mask"].dtype == np.int32 and len(batch["answers"]) == len(batch["questions"]) == 6
  answers = {p.question: p.answer for p in prompts.train}
  for row in range(6):
    ids = tokenizer.encode(format_prompt(batch["questions"][row]))
    want_mask = np.zeros(48, np.int32)
    want_mask[48 - len(ids):] = 1  # real tokens rightmost, padding on the left
    np.testing.assert_array_equal(batch["prompt_mask"][row], want_mask)
    np.testing.assert_array_equal(batch["prompt_tokens"][row, 48 - len(ids):], ids)
    np.testing.assert_array_equal(batch["prompt_tokens"][row, :48 - len(ids)], 0)
    assert batch["answers"][row] == answers[batch["questions"][row]]


def test_prompt_batches_deterministic(prompts, tokenizer):
  other = math_task.PromptData.create(task_config(), tokenizer, batch_size=6, prompt_len=48, seed=2)
  for step in (0, 3, 70):  # 300 / 6 = 50 steps per epoch
    assert other.batch(step)["questions"] == prompts.batch(step)["questions"]
    np.testing.assert_array_equal(other.batch(step)["prompt_tokens"], prompts.batch(step)["prompt_tokens"])
  epoch = [q for s in range(50) for q in prompts.batch(s)["questions"]]
  assert sorted(epoch) == sorted(p.question for p in prompts.train)
  reseeded = math_task.PromptData.create(task_config(), tokenizer, batch_size=6, prompt_len=48, seed=3)
  assert reseeded.batch(0)["questions"] != prompts.batch(0)["questions"]


def test_eval_sets_hold_test_problems_and_their_perturbations(prompts):
  sets = prompts.eval_sets()
  assert set(sets) == {"test", "test_rename", "test_distractor", "test_numbers"}
  flat = {name: [(q, a) for b in batches for q, a in zip(b["questions"], b["answers"])]
          for name, batches in sets.items()}
  assert [len(b["answers"]) for b in sets["test"]] == [6] * 6 + [4]  # 40 problems in batches of 6
  test = math_task.task_problems(task_config(), "test")
  assert flat["test"] == [(p.question, p.answer) for p in test]
  for kind in ("rename", "distractor"):
    assert [a for _, a in flat[f"test_{kind}"]] == [p.answer for p in test]
    assert all(q != p.question for (q, _), p in zip(flat[f"test_{kind}"], test))
  for (q, a), p in zip(flat["test_numbers"], test):
    changed = arithmetic.perturb(p, "numbers", seed=test.index(p), test_fraction=task_config().test_fraction)
    assert (q, a) == (changed.question, changed.answer)
    assert arithmetic.split_of(changed.meta["numbers"], changed.meta["ops"], task_config().test_fraction) == "test"


def test_prompt_too_long_names_the_field(tokenizer):
  with pytest.raises(ValueError, match=r"prompt_len=8: prompt 0"):
    math_task.PromptData.create(task_config(), tokenizer, batch_size=6, prompt_len=8, seed=2)


def test_validation_problems_follow_the_training_problems_in_the_training_split(tokenizer):
  task = task_config(validation_size=12)
  train, validation = math_task.task_problems(task, "train"), math_task.task_problems(task, "validation")
  longer = math_task.task_problems(task_config(train_size=TASK["train_size"] + 12), "train")
  assert [p.question for p in train + validation] == [p.question for p in longer]
  assert len(validation) == 12 and not {p.question for p in validation} & {p.question for p in train}
  assert all(arithmetic.split_of(p.meta["numbers"], p.meta["ops"], task_config().test_fraction) == "train"
             for p in validation)
  prompts = math_task.PromptData.create(task, tokenizer, batch_size=6, prompt_len=64, seed=2)
  assert [q for b in prompts.eval_sets()["validation"] for q in b["questions"]] == [p.question for p in validation]
  with pytest.raises(ConfigError, match="task.validation_size=3: needs task.train_size > 0"):
    math_task.task_config(ml_collections.ConfigDict(dict(name="gsm8k", train_size=0, validation_size=3, path="/x")))
