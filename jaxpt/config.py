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
config files start from, so defaults are written once, on the dataclass; `as_dict(instance)` is a checked section's
JSON-able dict form (config.json).

A section may HOLD another one whose fields live at its own level in every dict form (`inline(default)`, see
`jaxpt.config_fields`): `RunConfig.loop`'s `steps` is `config.steps`, `RMConfig.dir_settings`' `mi_weight` is
`rm.mi_weight`, in the conversions above, in config.json, in the holder's constructor keywords (hence
`dataclasses.replace(config, steps=...)`) and in attribute reads (`config.steps` reads `config.loop.steps`).

A field's meaning is written once, in its section's docstring (an `Attributes:` block); `describe_fields(cls)`
(`jaxpt.config_fields`, re-exported here) lists every field of a run config for `jaxpt <subcommand> --help`, and a
test fails for a field without a meaning. This module imports only `jaxpt.config_fields` from jaxpt: every layer
may use it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import json
import numbers
import os
import types
import typing
from typing import Any, Mapping, TypeVar

import ml_collections
import numpy as np

from jaxpt.config_fields import (NO_VALUE, FieldDoc, describe_fields, dict_fields, field_help, field_types, inline,
                                 inline_fields, is_section, lifted_fields)

__all__ = ["ConfigError", "DataError", "FieldDoc", "Section", "as_dict", "at_least", "config_dict", "describe_fields",
           "fail", "field_help", "from_section", "in_range", "inline", "load_config_file", "one_of", "section_values"]

T = TypeVar("T")


class ConfigError(ValueError):
  """An impossible config value. `where` names the field(s) (`config.model.d_model`, or text naming several),
  `value` its value (omitted from the message when not given), `reason` what is wrong:

      str(ConfigError("config.model.d_model", "not divisible by model.num_heads=4", 130))
      == "config.model.d_model=130: not divisible by model.num_heads=4"
  """

  def __init__(self, where: str, reason: str, value: Any = NO_VALUE):
    self.where, self.reason, self.value = where, reason, value
    named = where if value is NO_VALUE else f"{where}={value!r}"
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


class _SectionType(type):
  """Section's metaclass: `Cls(steps=5)` / `dataclasses.replace(config, steps=5)` with `steps` a field of an inline
  section sets it there (on the given or default instance)."""

  def __call__(cls, *args: Any, **kwargs: Any) -> Any:
    if dataclasses.is_dataclass(cls) and inline_fields(cls):
      lifted, moved = lifted_fields(cls), {}
      for name in [name for name in kwargs if name in lifted]:
        moved.setdefault(lifted[name], {})[name] = kwargs.pop(name)
      defaults = {f.name: f.default for f in dataclasses.fields(cls)}
      for holder, values in moved.items():
        kwargs[holder] = dataclasses.replace(kwargs.get(holder, defaults[holder]), **values)
    return super().__call__(*args, **kwargs)


class Section(metaclass=_SectionType):
  """Base of config-section dataclasses: `check()` runs when an instance is made (also by dataclasses.replace)."""

  def __post_init__(self) -> None:
    self.check()

  def check(self) -> None:
    """Raises ConfigError(field, reason, value) for an impossible value; sections override it."""

  def __getattr__(self, name: str) -> Any:
    """An attribute of an inline section (`config.steps` is `config.loop.steps`), as if it were the parent's."""
    if not name.startswith("__"):
      for holder in inline_fields(type(self)) if dataclasses.is_dataclass(self) else ():
        part = self.__dict__.get(holder)
        if part is not None and hasattr(part, name):
          return getattr(part, name)
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def section_values(section: Any) -> dict[str, Any]:
  """The keys of a ConfigDict / FrozenConfigDict / mapping / dataclass instance as a plain dict (None: {}); an inline
  section's fields at the instance's level."""
  if section is None:
    return {}
  if dataclasses.is_dataclass(section) and not isinstance(section, type):
    values = {}
    for f in dataclasses.fields(section):
      value = getattr(section, f.name)
      values.update(section_values(value) if f.name in inline_fields(type(section)) else {f.name: value})
    return values
  if isinstance(section, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict, Mapping)):
    return {key: section[key] for key in section.keys()}
  raise TypeError(f"a config section must be a ConfigDict, a mapping or a dataclass, got {type(section).__name__}")


