"""What the fields of a config-section dataclass are (`jaxpt.config` builds on it): type hints, inline sections, and
each field's documented meaning for `jaxpt <subcommand> --help`.

An inline section (`inline(default)`) is a section HELD by another whose fields live at the holder's level in every
dict form: `RunConfig.loop` (`config.steps`, not `config.loop.steps`), `RMConfig.dir_settings` (`rm.mi_weight`).
`lifted_fields(cls)` maps those names to the field holding them; `jaxpt.config` uses it in `from_section`,
`config_dict`, `as_dict`, `section_values`, `Section`'s constructor keywords and attribute reads, and
`describe_fields` lists the fields in the holder's place. An inline section keeps its own `check()` and
`Attributes:` docs.

A field's meaning is written once, in its section's docstring, as a Google-style `Attributes:` block (`name: text`,
continuation lines indented deeper; a subclass documents the fields it adds). `field_help(cls)` reads it and
`describe_fields(cls)` lists every field of a run config, nested sections included (dotted path, type, default,
meaning). This module imports nothing from jaxpt.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from typing import Any

__all__ = ["NO_VALUE", "FieldDoc", "attributes_block", "describe_fields", "dict_fields", "field_help", "field_types",
           "inline", "inline_fields", "is_section", "lifted_fields"]

NO_VALUE = object()  # a field without a default
_INLINE = "jaxpt.config.inline"  # the field metadata key `inline` sets


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def is_section(kind: Any) -> bool:
  return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def inline(default: Any) -> Any:
  """A field holding section `default` (an instance) whose fields live at the parent's level in the dict forms,
  the constructor's keywords and attribute reads (module docstring): `loop: LoopConfig = inline(LoopConfig())`."""
  return dataclasses.field(default=default, metadata={_INLINE: True})


@functools.cache
def inline_fields(cls: type) -> dict[str, type]:
  """{field: its section type} of the inline fields of dataclass `cls`."""
  marked = [f.name for f in dataclasses.fields(cls) if f.metadata.get(_INLINE)]
  return {name: field_types(cls)[name] for name in marked}


@functools.cache
def lifted_fields(cls: type) -> dict[str, str]:
  """{dict-form field name: the inline field that holds it} for the fields `cls`'s inline sections put at its level
  (TypeError when one repeats a field of `cls` or of another inline section)."""
  lifted: dict[str, str] = {}
  own = {f.name for f in dataclasses.fields(cls)}
  for holder, kind in inline_fields(cls).items():
    for name in dict_fields(kind):
      if name in own or name in lifted:
        raise TypeError(f"{cls.__name__}.{holder}: inline field {name!r} is already a field of {cls.__name__}")
      lifted[name] = holder
  return lifted


def dict_fields(cls: type) -> list[str]:
  """The field names of `cls`'s dict form, in order: its fields, an inline section's in its place."""
  names: list[str] = []
  for f in dataclasses.fields(cls):
    names += dict_fields(inline_fields(cls)[f.name]) if f.name in inline_fields(cls) else [f.name]
  return names


def attributes_block(doc: str) -> dict[str, str]:
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
    docs.update(attributes_block(klass.__dict__.get("__doc__") or ""))
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
  if typing.get_args(kind):  # a generic alias: tuple[int, ...]
    items = ", ".join("..." if item is Ellipsis else _type_name(item) for item in typing.get_args(kind))
    return f"{_type_name(typing.get_origin(kind))}[{items}]"
  return getattr(kind, "__name__", str(kind).replace("typing.", ""))


def describe_fields(cls: type, prefix: str = "", defaults: Any = None) -> list[FieldDoc]:
  """Every field of section dataclass `cls`, nested sections' fields after their section (depth-first, in field
  order). A nested field's default is its value in the section's default (`defaults`, an instance of `cls`)."""
  hints, meanings = field_types(cls), field_help(cls)
  rows = []
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if field.name in inline_fields(cls):  # its fields are listed at this level, in its place
      held = getattr(defaults, field.name) if defaults is not None else field.default
      rows += describe_fields(kind, prefix, None if held is dataclasses.MISSING else held)
      continue
    if defaults is not None:
      value = getattr(defaults, field.name)
    elif field.default is not dataclasses.MISSING:
      value = field.default
    elif field.default_factory is not dataclasses.MISSING:
      value = field.default_factory()
    else:
      value = NO_VALUE
    path = f"{prefix}{field.name}"
    section = is_section(kind)
    shown = None if value is NO_VALUE else "" if section else repr(value)
    rows.append(FieldDoc(path, _type_name(kind), shown, meanings[field.name], section))
    if section:
      rows += describe_fields(kind, f"{path}.", None if value is NO_VALUE else value)
  return rows
