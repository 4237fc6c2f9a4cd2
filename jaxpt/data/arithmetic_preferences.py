"""Preference pairs on the policy's own task with a length bias: the arithmetic word problems of
`jaxpt.data.arithmetic`, correct vs wrong answers, the chosen side padded in training pairs only.

Each pair's prompt is the policy's prompt (`math_prompts.format_prompt(question)`); its responses are in the
policy's response format (`math_prompts.format_response`, "<solution>\\n\\boxed{<answer>}"):

    chosen   = the worked solution with its true answer (the verifier's gold: `rewards.math_reward` = 1)
    rejected = the same solution with the last running total and the boxed answer replaced by a wrong value
               w = answer + delta, delta in {-3, ..., 3} \\ {0}, w >= 0 unless the task allows negative totals
               (the verifier gives it 0)

Exactly one side of every pair is padded with filler made of the policy's own text: k in [1, max_filler] steps of
that response's own solution repeated after it ("7 + 5 = 12. 12 - 3 = 9. 7 + 5 = 12\\n\\boxed{9}"), so the padded
side is longer in any tokenizer and the padding says nothing about correctness. Which side is padded:

- "train":      the chosen side with probability `length_bias` (default 1.0: length and correctness confounded);
- "validation": either side with probability 0.5, independent of correctness (training-split problems after the
                training pairs' problems: `make_pairs(skip=...)`);
- "test":       the same 50/50 padding, on the task's held-out 'test' split problems.

meta = {"source": "arithmetic_preferences", "line": index, "chosen_longer": 0/1, "answer": true answer,
"wrong": the rejected answer}. `write_pairs` writes a folder that `jaxpt rm --config.data.source=FOLDER` reads
(`train.jsonl` and `test.jsonl`, the RM's held-out eval: the validation pairs, so that the test pairs stay unseen
by any choice) plus `heldout.jsonl` (the test pairs).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from jaxpt.config import ConfigError
from jaxpt.data import arithmetic
from jaxpt.data.math_prompts import format_prompt, format_response
from jaxpt.data.math_task import task_config
from jaxpt.data.preference import PreferencePair

SPLITS = ("train", "validation", "test")
_STREAM = {"train": 0, "validation": 1, "test": 2}  # separate random streams per split
SOURCE = "arithmetic_preferences"


def wrong_answer(correct: int, rng: np.random.Generator, allow_negative: bool) -> int:
  """correct + delta, delta uniform on {-3, ..., 3} \\ {0}, redrawn while negative (unless allowed)."""
  while True:
    wrong = correct + int(rng.choice([-3, -2, -1, 1, 2, 3]))
    if allow_negative or wrong >= 0:
      return wrong


def wrong_solution(solution: str, wrong: int) -> str:
  """`solution` ("a + b = t1. t1 - c = t2") with its last running total replaced by `wrong`."""
  head, sep, _ = solution.rpartition("= ")
  if not sep:
    raise ValueError(f"solution {solution!r} has no '= ' step")
  return f"{head}= {wrong}"


def padded_solution(solution: str, rng: np.random.Generator, max_filler: int) -> str:
  """`solution` followed by k ~ U{1, ..., max_filler} of its own steps (drawn with replacement), '. '-joined."""
  steps = solution.split(". ")
  count = int(rng.integers(1, max_filler + 1))
  extra = [steps[int(i)] for i in rng.integers(0, len(steps), size=count)]
  return ". ".join([solution] + extra)


def make_pairs(task: Any, count: int, split: str, length_bias: float = 1.0, max_filler: int = 3, seed: int = 0,
               skip: int = 0) -> list[PreferencePair]:
  """`count` pairs of `split` (module docstring) on the arithmetic `task` (a `task` config section), built on the
  problems skip .. skip + count - 1 of the task's 'train' split ('train', 'validation') or 'test' split ('test');
  deterministic in the arguments. Validation pairs with skip >= the number of train pairs share no problem with
  them (`write_pairs` does so)."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: must be one of {SPLITS}")
  if not 0.0 <= length_bias <= 1.0:
    raise ConfigError("length_bias", "must be in [0, 1]", length_bias)
  if max_filler < 1:
    raise ConfigError("max_filler", "must be >= 1", max_filler)
  task = task_config(task)
  knobs = task.arithmetic
  if knobs is None:
    raise ConfigError("config.task.name", "must be 'arithmetic' for arithmetic preference pairs", task.name)
  if skip < 0:
    raise ConfigError("skip", "must be >= 0", skip)
  problems = arithmetic.generate(knobs, skip + count, task.seed, "test" if split == "test" else "train")[skip:]
  p = length_bias if split == "train" else 0.5
  rng = np.random.default_rng([seed, _STREAM[split], 11])
  pairs = []
  for index, problem in enumerate(problems):
    correct = int(problem.answer)
    wrong = wrong_answer(correct, rng, knobs.allow_negative)
    solutions = [problem.solution, wrong_solution(problem.solution, wrong)]
    chosen_longer = bool(rng.random() < p)
    side = 0 if chosen_longer else 1
    solutions[side] = padded_solution(solutions[side], rng, max_filler)
    chosen, rejected = format_response(solutions[0], str(correct)), format_response(solutions[1], str(wrong))
    meta = {"source": SOURCE, "line": index, "chosen_longer": int(chosen_longer), "answer": str(correct),
            "wrong": str(wrong)}
    pairs.append(PreferencePair(format_prompt(problem.question), chosen, rejected, meta))
  return pairs


def write_jsonl(path: str, pairs: list[PreferencePair]) -> None:
  """One {"prompt", "chosen", "rejected"} object a line (the format `jaxpt.data.preference` reads)."""
  with open(path, "w") as f:
    for pair in pairs:
      f.write(json.dumps({"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}) + "\n")


def write_pairs(folder: str, task: Any, train_pairs: int, validation_pairs: int, test_pairs: int,
                length_bias: float = 1.0, max_filler: int = 3, seed: int = 0) -> dict[str, list[PreferencePair]]:
  """Writes `folder/{train, test, heldout}.jsonl` (train, validation and test pairs; module docstring) and returns
  {split: pairs}."""
  os.makedirs(folder, exist_ok=True)
  splits = {split: make_pairs(task, count, split, length_bias, max_filler, seed, skip)
            for split, count, skip in (("train", train_pairs, 0), ("validation", validation_pairs, train_pairs),
                                       ("test", test_pairs, 0))}
  for split, name in (("train", "train"), ("validation", "test"), ("test", "heldout")):
    write_jsonl(os.path.join(folder, f"{name}.jsonl"), splits[split])
  return splits
