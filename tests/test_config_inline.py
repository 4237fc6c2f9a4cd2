"""Inline sections (`jaxpt.config.inline`): a section held by another whose fields live at the holder's level, so
composing config classes (RunConfig holds LoopConfig; RMConfig / DPOConfig hold DIRSettings) keeps every field path
(`--config.steps`, `--config.rm.mi_weight`, config.json, `--help`, allow_changes) as it was under inheritance."""

import dataclasses
import json
import pickle

import pytest

from jaxpt.config import (ConfigError, Section, as_dict, at_least, config_dict, describe_fields, from_section, inline,
                          section_values)
from jaxpt.engine import record
from jaxpt.engine.config import RunConfig, config_json
from jaxpt.engine.loop import LoopConfig
from jaxpt.engine.optim import OptimConfig
from jaxpt.models.config import ModelConfig
from jaxpt.trainers.dir_estimator import DIRSettings
from jaxpt.trainers.dpo import DPOConfig, DPORunConfig
from jaxpt.trainers.rm import RMConfig, RMRunConfig


@dataclasses.dataclass(frozen=True)
class Part(Section):
  """A part.

  Attributes:
    width: a width.
    depth: a depth.
  """

  width: int = 4
  depth: int = 2

  def check(self) -> None:
    at_least(self, "width", 1)

  def area(self) -> int:
    return self.width * self.depth


@dataclasses.dataclass(frozen=True)
class Holder(Section):
  """A holder.

  Attributes:
    name: a name.
    part: the part, inline.
    size: a size.
  """

  name: str = "a"
  part: Part = inline(Part(depth=3))
  size: int = 1

  def check(self) -> None:
    if self.size > self.width:
      raise ConfigError("size", f"must be <= width={self.width}", self.size)


def test_an_inline_sections_fields_live_at_the_holders_level():
  assert config_dict(Holder).to_dict() == {"name": "a", "width": 4, "depth": 3, "size": 1}
  assert config_dict(Holder, width=6).width == 6
  with pytest.raises(TypeError, match="unknown field 'widht' \\(did you mean 'width'\\?\\)"):
    config_dict(Holder, widht=6)
  held = from_section(Holder, {"width": 5, "size": 2}, "config.h")
  assert held == Holder(part=Part(width=5, depth=3), size=2) == Holder(width=5, size=2)  # the holder's keywords
  assert (held.width, held.depth, held.part.width, held.area()) == (5, 3, 5, 15)  # attributes read through
  assert dataclasses.replace(held, depth=7).part == Part(width=5, depth=7)
  assert as_dict(held) == section_values(held) == {"name": "a", "width": 5, "depth": 3, "size": 2}
  assert from_section(Holder, as_dict(held), "config.h") == held
  assert pickle.loads(pickle.dumps(held)) == held and hash(held) == hash(Holder(width=5, size=2))
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    held.nope  # noqa: B018
  assert [(row.path, row.default, row.help) for row in describe_fields(Holder, "h.")] == [
      ("h.name", "'a'", "a name."), ("h.width", "4", "a width."), ("h.depth", "3", "a depth."),
      ("h.size", "1", "a size.")]


def test_errors_name_an_inline_field_at_the_holders_path():
  for values, message in (({"width": 0}, "config.h.width=0: must be >= 1"),
                          ({"size": 9}, "config.h.size=9: must be <= width=4"),
                          ({"width": "x"}, "config.h.width='x': must be an integer"),
                          ({"part": {}}, "config.h.part: unknown field (known: depth, name, size, width)")):
    with pytest.raises(ConfigError) as error:
      from_section(Holder, values, "config.h")
    assert str(error.value) == message
  with pytest.raises(ConfigError, match="width=0: must be >= 1"):
    Holder(width=0)


def test_an_inline_field_repeating_a_holders_field_is_refused():
  @dataclasses.dataclass(frozen=True)
  class Clash(Section):
    width: int = 1
    part: Part = inline(Part())

  with pytest.raises(TypeError, match="inline field 'width' is already a field of Clash"):
    config_dict(Clash)


# The field paths the inheriting classes had (RunConfig(LoopConfig), RMConfig(DIRSettings, _RMLoss),
# DPOConfig(DIRSettings, _DPOLoss)), in their `--help` order.
LOOP = ["steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "async_checkpoints", "progress",
        "on_nonfinite", "max_skipped_steps"]
RUN = LOOP + ["model", "optim", "mesh", "seed", "init_from", "allow_changes"]
DIR = ["mi_weight", "bias", "club_mode", "inner_steps", "estimator_lr", "estimator_weight_decay", "estimator_hidden",
       "bias_classes"]
RM = ["loss", "margin", "label_smoothing", "center_coef", *DIR, "odin_corr_coef", "odin_ortho_coef",
      "odin_length_sign"]
