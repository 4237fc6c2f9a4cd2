"""jaxpt.config: one conversion from a config section to a checked dataclass, errors naming the dotted path."""

import ast
import dataclasses
import glob
import os
import re

import ml_collections
import pytest

from jaxpt.config import (ConfigError, Section, _coerce, as_dict, at_least, config_dict, from_section,
                          load_config_file)
from jaxpt.registry import Registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Inner(Section):
  width: int = 4
  rate: float = 0.5
  name: str = "a"
  flag: bool = False
  size: int | None = None
  ids: tuple[int, ...] = ()

  def check(self) -> None:
    at_least(self, "width", 1)
    if self.name == "b" and self.width < 8:
      raise ConfigError("name", f"'b' needs inner.width >= 8, not {self.width}", self.name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outer(Section):
  inner: Inner
  optional: Inner = Inner(width=2)
  steps: int = 10

  def check(self) -> None:
    if self.steps < self.inner.width:
      raise ConfigError("steps", f"must be >= inner.width={self.inner.width}", self.steps)


def test_values_are_coerced_and_defaults_fill_absent_fields():
  assert _coerce(tuple[int, ...] | None, [1, 2], "x") == (1, 2) and _coerce(tuple[int, ...] | None, None, "x") is None
  assert _coerce(tuple[int, str], [1, "a"], "x") == (1, "a")
  with pytest.raises(ConfigError, match=r"^x=\[1\]: must hold 2 items$"):
    _coerce(tuple[int, str], [1], "x")
  outer = from_section(Outer, {"inner": {"rate": 2, "size": 3, "ids": [4, 5]}}, "config")
  assert outer == Outer(inner=Inner(rate=2.0, size=3, ids=(4, 5)))  # a list (JSON's, ml_collections') -> a tuple
  assert isinstance(outer.inner.rate, float) and isinstance(outer.inner.ids, tuple)
  assert from_section(Outer, outer, "config") is outer  # an instance was checked when it was made


@pytest.mark.parametrize("section, message", [
    ({"inner": {"widht": 3}}, "config.inner.widht: unknown field (known: flag, ids, name, rate, size, width)"),
    ({}, "config.inner: missing"),
    ({"inner": {"width": "4"}}, "config.inner.width='4': must be an integer"),
    ({"inner": {"width": True}}, "config.inner.width=True: must be an integer"),
    ({"inner": {"rate": "x"}}, "config.inner.rate='x': must be a number"),
    ({"inner": {"flag": 1}}, "config.inner.flag=1: must be True or False"),
    ({"inner": {"name": 3}}, "config.inner.name=3: must be a string"),
    ({"inner": {"ids": 3}}, "config.inner.ids=3: must be a list or tuple"),
    ({"inner": {"ids": "12"}}, "config.inner.ids='12': must be a list or tuple"),
    ({"inner": {"ids": [1, "x"]}}, "config.inner.ids[1]='x': must be an integer"),
    ({"inner": {"width": 0}}, "config.inner.width=0: must be >= 1"),
    ({"inner": {"name": "b"}}, "config.inner.name='b': 'b' needs inner.width >= 8, not 4"),
    ({"inner": {}, "optional": {"width": -1}}, "config.optional.width=-1: must be >= 1"),
    ({"inner": {}, "steps": 3}, "config.steps=3: must be >= inner.width=4"),
])
def test_errors_name_the_dotted_path_value_and_reason(section, message):
  with pytest.raises(ConfigError) as error:
    from_section(Outer, ml_collections.ConfigDict(section), "config")
  assert str(error.value) == message


def test_a_directly_made_section_is_checked_with_relative_names():
  with pytest.raises(ConfigError, match=r"^width=0: must be >= 1$"):
    Inner(width=0)
  with pytest.raises(ConfigError, match=r"^width=0: must be >= 1$"):
    dataclasses.replace(Inner(), width=0)


def test_config_dict_round_trips_through_from_section():
  config = config_dict(Outer, inner=dict(width=6), steps=12)
  assert isinstance(config.inner, ml_collections.ConfigDict) and config.optional.width == 2
  config.inner.size = 5  # the None default became a typed placeholder: overridable from the command line
  assert from_section(Outer, config, "config") == Outer(inner=Inner(width=6, size=5), steps=12)
  with pytest.raises(TypeError, match="unknown field 'stpes'"):
    config_dict(Outer, stpes=1)


@pytest.mark.parametrize("path", sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py"))
                                        if not p.endswith("__init__.py")))
def test_every_committed_config_file_converts(path):
  """Each config file loads by path (as `--config` does; no `experiments` package needed) and checks clean; its
  subcommand is its name's first word (tiny.py: pretrain; dapo, rlhf: grpo)."""
  from jaxpt import cli

  config = load_config_file(path)
  stem = os.path.basename(path)[:-3].split("_")[0]
  name = {"tiny": "pretrain", "dapo": "grpo", "rlhf": "grpo"}.get(stem, stem)
  if stem == "rlhf":  # its reward model is the command line's (--config.reward.model=RM); the check reads no files
    config.reward.model = "/rm"
  command = cli.SUBCOMMANDS[name]
  import importlib
  run_config = getattr(importlib.import_module(command.module), command.config_class)
  checked = from_section(run_config, config, "config")
  assert as_dict(checked)["steps"] == config.steps  # the loop's fields at the top level of the dict form


def test_sft_hf_documented_arithmetic_command_checks_clean():
  """experiments/configs/sft_hf.py's docstring gives the arithmetic task's overrides; as written they check clean
  (`--config.task.name=arithmetic` alone kept GSM8K's sizes, 0 = all, which the generator refuses)."""
  from jaxpt.trainers.sft import SFTRunConfig

  path = os.path.join(ROOT, "experiments", "configs", "sft_hf.py")
  with open(path) as f:
    doc = ast.get_docstring(ast.parse(f.read()))  # a command's backslash-newlines are gone: one line each
  command = next(line for line in doc.splitlines() if "--config.task.name=arithmetic" in line)
  overrides = {key: int(value) if value.isdigit() else value
               for key, value in re.findall(r"--config\.(\S+?)=(\S+)", command) if key != "init_from"}
  assert set(overrides) == {"task.name", "task.train_size", "task.test_size"}, command
  config = load_config_file(path)
  config.update_from_flattened_dict(overrides)
  task = from_section(SFTRunConfig, config, "config").task
  assert task.name == "arithmetic" and task.train_size >= 1 and task.test_size >= 1


def test_registry_names_its_kind_and_rejects_a_second_owner():
  things = Registry("widget")
  first = things.register("a")(lambda: 1)
  assert things.get("a") is first and "a" in things and things.names() == ("a",)
  things.add("a", first)  # the same object again is fine
  with pytest.raises(ValueError, match="widget 'a' is already registered"):
    things.add("a", lambda: 2)
  with pytest.raises(KeyError, match=r"unknown widget 'b' \(known: a\)"):
    things.get("b")


def test_config_dict_keeps_overrides_overridable_from_the_command_line():
  """None overrides become typed placeholders and scalar overrides take the field's type, so `--config.x=...` works
  on them (an int given for a float field would otherwise refuse `--config.x=0.1`)."""
  config = config_dict(Outer, inner=dict(size=None, rate=0))
  assert isinstance(config.inner.rate, float)
  config.inner.rate = 0.25
  config.inner.size = 7
  assert from_section(Outer, config, "config").inner == Inner(rate=0.25, size=7)
