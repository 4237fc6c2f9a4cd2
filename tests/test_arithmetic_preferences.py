"""jaxpt.data.arithmetic_preferences: the length bias is in the training pairs and not in the validation/test pairs;
the verifier is the gold label; the folder is what `jaxpt rm` reads."""

import os

import numpy as np
import pytest

from jaxpt.config import ConfigError
from jaxpt.data import arithmetic
from jaxpt.data import arithmetic_preferences as ap
from jaxpt.data.preference import read_splits
from jaxpt.rl.rewards import math_reward

TASK = dict(name="arithmetic", num_steps=2, max_value=10, ops="+-", train_size=20000, test_size=512)
N = 400


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("pairs"))
  return folder, ap.write_pairs(folder, TASK, N, N, N)


def _longer(pairs):
  """1 where the chosen response has more characters than the rejected one, 0 where fewer (never equal here)."""
  out = []
  for p in pairs:
    assert len(p.chosen) != len(p.rejected)
    out.append(int(len(p.chosen) > len(p.rejected)))
  return np.array(out)


def test_bias_in_train_only(splits):
  _, pairs = splits
  assert _longer(pairs["train"]).mean() == 1.0  # length_bias 1: the chosen side is always the longer one
  for split in ("validation", "test"):
    share = _longer(pairs[split]).mean()
    # Binomial(400, 0.5): sd 0.025; 0.5 +- 4 sd
    assert 0.4 < share < 0.6, (split, share)
  for split, rows in pairs.items():  # meta says the same as the texts
    np.testing.assert_array_equal(_longer(rows), [p.meta["chosen_longer"] for p in rows], err_msg=split)


def test_partial_bias():
  share = _longer(ap.make_pairs(TASK, N, "train", length_bias=0.7)).mean()
  assert 0.6 < share < 0.8, share


def test_gold_is_the_verifier(splits):
  _, pairs = splits
  for rows in pairs.values():
    for p in rows:
      assert math_reward(p.chosen, p.meta["answer"]) == 1.0
      assert math_reward(p.rejected, p.meta["answer"]) == 0.0
      assert math_reward(p.rejected, p.meta["wrong"]) == 1.0
      assert p.meta["wrong"] != p.meta["answer"] and int(p.meta["wrong"]) >= 0


def test_padding_repeats_own_steps(splits):
  _, pairs = splits
  for p in pairs["validation"][:50]:
    short, long = (p.rejected, p.chosen) if p.meta["chosen_longer"] else (p.chosen, p.rejected)
    steps, long_steps = short.split("\n")[0].split(". "), long.split("\n")[0].split(". ")
    own, extra = long_steps[:len(steps)], long_steps[len(steps):]
    assert own[:-1] == steps[:-1] and own[-1] != steps[-1]  # the same solution up to its last total
    assert set(extra) <= set(own) and 1 <= len(extra) <= 3


def test_problems_disjoint_and_split(splits):
  _, pairs = splits
  prompts = {k: {p.prompt for p in v} for k, v in pairs.items()}
  assert not prompts["train"] & prompts["validation"]
  assert not prompts["test"] & (prompts["train"] | prompts["validation"])
  problems = arithmetic.generate(arithmetic.ArithmeticConfig(num_steps=2, max_value=10, ops="+-"), 3, 0, "test")
  assert pairs["test"][0].prompt.startswith("Question: " + problems[0].question)


def test_folder_is_what_rm_reads(splits):
  folder, pairs = splits
  read = read_splits(folder, 0.1)
  for split, mine in (("train", "train"), ("test", "validation")):
    assert [(p.prompt, p.chosen, p.rejected) for p in read[split]] == [
        (p.prompt, p.chosen, p.rejected) for p in pairs[mine]]
  assert os.path.exists(os.path.join(folder, "heldout.jsonl"))


def test_bad_input():
  with pytest.raises(ValueError, match="split"):
    ap.make_pairs(TASK, 2, "dev")
  with pytest.raises(ConfigError, match="length_bias"):
    ap.make_pairs(TASK, 2, "train", length_bias=1.5)
  with pytest.raises(ConfigError, match="max_filler"):
    ap.make_pairs(TASK, 2, "train", max_filler=0)
  with pytest.raises(ConfigError, match="config.task"):
    ap.make_pairs(dict(TASK, name="gsm8k", path="/nonexistent"), 2, "train")


def test_wrong_solution():
  assert ap.wrong_solution("6 - 2 = 4. 4 - 2 = 2", 3) == "6 - 2 = 4. 4 - 2 = 3"
  with pytest.raises(ValueError, match="no '= '"):
    ap.wrong_solution("nothing", 3)
