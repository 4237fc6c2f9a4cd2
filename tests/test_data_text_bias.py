"""Per-text bias detectors (jaxpt.data.text_bias): what each flags and what it leaves, and the shares RL logs."""

import numpy as np
import pytest

from jaxpt.data import text_bias
from jaxpt.data.bias import SYCOPHANTIC_PREFIX
from jaxpt.registry import Registry

CASES = {
    "sycophancy": ([SYCOPHANTIC_PREFIX + "12", "Great question! The answer is 4.", "I AGREE: 7", "You\u2019re right."],
                   ["The answer is 12.", "right angle", "agreement 3", "yours is 5", ""]),
    "list": (["Steps:\n- add 2\n- add 3", "1. add\n2. done", "  * item"],
             ["-5 + 3 = -2", "3 * 4 = 12", "2.5 is the answer", "**x**"]),
    "bold": (["the **answer** is 5", "__yes__"], ["2 * 3 * 4", "a ** b", "**\nno**", "- item"]),
    "format": (["# Answer\n5", "- 5", "**5**"], ["5", "2 * 3 = 6", "#5"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_detector_flags_its_bias_and_leaves_plain_answers(name):
  flagged, plain = CASES[name]
  detector = text_bias.TEXT_BIASES.get(name)
  assert [detector(t) for t in flagged] == [True] * len(flagged)
  assert [detector(t) for t in plain] == [False] * len(plain)


def test_every_builtin_detector_has_cases():
  assert set(text_bias.TEXT_BIASES.names()) == set(CASES)


def test_shares_are_the_fraction_of_texts_each_detector_flags():
  texts = ["- a", "You are right. 5", "5", "**5**"]
  flags = text_bias.flags(texts)
  assert {k: v.tolist() for k, v in flags.items()} == {
      "sycophancy": [False, True, False, False], "list": [True, False, False, False],
      "bold": [False, False, False, True], "format": [True, False, False, True]}
  assert text_bias.shares(flags) == {"bias_sycophancy_share": 0.25, "bias_list_share": 0.25,
                                     "bias_bold_share": 0.25, "bias_format_share": 0.5}
  assert text_bias.flags(texts, ["bold"]).keys() == {"bold"}
  assert np.isnan(text_bias.shares(text_bias.flags([]))["bias_list_share"])


def test_a_registered_detector_joins_the_monitors(monkeypatch):
  registry = Registry("text bias")  # this test's own copy: the registered detector stays out of other tests
  for known in text_bias.TEXT_BIASES.names():
    registry.add(known, text_bias.TEXT_BIASES.get(known))
  monkeypatch.setattr(text_bias, "TEXT_BIASES", registry)
  name = "exclamation"
  text_bias.register_text_bias(name)(lambda text: "!" in text)
  assert text_bias.shares(text_bias.flags(["a!", "b"], [name])) == {f"bias_{name}_share": 0.5}
  assert text_bias.flags(["a!"]).keys() == {*CASES, name}
  with pytest.raises(ValueError, match=f"text bias '{name}' is already registered"):
    text_bias.register_text_bias(name)(lambda text: False)
