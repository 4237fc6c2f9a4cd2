"""The README's GSM8K configs (experiments/configs/{sft,grpo}_gsm8k.py) load and convert, and the prompt-length
errors a GSM8K run meets name fields that exist."""

import dataclasses
import os
import typing

import pytest

from jaxpt.config import ConfigError, from_section, load_config_file
from jaxpt.data import math_task
from jaxpt.data.arithmetic import Problem
from jaxpt.trainers.grpo import GRPORunConfig
from jaxpt.trainers.sft import SFTRunConfig

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


def field_type(cls: type, path: str) -> type:
  """The type of field `path` ('config.a.b') of run-config dataclass `cls`; KeyError when a part is no field."""
  root, *names = path.split(".")
  if root != "config" or not names:
    raise KeyError(path)
  for name in names:
    if not dataclasses.is_dataclass(cls) or name not in {f.name for f in dataclasses.fields(cls)}:
      raise KeyError(path)
    cls = typing.get_type_hints(cls)[name]
  return cls


def test_gsm8k_configs_load_and_convert():
  sft, grpo = (load_config_file(os.path.join(CONFIGS, f"{name}_gsm8k.py")) for name in ("sft", "grpo"))
  if not os.path.isdir(sft.task.path):
    pytest.skip(f"needs the GSM8K files at {sft.task.path} (../shared/data/gsm8k)")
  sft, grpo = from_section(SFTRunConfig, sft, "config"), from_section(GRPORunConfig, grpo, "config")
  assert sft.task.name == grpo.task.name == "gsm8k" and grpo.task == sft.task
  assert grpo.model == sft.model   # grpo --config.init_from=<the sft run> loads its params
  # The lengths the README commands need (see the files' docstrings): the longest example, 527 tokens, fits.
  assert sft.data.seq_len >= 527 and sft.model.max_seq_len >= sft.data.seq_len
  assert grpo.data.max_prompt_len >= 276


class _Tokenizer:
  """encode_batch -> 10 ids per text."""

  def encode_batch(self, texts):
    return [[1] * 10 for _ in texts]


@pytest.mark.parametrize("run_config, call", [
    (SFTRunConfig, lambda: math_task.encode_prompts(_Tokenizer(), ["q"], 4)),
    (SFTRunConfig, lambda: math_task.prompt_batches(_Tokenizer(), [Problem("q", "1", "", {})], 1, 4)),
    (GRPORunConfig, lambda: math_task.encode_prompts(_Tokenizer(), ["q"], 4, math_task.PROMPT_LEN_FIELD)),
])
def test_prompt_too_long_names_a_real_field(run_config, call):
  """A too-long prompt is blamed on a field of the run config (it named `prompt_len`, which no config has)."""
  with pytest.raises(ConfigError, match="has 10 tokens") as e:
    call()
  assert field_type(run_config, e.value.where) is int, e.value.where
  assert e.value.value == 4
