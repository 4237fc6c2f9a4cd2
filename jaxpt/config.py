"""Run configs: `ConfigError` and the one way a config section becomes a validated, frozen dataclass.

A run config is data: an ml_collections ConfigDict (`experiments/configs/*.py`), a dict, or None (all defaults).
Each section of it is described by a frozen dataclass deriving from `Section`, whose fields are the section's keys
and whose `check()` (run on construction, so every instance is valid) holds its rules, raising
ConfigError(field, reason, value) with a RELATIVE field name. `from_section(cls, section, path)` is the one
conversion:

    values  = section's keys; an unknown key, a wrong type or an absent field without a default -> ConfigError
    fields  = coerced to the annotation (int -> float; a dataclass-typed field is a nested section, converted
              recursively at `<path>.<field>`)
    checks  = `cls(**fields)` runs `check()`; its error is re-raised under `path`

so every error is one line naming the dotted path, the value and the reason:

    config.model.d_model=130: not divisible by model.num_heads=4

`config_dict(cls, **overrides)` goes the other way: every field at its default as a ConfigDict, the form experiment
config files start from, so defaults are written once, on the dataclass.

A field's meaning is written once, in its section's docstring, as a Google-style `Attributes:` block (`name: text`,
continuation lines indented deeper; a subclass documents the fields it adds). `field_help(cls)` reads it and
`describe_fields(cls)` lists every field of a run config, nested sections included (dotted path, type, default,
meaning): `jaxpt <subcommand> --help` prints that list, and a test fails for a field without a meaning.
This module imports nothing from jaxpt: every layer may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import inspect
import json
import numbers
import os
import re
import types
import typing
from typing import Any, Mapping, TypeVar

import ml_collections
import numpy as np

__all__ = ["ConfigError", "DataError", "FieldDoc", "Section", "at_least", "config_dict", "describe_fields", "fail",
           "field_help", "from_section", "in_range", "load_config_file", "one_of", "section_values"]

T = TypeVar("T")
_NO_VALUE = object()


class ConfigError(ValueError):
  """An impossible config value. `where` names the field(s) (`config.model.d_model`, or text naming several),
  `value` its value (omitted from the message when not given), `reason` what is wrong:

      str(ConfigError("config.model.d_model", "not divisible by model.num_heads=4", 130))
      == "config.model.d_model=130: not divisible by model.num_heads=4"
  """

  def __init__(self, where: str, reason: str, value: Any = _NO_VALUE):
    self.where, self.reason, self.value = where, reason, value
    named = where if value is _NO_VALUE else f"{where}={value!r}"
    super().__init__(f"{named}: {reason}")

  def under(self, prefix: str) -> "ConfigError":
    """The same error with `prefix.` in front of its field path (for an error raised with a relative name)."""
    return ConfigError(f"{prefix}.{self.where}" if self.where else prefix, self.reason, self.value)


class DataError(ValueError):
  """Bad input data: the message names the file and line, e.g. `train.jsonl:3: not valid JSON`."""


def read_json_object(path: str, required: bool = True) -> dict:
  """The JSON object in file `path` ({} when it does not exist and is not `required`); DataError naming the file
  (and line) when it is missing, not valid UTF-8 JSON, or not an object."""
  if not os.path.isfile(path):
    if required:
      raise DataError(f"{path}: no such file")
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    where = f", line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
    raise DataError(f"{path}: not valid JSON ({getattr(e, 'msg', e)}{where})") from None
  if not isinstance(value, dict):
    raise DataError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


class Section:
  """Base of config-section dataclasses: `check()` runs when an instance is made (also by dataclasses.replace)."""

  def __post_init__(self) -> None:
    self.check()

  def check(self) -> None:
    """Raises ConfigError(field, reason, value) for an impossible value; sections override it."""


def section_values(section: Any) -> dict[str, Any]:
  """The keys of a ConfigDict / FrozenConfigDict / mapping / dataclass instance as a plain dict (None: {})."""
  if section is None:
    return {}
  if dataclasses.is_dataclass(section) and not isinstance(section, type):
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
  if isinstance(section, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict, Mapping)):
    return {key: section[key] for key in section.keys()}
  raise TypeError(f"a config section must be a ConfigDict, a mapping or a dataclass, got {type(section).__name__}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _is_section(kind: Any) -> bool:
  return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _coerce(kind: Any, value: Any, where: str) -> Any:
  """`value` as the annotated `kind` (int, float, bool, str, `X | None`, a nested section)."""
  options = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else ()
  if options:
    if value is None and type(None) in options:
      return None
    (kind,) = [option for option in options if option is not type(None)]
  if _is_section(kind):
    return from_section(kind, value, where)
  if kind is bool:
    if not isinstance(value, (bool, np.bool_)):
      raise ConfigError(where, "must be True or False", value)
    return bool(value)
  if kind is int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise ConfigError(where, "must be an integer", value)
    return int(value)
  if kind is float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise ConfigError(where, "must be a number", value)
    return float(value)
  if kind is str:
    if not isinstance(value, str):
      raise ConfigError(where, "must be a string", value)
    return value
  return value


def from_section(cls: type[T], section: Any, path: str) -> T:
  """`section` (ConfigDict, dict, dataclass instance, or None for all defaults) as the checked dataclass `cls`.

  Raises ConfigError naming `<path>.<field>` for an unknown key, a missing required field, a value of the wrong
  type, or a value `cls.check` rejects. A class with a `prepare_values(values, path) -> values` classmethod sees
  the raw values first. An instance of `cls` is returned as it is (it was checked when made).
  """
  if isinstance(section, cls):
    return section
  if section is None and any(_required(f) for f in dataclasses.fields(cls)):
    raise ConfigError(path, "missing")
  values = section_values(section)
  if hasattr(cls, "prepare_values"):  # a section that fills fields from elsewhere (RunConfig: an HF checkpoint)
    values = cls.prepare_values(values, path)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(fields))})")
  hints = _hints(cls)
  kwargs = {}
  for name, field in fields.items():
    if name in values:
      kwargs[name] = _coerce(hints[name], values[name], f"{path}.{name}")
    elif _required(field):
      raise ConfigError(f"{path}.{name}", "missing")
  try:
    return cls(**kwargs)
  except ConfigError as e:
    raise e.under(path) from None


def _required(field: dataclasses.Field) -> bool:
  return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def config_dict(cls: type, **overrides: Any) -> ml_collections.ConfigDict:
  """Every field of section dataclass `cls` at its default (nested sections as ConfigDicts), then `overrides`.

  A field without a default must be given. Fields whose default is None get an ml_collections placeholder of
  their type, so `--config.<field>=value` can still set them from the command line.
  """
  values: dict[str, Any] = {}
  hints = _hints(cls)
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if field.name in overrides:
      value = overrides[field.name]
    elif field.default is not dataclasses.MISSING:
      value = field.default
    elif field.default_factory is not dataclasses.MISSING:
      value = field.default_factory()
    elif _is_section(kind):
      value = None
    else:
      raise TypeError(f"config_dict({cls.__name__}): field {field.name!r} has no default; pass it")
    if _is_section(kind):
      value = config_dict(kind, **section_values(value))
    elif value is None:  # a typed placeholder keeps `--config.<field>=value` possible
      options = [o for o in typing.get_args(kind) if o is not type(None)]
      value = ml_collections.config_dict.placeholder(options[0] if len(options) == 1 else object)
    else:
      value = _coerce(kind, value, f"{cls.__name__}.{field.name}")  # e.g. 0 for a float field stays a float
    values[field.name] = value
  unknown = sorted(set(overrides) - set(values))
  if unknown:
    close = difflib.get_close_matches(unknown[0], list(values), n=1)  # a TypeError: absl re-raises it by type
    raise TypeError(f"config_dict({cls.__name__}): unknown field {unknown[0]!r}" +
                    (f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(values)})"))
  return ml_collections.ConfigDict(values)


def load_config_file(path: str, *args: Any) -> ml_collections.ConfigDict:
  """`get_config(*args)` of a config file (as `--config=path` loads it), e.g. to build on a sibling config."""
  path = os.path.expanduser(path)
  spec = importlib.util.spec_from_file_location(f"_jaxpt_config_{abs(hash(path))}", path)
  if spec is None or spec.loader is None:
    raise FileNotFoundError(f"no config file at {path}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def _attributes(doc: str) -> dict[str, str]:
  """{name: text} of the `Attributes:` block of docstring `doc`: entries `name: text` (or `name (type): text`),
  continuation lines indented deeper (joined with spaces); a blank or dedented line ends the block."""
  lines = inspect.cleandoc(doc).splitlines()
  start = next((i for i, line in enumerate(lines) if line.strip() == "Attributes:"), None)
  if start is None:
    return {}
  entries: dict[str, str] = {}
  head = len(lines[start]) - len(lines[start].lstrip())
  entry_indent, name = None, None
  for line in lines[start + 1:]:
    indent = len(line) - len(line.lstrip())
    if not line.strip() or indent <= head:
      break
    match = re.fullmatch(r"(\w+)(?: \([^)]*\))?: *(.*)", line.strip())
    if entry_indent is None:
      entry_indent = indent
    if indent == entry_indent and match:
      name = match[1]
      entries[name] = match[2]
    elif name is not None and indent > entry_indent:
      entries[name] = f"{entries[name]} {line.strip()}".strip()
    else:
      break
  return entries


def field_help(cls: type) -> dict[str, str]:
  """{field: its meaning} for every field of section dataclass `cls`, from the `Attributes:` blocks of its
  docstring and its bases' ('' for a field none of them documents)."""
  docs: dict[str, str] = {}
  for klass in reversed(cls.__mro__):
    docs.update(_attributes(klass.__dict__.get("__doc__") or ""))
  return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class FieldDoc:
  """One field of a run config: dotted path, type, default (its repr; '' for a section, None when required),
  meaning; `section`: the field is a nested section (its own fields follow it)."""

  path: str
  type: str
  default: str | None
  help: str
  section: bool


