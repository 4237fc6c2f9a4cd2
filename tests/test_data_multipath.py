"""The multi-path arithmetic task: several distinct correct solution paths per problem, each verified, with
train / validation / test splits disjoint in arithmetic content."""

import itertools
import re
from collections import Counter

import pytest

from jaxpt.config import ConfigError
from jaxpt.data import math_task, multipath
from jaxpt.data.arithmetic import ArithmeticConfig
from jaxpt.data.math_prompts import format_response
from jaxpt.rl.rewards import math_reward

CONFIG = ArithmeticConfig(num_steps=3, max_value=20, ops="+-")
TASK = dict(name="multipath", num_steps=3, max_value=20, ops="+-", train_size=400, test_size=200,
            validation_size=200)


@pytest.fixture(scope="module")
def splits():
  return {split: math_task.task_problems(TASK, split) for split in ("train", "validation", "test")}


def story(meta):
  """Independent statement: the problem's changes as signed ints in story order, and the answer."""
  signed = [n if op == "+" else -n for op, n in zip(meta["ops"], meta["numbers"][1:])]
  return meta["numbers"][0], signed, meta["numbers"][0] + sum(signed)


def replay(path):
  """Each 'x op y = z' step of a path, checked with plain integer arithmetic; returns (operands, results)."""
  operands, results = [], []
  for step in path.split(". "):
    x, op, y, z = re.fullmatch(r"(-?\d+) ([+-]) (-?\d+) = (-?\d+)", step).groups()
    assert int(z) == (int(x) + int(y) if op == "+" else int(x) - int(y)), step
    operands += [int(x), int(y)]
    results.append(int(z))
  return operands, results


def test_paths_differ_and_each_is_correct(splits):
  counts = Counter()
  for p in splits["train"]:
    start, signed, answer = story(p.meta)
    assert p.answer == str(answer)
    paths = multipath.solution_paths(p.meta)
    counts[len(paths)] += 1
    assert len(set(paths)) == len(paths) and p.solution in paths
    leaves = Counter([start] + [abs(s) for s in signed])
    for path in paths:
      operands, results = replay(path)
      assert results[-1] == answer and min(results) >= 0  # allow_negative=False
      # every leaf number is used, and nothing but leaves and earlier results appears
      assert not leaves - Counter(operands) and set(operands) <= set(leaves) | set(results)
      assert math_reward(format_response(path, p.answer), p.answer) == 1.0
      assert multipath.check_path(path, start, list(zip(p.meta["ops"], p.meta["numbers"][1:])), p.answer)
    # the orders: every permutation with non-negative running totals gives a path, and no other order does
    orders = set()
    for perm in itertools.permutations(range(3)):
      changes = [signed[i] for i in perm]
      totals = list(itertools.accumulate(changes, initial=start))
      if min(totals) >= 0:
        orders.add(". ".join(f"{t - s} {'+' if s > 0 else '-'} {abs(s)} = {t}" for s, t in zip(changes, totals[1:])))
    assert orders <= set(paths) and len(set(paths) - orders) <= 1  # + at most the grouped path
  assert sum(n for k, n in counts.items() if k >= 3) > 0.9 * len(splits["train"])
  # the SFT targets cover the paths: the drawn path index is spread over them, not always the story order
  assert len({p.meta["path"] for p in splits["train"]}) >= 5
  assert sum(p.meta["path"] == 0 for p in splits["train"]) < 0.4 * len(splits["train"])


def test_check_path_rejects_wrong_solutions(splits):
  p = splits["train"][0]
  start, changes = p.meta["numbers"][0], list(zip(p.meta["ops"], p.meta["numbers"][1:]))
  good = p.solution
  assert multipath.check_path(good, start, changes, p.answer)
  steps = good.split(". ")
  x, op, y, z = re.fullmatch(r"(-?\d+) ([+-]) (-?\d+) = (-?\d+)", steps[-1]).groups()
  assert not multipath.check_path(". ".join(steps[:-1] + [f"{x} {op} {y} = {int(z) + 1}"]), start, changes,
                                  str(int(z) + 1))  # false arithmetic
  assert not multipath.check_path(good, start, changes, str(int(p.answer) + 1))  # wrong answer
  assert not multipath.check_path(f"{start} + 1000 = {start + 1000}", start, changes, str(start + 1000))
  assert not multipath.check_path("no steps", start, changes, p.answer)


def test_splits_disjoint_and_deterministic(splits):
  contents = {k: {multipath.content(p.meta) for p in v} for k, v in splits.items()}
  assert all(len(contents[k]) == len(splits[k]) for k in splits)  # distinct contents within a split
  assert not contents["train"] & contents["test"]
  assert not contents["train"] & contents["validation"]
  assert not contents["validation"] & contents["test"]
  again = multipath.generate(CONFIG, 100, seed=0, split="train")
  assert [(p.question, p.solution) for p in again] == [(p.question, p.solution) for p in splits["train"][:100]]
  assert [p.question for p in multipath.generate(CONFIG, 100, seed=1)] != [p.question for p in again]


def test_task_config_errors():
  with pytest.raises(ConfigError, match="config.task.ops"):
    math_task.task_config(dict(TASK, ops="+-*"))
  with pytest.raises(ConfigError, match="config.task.num_steps"):
    math_task.task_config(dict(TASK, num_steps=6))
  identity = math_task.task_config(TASK).train_identity
  assert identity != math_task.task_config(dict(TASK, name="arithmetic")).train_identity
