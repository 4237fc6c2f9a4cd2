"""Verifiable math rewards (pure Python, no jax): boxed-answer extraction, GSM8K ground truth, answer matching.

Spec (`/work/shared/specs/grpo_clipo.md`, "Reward for math"): the answer is the content of the LAST `\\boxed{...}`
(brace matching) in the response, after the last `</think>` if there is one; the GSM8K ground truth is the number
after `####` (`parse_gsm8k_answer`, from the data layer: `jaxpt.data.math_prompts`); an answer is correct if the
normalised strings match or they are numerically equal; reward 1.0 / 0.0.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

from jaxpt.data.math_prompts import parse_gsm8k_answer

THINK_CLOSE = "</think>"
THINK_OPEN = "<think>"
_BOXED = re.compile(r"\\boxed\s*\{")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/(?:\d+(?:\.\d*)?|\.\d+))?$")
_NUMBER_WITH_UNIT = re.compile(r"^([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:/\d+)?)([a-z][a-z/.\-]*)$")
_VARIABLE_PREFIX = re.compile(r"^[a-z]\w*=(?=[-+.\d\\])")


def strip_think(response: str) -> str:
  """The part of `response` after the last `</think>`; the whole response when there is none."""
  idx = response.rfind(THINK_CLOSE)
  return response if idx < 0 else response[idx + len(THINK_CLOSE):]


def _match_brace(text: str, open_idx: int) -> Optional[int]:
  """Index of the `}` closing the `{` at `open_idx` (nesting counted), or None when it never closes."""
  depth = 0
  for i in range(open_idx, len(text)):
    c = text[i]
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return i
  return None


def last_boxed(text: str) -> Optional[str]:
  """Content of the last `\\boxed{...}` in `text`, braces matched (so `\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`).

  None when there is no `\\boxed{` or the last one never closes (a truncated generation has no final answer;
  an earlier complete box is not used in its place).
  """
  starts = [m.end() - 1 for m in _BOXED.finditer(text)]
  if not starts:
    return None
  end = _match_brace(text, starts[-1])
  if end is None:
    return None
  return text[starts[-1] + 1:end]


def extract_answer(response: str) -> Optional[str]:
  """The answer of a response: `last_boxed(strip_think(response))`."""
  return last_boxed(strip_think(response))


def normalize_answer(answer: str) -> str:
  """Canonical string form of an answer, for string comparison.

  In order: `\\text{x}`-like wrappers -> x; `\\dfrac`/`\\tfrac` -> `\\frac`; `\\frac{a}{b}` -> `a/b`; drop `$`,
  `\\%`/`%`, degree signs, LaTeX spacing (`\\!`, `\\,`, `\\;`, `\\ `), `\\left`/`\\right`, all whitespace;
  `{,}` -> `,`; lower-case; drop trailing periods; drop a leading `x=`; drop a unit word after a number
  (`18dollars` -> `18`); drop thousands commas in numbers (`1,000,000` -> `1000000`); drop a trailing `.0...`
  of an integer.
  """
  s = answer.strip()
  prev = None
  while prev != s:
    prev = s
    s = _TEXT_CMD.sub(r"\1", s)
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  prev = None
  while prev != s:
    prev = s
    s = _FRAC.sub(r"\1/\2", s)
  s = s.replace("{,}", ",")   # LaTeX thousands separator 1{,}000
  for token in ("\\$", "$", "\\%", "%", "^\\circ", "^{\\circ}", "\\circ", "°", "\\!", "\\,", "\\;", "\\:",
                "\\ ", "\\left", "\\right"):
    s = s.replace(token, "")
  s = re.sub(r"\s+", "", s).lower()
  s = s.rstrip(".")
  s = _VARIABLE_PREFIX.sub("", s)
  m = _NUMBER_WITH_UNIT.match(s)
  if m:
    s = m.group(1).rstrip(".")
  if _THOUSANDS.match(s):
    s = s.replace(",", "")
  s = re.sub(r"^([-+]?\d+)\.0*$", r"\1", s)
  if s.startswith("+"):
    s = s[1:]
  return s


def parse_number(answer: str) -> Optional[Fraction]:
  """Exact value of a normalised numeric answer ('3', '-2.50', '.5', '1/2', '0.5/2'), or None if not a number."""
  s = normalize_answer(answer)
  if not _NUMBER.match(s):
    return None
  sign = -1 if s.startswith("-") else 1
  s = s.lstrip("+-")
  num, _, den = s.partition("/")
  try:
    value = Fraction(num)
    if den:
      d = Fraction(den)
      if d == 0:
        return None
      value /= d
  except (ValueError, ZeroDivisionError):
    return None
  return sign * value


def answers_match(predicted: Optional[str], ground_truth: str) -> bool:
  """True if the normalised strings are equal or both parse to the same exact number (3.0 == 3, 1/2 == 0.5)."""
  if predicted is None:
    return False
  p, g = normalize_answer(predicted), normalize_answer(ground_truth)
  if not p:
    return False
  if p == g:
    return True
  pv, gv = parse_number(p), parse_number(g)
  return pv is not None and gv is not None and pv == gv


def math_reward(response: str, ground_truth: str) -> float:
  """1.0 if the response's answer (`extract_answer`) matches `ground_truth`, else 0.0."""
  return 1.0 if answers_match(extract_answer(response), ground_truth) else 0.0


def gsm8k_reward(response: str, gsm8k_answer_field: str) -> float:
  """`math_reward` against the GSM8K `answer` field (reasoning + `#### N`)."""
  return math_reward(response, parse_gsm8k_answer(gsm8k_answer_field))


def format_reward(response: str, require_think: bool = False) -> float:
  """1.0 for a well-formed response, else 0.0 (an optional shaping term; the spec's reward is `math_reward`).

  Well-formed: a closed, non-empty `\\boxed{...}` after the last `</think>`. With `require_think`, also exactly
  one `<think>` and one `</think>`, in that order, with the think block before the answer part.
  """
  answer = extract_answer(response)
  if answer is None or not answer.strip():
    return 0.0
  if require_think:
    if response.count(THINK_OPEN) != 1 or response.count(THINK_CLOSE) != 1:
      return 0.0
    if response.find(THINK_OPEN) > response.find(THINK_CLOSE):
      return 0.0
  return 1.0
