"""Verifiable math rewards: boxed extraction, </think> handling, normalisation, GSM8K ground truth; the decoded
response texts they read."""

import json
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpt.rl import rewards as R
from jaxpt.rl import rollouts

GSM8K_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "gsm8k")


def test_brace_matching_with_nested_braces():
  assert R.last_boxed(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
  assert R.last_boxed(r"\boxed{\left\{ x : x^{2} > 1 \right\}}") == r"\left\{ x : x^{2} > 1 \right\}"
  assert R.last_boxed(r"\boxed{{{7}}}") == "{{7}}"
  assert R.last_boxed(r"\boxed {42}") == "42"
  assert R.last_boxed(r"\boxed{}") == ""


def test_multiple_boxed_last_wins():
  assert R.last_boxed(r"\boxed{1} then \boxed{2} finally \boxed{\frac{3}{4}}") == r"\frac{3}{4}"
  assert R.math_reward(r"first \boxed{5}, corrected: \boxed{6}", "6") == 1.0
  assert R.math_reward(r"first \boxed{6}, corrected: \boxed{5}", "6") == 0.0


def test_unclosed_or_missing_box_has_no_answer():
  assert R.last_boxed("the answer is 12") is None
  assert R.last_boxed(r"\boxed{12} and then \boxed{1") is None   # truncated last box: no answer
  assert R.last_boxed(r"\boxed{\frac{1}{2}") is None
  assert R.math_reward("the answer is 12", "12") == 0.0


def test_think_handling():
  resp = r"<think>maybe \boxed{3}? no</think>The answer is \boxed{4}."
  assert R.strip_think(resp) == r"The answer is \boxed{4}."
  assert R.extract_answer(resp) == "4"
  assert R.math_reward(resp, "4") == 1.0 and R.math_reward(resp, "3") == 0.0
  # A box only inside the think block is not an answer; the LAST </think> counts.
  assert R.extract_answer(r"<think>\boxed{3}</think> I am done.") is None
  assert R.extract_answer(r"<think>a</think> \boxed{1} </think> \boxed{2}") == "2"
  assert R.extract_answer(r"<think>a</think> \boxed{1} </think> none") is None
  assert R.extract_answer(r"no think at all \boxed{9}") == "9"


@pytest.mark.parametrize("pred,gt", [
    ("3.0", "3"), ("3", "3.00"), ("1/2", "0.5"), (r"\frac{1}{2}", "0.5"), (r"\dfrac{1}{2}", ".5"),
    (r"-\frac{3}{4}", "-0.75"), ("1,000", "1000"), (r"\$1,234.50", "1234.5"), ("$18", "18"),
    (r"18 \text{ dollars}", "18"), ("18 dollars", "18"), ("18.", "18"), (r"\text{18}", "18"), ("x = 5", "5"),
    (r"50\%", "50"), ("+7", "7"), (r"1{,}000", "1000"), ("2,125", "2,125"), (" 42 ", "42"),
])
def test_equivalent_answers_match(pred, gt):
  assert R.answers_match(pred, gt), (pred, gt, R.normalize_answer(pred), R.normalize_answer(gt))


@pytest.mark.parametrize("pred,gt", [
    ("3.1", "3"), ("1/3", "0.333"), ("12", "21"), ("-5", "5"), ("1,2", "12"), ("", "0"), ("1/0", "0"),
    ("abc", "18"), (None, "3"), ("0.5", "5"),
])
def test_different_answers_do_not_match(pred, gt):
  assert not R.answers_match(pred, gt)


def test_parse_number_exact():
  assert R.parse_number("3.0") == 3 and R.parse_number("-1/4") == Fraction(-1, 4)
  assert R.parse_number(r"\frac{3}{6}") == Fraction(1, 2) and R.parse_number("1,000,000") == 10**6
  assert R.parse_number("1/0") is None and R.parse_number("x+1") is None


def test_parse_gsm8k_answer():
  assert R.parse_gsm8k_answer("5 + 4 = <<5+4=9>>9\n#### 9") == "9"
  assert R.parse_gsm8k_answer("...\n#### 2,125") == "2125"
  assert R.parse_gsm8k_answer("a #### 1\n#### -3") == "-3"
  with pytest.raises(ValueError, match="####"):
    R.parse_gsm8k_answer("no marker 5")


def test_format_reward():
  assert R.format_reward(r"<think>work</think> \boxed{5}", require_think=True) == 1.0
  assert R.format_reward(r"\boxed{5}") == 1.0
  assert R.format_reward(r"\boxed{5}", require_think=True) == 0.0
  assert R.format_reward(r"</think> x <think> \boxed{5}", require_think=True) == 0.0
  assert R.format_reward(r"<think>a</think><think>b</think>\boxed{5}", require_think=True) == 0.0
  assert R.format_reward(r"\boxed{ }") == 0.0
  assert R.format_reward(r"<think>\boxed{5}</think> bye") == 0.0
  assert R.format_reward(r"\boxed{5") == 0.0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(-10**9, 10**9), junk=st.text(alphabet="ab {}\\ ", max_size=20), other=st.integers(1, 10**6))
