"""Chat templates rendered as `transformers` renders them: its jinja2 environment and the data a template sees.

`compile_chat_template(text)` builds transformers' sandboxed environment (trim_blocks, lstrip_blocks, loop
controls, `{% generation %}`, raise_exception, strftime_now, its tojson, dict and namespace);
`render_chat_template` renders one conversation, the messages, tools and documents rebuilt from plain JSON types
first, and turns a template that does not compile or raises into a DataError naming where the template was read.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jaxpt.config import DataError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases of a message's reasoning


class _GenerationTag(jinja2.ext.Extension):
  """`{% generation %} ... {% endgeneration %}` (transformers' assistant-mask marker): renders its body."""
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


class _TemplateDict:
  """The `dict` global of transformers' templates: dict(...) and dict.fromkeys(...) only."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
  """jinja2's namespace() refusing underscore-prefixed attributes, as transformers' is."""

  def __init__(*args, **kwargs):  # jinja2's Namespace signature, so that namespace(self=...) works
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check_name(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore-prefixed attributes ({name!r})")


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  """transformers' tojson: json.dumps without jinja2's HTML escaping, with its options."""
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
  return datetime.now().strftime(format)


@lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
  """`template` compiled in transformers' environment: sandboxed, trim_blocks, lstrip_blocks, loop controls,
  {% generation %}, raise_exception, strftime_now, its tojson, dict and namespace."""
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[_GenerationTag, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                     namespace=_TemplateNamespace)
  return env.from_string(template)


def _plain(value: Any) -> Any:
  """`value` rebuilt from plain JSON types (transformers' _plain_template_data): what a template may see."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  for kind in (bool, str, int, float):  # subclasses (enums, NumPy scalars) back to the base type
    if isinstance(value, kind):
      return kind(value)
  if isinstance(value, Mapping):
    return {_plain(k): _plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_plain(v) for v in value]
  if isinstance(value, tuple):
    return tuple(_plain(v) for v in value)
  if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
    return _plain(value.item())
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  return f"<{type(value).__name__}>"


def _chat_messages(messages: Sequence[Mapping]) -> list[dict]:
  """Messages as the template sees them: keys whose value is None dropped, reasoning under all its names."""
  chat = []
  for message in messages:
    if not isinstance(message, Mapping):
      raise TypeError(f"chat messages must be dicts, got {message!r:.80}")
    message = _plain({k: v for k, v in message.items() if v is not None})
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    chat.append(message)
  return chat


def render_chat_template(template: str, source: str, messages: Sequence[Mapping], add_generation_prompt: bool,
                         tools: list | None, documents: list | None, special_tokens: Mapping[str, str],
                         kwargs: Mapping[str, Any]) -> str:
  """`template` (read from `source`) rendered with messages, tools, documents, add_generation_prompt, the special
  tokens and `kwargs` (which win over them). DataError naming `source` when it does not compile or raises."""
  try:
    compiled = compile_chat_template(template)
  except jinja2.TemplateSyntaxError as e:
    raise DataError(f"{source}: the chat template does not compile ({e.message}, line {e.lineno})") from None
  variables = {**special_tokens, **_plain(kwargs)}
  try:
    return compiled.render(messages=_chat_messages(messages), tools=_plain(tools), documents=_plain(documents),
                           add_generation_prompt=add_generation_prompt, **variables)
  except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
    message = " ".join(str(e).split()) or type(e).__name__
    raise DataError(f"{source}: the chat template failed to render ({message})") from None