DPO = ["beta", "label_smoothing", "dir", "mi_warmup_steps", *DIR]


def _dotted(tree, prefix=""):
  names = []
  for key in tree.keys():
    names += _dotted(tree[key], f"{prefix}{key}.") if hasattr(tree[key], "keys") else [f"{prefix}{key}"]
  return names


@pytest.mark.parametrize("cls, section, fields", [(RMRunConfig, "rm", RM), (DPORunConfig, "dpo", DPO)])
def test_run_rm_and_dpo_field_paths_are_the_inherited_ones(cls, section, fields):
  assert RunConfig.__bases__ == (Section,) and not issubclass(RunConfig, LoopConfig)
  assert RMConfig.__bases__ == DPOConfig.__bases__ == (Section,)  # composed: no multiple inheritance
  defaults = config_dict(cls, model=ModelConfig(), optim=OptimConfig())
  assert set(RUN) <= set(defaults) and sorted(defaults[section]) == sorted(fields)  # (a ConfigDict sorts its keys)
  names = set(_dotted(defaults))
  assert {f"{section}.{name}" for name in fields} <= names and set(LOOP) <= names and "loop" not in defaults
  rows = [row.path for row in describe_fields(cls)]  # `jaxpt rm --help` / `jaxpt dpo --help`
  assert rows[:len(LOOP)] == LOOP and "loop" not in rows
  assert [p for p in rows if p.startswith(f"{section}.")] == [f"{section}.{name}" for name in fields]
  assert set(rows) - {row.path for row in describe_fields(cls) if row.section} == names
  assert DPOConfig().mi_weight == 1.0 and RMConfig().mi_weight == DIRSettings().mi_weight == 0.1


def test_config_dict_overrides_and_python_attributes_keep_their_paths():
  config = config_dict(RMRunConfig, model=ModelConfig(), optim=OptimConfig(), steps=40)
  config.steps = 50  # as config files and notebooks set them
  config.rm.mi_weight = 0.25
  config.rm.inner_steps = 2
  checked = from_section(RMRunConfig, config, "config")
  assert (checked.steps, checked.loop.steps, checked.rm.mi_weight, checked.rm.dir_settings.inner_steps) == (
      50, 50, 0.25, 2)
  assert dataclasses.replace(checked, steps=60).loop == dataclasses.replace(checked.loop, steps=60)
  assert dataclasses.replace(checked.rm, mi_weight=0.5).dir_settings.mi_weight == 0.5
  with pytest.raises(ConfigError, match=r"^config\.rm\.mi_weight=-1\.0: must be in \[0\.0, inf\]$"):
    from_section(RMRunConfig, {**config.to_dict(), "rm": {"mi_weight": -1.0}}, "config")
  with pytest.raises(ConfigError, match=r"^config\.steps=-1: must be >= 0$"):
    from_section(RMRunConfig, {**config.to_dict(), "steps": -1}, "config")


def test_a_recorded_config_json_keeps_its_layout_and_round_trips(tmp_path):
  workdir = str(tmp_path)
  config = from_section(RMRunConfig, {"model": {}, "optim": {}, "steps": 30, "rm": {"mi_weight": 0.2}}, "config")
  record.record_launch(workdir, config, {"corpus": "c0", "tokenizer": "t0"})
  recorded = json.loads((tmp_path / record.CONFIG_FILE).read_text())
  assert list(recorded)[:1 + len(RUN)] == ["trainer", *RUN] and list(recorded["rm"]) == RM
  assert recorded["steps"] == 30 and recorded["rm"]["mi_weight"] == 0.2 and "loop" not in recorded
  assert from_section(RMRunConfig, recorded, "config") == config
  assert config_json(config) == {k: v for k, v in recorded.items() if k != "trainer"}
  (tmp_path / "checkpoints" / "7").mkdir(parents=True)  # resuming it: allow_changes names the same dotted fields
  changed = from_section(RMRunConfig, {**recorded, "steps": 60, "rm": {**recorded["rm"], "mi_weight": 0.3},
                                       "allow_changes": "steps,rm.mi_weight"}, "config")
  assert record.record_launch(workdir, changed, {"corpus": "c0", "tokenizer": "t0"}) == {
      "steps": [30, 60], "rm.mi_weight": [0.2, 0.3]}
  with pytest.raises(record.RunMismatch, match=r"steps \(60 -> 90\)"):
    record.record_launch(workdir, dataclasses.replace(changed, steps=90, allow_changes=""), {})


def test_fields_left_out_keep_the_holders_default_instance():
  assert from_section(DPORunConfig, {"model": {}, "optim": {}}, "config").dpo.mi_weight == 1.0
  assert from_section(DPOConfig, {"inner_steps": 2}, "config.dpo") == DPOConfig(inner_steps=2)
  assert DPOConfig(inner_steps=2).mi_weight == 1.0