def test_property_boxed_integer_scores_exactly(n, junk, other):
  """Any integer, boxed last after arbitrary text (braces included): scores 1, a different integer scores 0."""
  resp = f"<think>{junk}</think> so the total is \\boxed{{{n:,}}}"
  assert R.math_reward(resp, str(n)) == 1.0
  assert R.math_reward(resp, str(n + other)) == 0.0
  assert R.math_reward(f"\\boxed{{{n}.0}}", str(n)) == 1.0


def test_gsm8k_first_200_test_answers():
  if not os.path.isdir(GSM8K_DIR):
    pytest.skip(f"GSM8K data not found at {GSM8K_DIR}")
  with open(os.path.join(GSM8K_DIR, "test.jsonl")) as f:
    rows = [json.loads(line) for _, line in zip(range(200), f)]
  assert len(rows) == 200
  for row in rows:
    gt = R.parse_gsm8k_answer(row["answer"])
    value = R.parse_number(gt)
    assert value is not None, gt
    assert R.gsm8k_reward(f"<think>{row['question']}</think> The answer is \\boxed{{{gt}}}.", row["answer"]) == 1.0
    raw = row["answer"].rsplit("####", 1)[1].strip()   # as written, e.g. '2,125'
    assert R.gsm8k_reward(f"\\boxed{{{raw}}}", row["answer"]) == 1.0
    assert R.gsm8k_reward(f"\\boxed{{{value + 1}}}", row["answer"]) == 0.0
    assert R.gsm8k_reward(f"\\boxed{{{gt}}} wait, \\boxed{{{value - 1}}}", row["answer"]) == 0.0
    assert R.gsm8k_reward(f"The answer is {gt}.", row["answer"]) == 0.0


def test_a_runs_stop_ids_are_the_tokenizers_then_the_configs():
  from types import SimpleNamespace

  from jaxpt.rl.collect import run_stop_ids
  from jaxpt.rl.sampler import SamplingConfig

  tokenizer = SimpleNamespace(stop_ids=(2, 7))  # EOS, then an end-of-turn id (generation_config.json)
  assert run_stop_ids(tokenizer, SamplingConfig(4)) == (2, 7)
  assert run_stop_ids(tokenizer, SamplingConfig(4, stop_ids=(9, 7))) == (2, 7, 9)  # the config's added, once


def test_response_texts_leave_out_eos_padding_and_ids_past_the_tokenizer():
  """A policy whose embedding has more rows than its tokenizer has pieces can sample such ids: no text, no crash."""
  decode = lambda ids: "".join("abcdefgh"[i] for i in ids)  # an 8-piece tokenizer
  tokens = np.array([[1, 2, 7, 0], [3, 9, 4, 5], [6, 1, 0, 0]])
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
  assert rollouts.response_texts(decode, tokens, mask, [7], vocab_size=8) == ["bc", "def", "gba"]
  assert rollouts.response_texts(decode, tokens, mask, [7, 6], vocab_size=8) == ["bc", "def", "ba"]  # + end of turn
  with pytest.raises(IndexError):  # what the trainer's decode did before it passed its vocab_size
    rollouts.response_texts(decode, tokens, mask, [7])