def _coerce(kind: Any, value: Any, where: str) -> Any:
  """`value` as the annotated `kind` (int, float, bool, str, `X | None`, `tuple[X, ...]`, a nested section)."""
  options = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else ()
  if options:
    if value is None and type(None) in options:
      return None
    (kind,) = [option for option in options if option is not type(None)]
  if typing.get_origin(kind) is tuple:  # a list or tuple (JSON and ml_collections give lists), each item coerced
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
      raise ConfigError(where, "must be a list or tuple", value)
    items = typing.get_args(kind)
    if items[-1] is not Ellipsis and len(items) != len(value):  # tuple[X, Y]: exactly that many
      raise ConfigError(where, f"must hold {len(items)} items", value)
    kinds = [items[0]] * len(value) if items[-1] is Ellipsis else items
    return tuple(_coerce(item, v, f"{where}[{i}]") for i, (item, v) in enumerate(zip(kinds, value)))
  if is_section(kind):
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
  inlined, lifted = inline_fields(cls), lifted_fields(cls)
  unknown = sorted(set(values) - set(dict_fields(cls)))
  if unknown:
    raise ConfigError(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(dict_fields(cls)))})")
  hints = field_types(cls)
  kwargs = {}
  for name, field in fields.items():
    if name in inlined:  # its fields sit among this section's (errors name `path.<field>`); those not given keep
      # the values of the field's default instance (DPOConfig's mi_weight 1.0, not DIRSettings' 0.1)
      given = {k: v for k, v in values.items() if lifted.get(k) == name}
      base = {} if field.default is dataclasses.MISSING else section_values(field.default)
      kwargs[name] = from_section(inlined[name], {**base, **given}, path)
    elif name in values:
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
  """Every field of section dataclass `cls` at its default (nested sections as ConfigDicts, an inline section's
  fields at this level), then `overrides`.

  A field without a default must be given. Fields whose default is None get an ml_collections placeholder of
  their type, so `--config.<field>=value` can still set them from the command line.
  """
  return ml_collections.ConfigDict(_default_values(cls, overrides))


def _default_values(cls: type, overrides: dict[str, Any]) -> dict[str, Any]:
  values: dict[str, Any] = {}
  hints, inlined, lifted = field_types(cls), inline_fields(cls), lifted_fields(cls)
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if field.name in overrides:
      value = overrides[field.name]
    elif field.default is not dataclasses.MISSING:
      value = field.default
    elif field.default_factory is not dataclasses.MISSING:
      value = field.default_factory()
    elif is_section(kind):
      value = None
    else:
      raise TypeError(f"config_dict({cls.__name__}): field {field.name!r} has no default; pass it")
    if field.name in inlined:
      given = {k: v for k, v in overrides.items() if lifted.get(k) == field.name}
      values.update(_default_values(kind, {**section_values(value), **given}))
      continue
    if is_section(kind):
      value = config_dict(kind, **section_values(value))
    elif value is None:  # a typed placeholder keeps `--config.<field>=value` possible
      options = [o for o in typing.get_args(kind) if o is not type(None)]
      value = ml_collections.config_dict.placeholder(options[0] if len(options) == 1 else object)
    else:
      value = _coerce(kind, value, f"{cls.__name__}.{field.name}")  # e.g. 0 for a float field stays a float
    values[field.name] = value
  unknown = sorted(set(overrides) - set(values) - set(inlined))
  if unknown:
    close = difflib.get_close_matches(unknown[0], list(values), n=1)  # a TypeError: absl re-raises it by type
    raise TypeError(f"config_dict({cls.__name__}): unknown field {unknown[0]!r}" +
                    (f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(values)})"))
  return values


def as_dict(section: Any) -> dict[str, Any]:
  """Section dataclass instance `section` as `dataclasses.asdict` gives it, but an inline section's fields at its
  holder's level: the dict form config.json records and `from_section` reads back."""
  return {name: _plain(value) for name, value in section_values(section).items()}


def _plain(value: Any) -> Any:
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return as_dict(value)
  if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
    return type(value)(*(_plain(v) for v in value))
  if isinstance(value, (list, tuple)):
    return type(value)(_plain(v) for v in value)
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  return copy.deepcopy(value)


def load_config_file(path: str, *args: Any) -> ml_collections.ConfigDict:
  """`get_config(*args)` of a config file (as `--config=path` loads it), e.g. to build on a sibling config."""
  path = os.path.expanduser(path)
  spec = importlib.util.spec_from_file_location(f"_jaxpt_config_{abs(hash(path))}", path)
  if spec is None or spec.loader is None:
    raise FileNotFoundError(f"no config file at {path}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


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