def _type_name(kind: Any) -> str:
  if typing.get_origin(kind) in (typing.Union, types.UnionType):
    return " | ".join(_type_name(option) for option in typing.get_args(kind))
  if kind is type(None):
    return "None"
  return getattr(kind, "__name__", str(kind).replace("typing.", ""))


def describe_fields(cls: type, prefix: str = "", defaults: Any = None) -> list[FieldDoc]:
  """Every field of section dataclass `cls`, nested sections' fields after their section (depth-first, in field
  order). A nested field's default is its value in the section's default (`defaults`, an instance of `cls`)."""
  hints, meanings = _hints(cls), field_help(cls)
  rows = []
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if defaults is not None:
      value = getattr(defaults, field.name)
    elif field.default is not dataclasses.MISSING:
      value = field.default
    elif field.default_factory is not dataclasses.MISSING:
      value = field.default_factory()
    else:
      value = _NO_VALUE
    path = f"{prefix}{field.name}"
    section = _is_section(kind)
    shown = None if value is _NO_VALUE else "" if section else repr(value)
    rows.append(FieldDoc(path, _type_name(kind), shown, meanings[field.name], section))
    if section:
      rows += describe_fields(kind, f"{path}.", None if value is _NO_VALUE else value)
  return rows


# Checks a section's `check()` uses; each raises ConfigError(field, reason, value) with the RELATIVE field name.


def at_least(section: Any, field: str, low: float) -> None:
  """`section.field >= low` (`must be >= low`)."""
  value = getattr(section, field)
  if not value >= low:
    raise ConfigError(field, f"must be >= {low}", value)


def in_range(section: Any, field: str, low: float, high: float = float("inf"), *, low_open: bool = False,
             high_open: bool = False) -> None:
  """`section.field` in the interval (`must be in [low, high)` etc.; NaN fails)."""
  value = getattr(section, field)
  above = value > low if low_open else value >= low
  below = value < high if high_open else value <= high
  if not (above and below):
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    raise ConfigError(field, f"must be in {left}{float(low)}, {float(high)}{right}", value)


def one_of(section: Any, field: str, choices: Any) -> None:
  """`section.field` is one of `choices` (`must be one of a, b, c`)."""
  value = getattr(section, field)
  choices = tuple(choices)
  if value not in choices:
    raise ConfigError(field, f"must be one of {', '.join(map(str, choices))}", value)


def fail(section: Any, field: str, reason: str) -> ConfigError:
  """The ConfigError for `section.field` (to raise)."""
  return ConfigError(field, reason, getattr(section, field))
