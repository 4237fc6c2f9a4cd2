"""Bias attributes of preference pairs: a categorical label a per pair, for DIR's CLUB term and the evaluation.

A bias is a function (pair, response token counts) -> int in [0, num_classes), registered by name:

    @register_bias("my_bias", num_classes=2)
    def my_bias(pair: PreferencePair, counts: TokenCounts) -> int: ...

Built in:
- "length":     a = 1[len(chosen tokens) > len(rejected tokens)] (response token counts, prompt excluded);
- "sycophancy": a = pair.meta["sycophancy"], set by `inject_sycophancy` (1 = the pair was contaminated);
- "format":     a = 1[markdown_score(chosen) > markdown_score(rejected)].

Sycophancy, as in the DIR reference code: a fraction `contamination_ratio` of pairs is contaminated by prepending
a sycophantic prefix ("Yes, you are right. ") to ONE response, the chosen one with probability `side_prob`. The
reference training script passes ratio 0.8, side 0.4 (`run_debias_reward_models_train.py`; the 0.4 / 0.8 defaults
of its `build_dataset_HS3` are not what it trains with), so in training the prefix sits on the rejected side
somewhat more often than on the chosen one. a = 1 marks contaminated pairs whichever side got the prefix; a = 0
pairs are untouched. Evaluation reports accuracy on "natural" pairs (a = 0) and "adversarial" pairs (a = 1); an
adversarial test set uses side_prob = 0 (the prefix always on the REJECTED side), so a reward model that learned
"prefix => better" loses exactly there.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, NamedTuple, Sequence

import numpy as np

from jaxpt.config import ConfigError
from jaxpt.data.preference import PreferencePair
from jaxpt.registry import Registry

SYCOPHANTIC_PREFIX = "Yes, you are right. "


class TokenCounts(NamedTuple):
  """Token counts of the chosen and rejected responses (prompt excluded, no EOS)."""

  chosen: int
  rejected: int


BiasFn = Callable[[PreferencePair, TokenCounts], int]


@dataclasses.dataclass(frozen=True)
class _Bias:
  fn: BiasFn
  num_classes: int


BIASES: Registry[_Bias] = Registry("bias")


def register_bias(name: str, num_classes: int = 2) -> Callable[[BiasFn], BiasFn]:
  """Decorator registering a bias function under `name` in `BIASES`; its labels lie in [0, num_classes).
  ValueError if another function (or the same one with another num_classes) already has that name."""
  if num_classes < 2:
    raise ValueError(f"bias {name!r}: num_classes must be >= 2, got {num_classes}")

  def decorate(fn: BiasFn) -> BiasFn:
    entry = _Bias(fn, num_classes)
    if not (name in BIASES and BIASES.get(name) == entry):   # re-registering the same entry is a no-op
      BIASES.add(name, entry)
    return fn

  return decorate


def known_biases() -> tuple[str, ...]:
  return tuple(sorted(BIASES))


def _entry(name: str) -> _Bias:
  try:
    return BIASES.get(name)
  except KeyError as e:
    raise ConfigError("config.data.biases", e.args[0]) from None


def get_bias(name: str) -> BiasFn:
  """The registered bias function `name`; ConfigError (a ValueError) naming `config.data.biases` if unknown."""
  return _entry(name).fn


def num_classes(name: str) -> int:
  """Number of label values of bias `name` (the CLUB estimator's output size)."""
  return _entry(name).num_classes


def label(name: str, pair: PreferencePair, counts: TokenCounts) -> int:
  """The label of `pair` under bias `name`, checked to lie in [0, num_classes)."""
  entry = _entry(name)
  value = int(entry.fn(pair, counts))
  if not 0 <= value < entry.num_classes:
    raise ValueError(f"bias {name!r} labelled a pair {value}, outside [0, {entry.num_classes})")
  return value


@register_bias("length")
def length_bias(pair: PreferencePair, counts: TokenCounts) -> int:
  del pair
  return int(counts.chosen > counts.rejected)


@register_bias("sycophancy")
def sycophancy_bias(pair: PreferencePair, counts: TokenCounts) -> int:
  del counts
  if "sycophancy" not in pair.meta:
    raise ValueError("bias 'sycophancy' needs pairs from inject_sycophancy (data.sycophancy_ratio > 0)")
  return int(pair.meta["sycophancy"])


LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S", re.MULTILINE)
HEADER = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+\S", re.MULTILINE)
BOLD = re.compile(r"\*\*[^*\n]+?\*\*|__[^_\n]+?__")


def markdown_score(text: str) -> int:
  """Markdown structure of `text`: list-item lines + header lines + bold spans.

  List item: a line starting with '-', '*', '+' or 'N.'/'N)' then a space; header: a line starting with 1-6 '#'
  then a space; bold: **text** or __text__ on one line.
  """
  return len(LIST_ITEM.findall(text)) + len(HEADER.findall(text)) + len(BOLD.findall(text))


@register_bias("format")
def format_bias(pair: PreferencePair, counts: TokenCounts) -> int:
  del counts
  return int(markdown_score(pair.chosen) > markdown_score(pair.rejected))


def inject_sycophancy(pairs: Sequence[PreferencePair], contamination_ratio: float, side_prob: float,
                      prefix: str = SYCOPHANTIC_PREFIX, seed: int = 0) -> list[PreferencePair]:
  """Copies of `pairs` where each is contaminated with probability `contamination_ratio`.

  A contaminated pair gets `prefix` prepended to its chosen response with probability `side_prob`, else to its
  rejected response; meta["sycophancy"] = 1 and meta["sycophancy_side"] = "chosen" | "rejected". Other pairs keep
  their texts with meta["sycophancy"] = 0, meta["sycophancy_side"] = "none". Deterministic in `seed`: pair i's
  draws depend only on (seed, i).
  """
  for name, value in (("sycophancy_ratio", contamination_ratio), ("sycophancy_side_prob", side_prob)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"data.{name} must be in [0, 1], got {value}")
  draws = np.random.default_rng(seed).random((len(pairs), 2))
  out = []
  for pair, (u_contaminate, u_side) in zip(pairs, draws):
    if u_contaminate < contamination_ratio:
      side = "chosen" if u_side < side_prob else "rejected"
      chosen = prefix + pair.chosen if side == "chosen" else pair.chosen
      rejected = prefix + pair.rejected if side == "rejected" else pair.rejected
      meta = {**pair.meta, "sycophancy": 1, "sycophancy_side": side}
      out.append(PreferencePair(pair.prompt, chosen, rejected, meta))
    else:
      out.append(dataclasses.replace(pair, meta={**pair.meta, "sycophancy": 0, "sycophancy_side": "none"}))
  return out
