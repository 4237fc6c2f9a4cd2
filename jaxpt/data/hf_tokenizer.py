"""Hugging Face tokenizers: a checkpoint directory's `tokenizer.json` run by the `tokenizers` library, its chat template
rendered with jinja2 as `transformers` renders it (`jaxpt.data.chat_template`; neither torch nor transformers is
imported).

Files read from the directory:
    tokenizer.json           the pipeline (normalizer, pre-tokenizer, model, post-processor, decoder, added tokens);
                             its padding and truncation settings are switched off (transformers does so per call)
    tokenizer_config.json    special tokens (bos/eos/unk/sep/pad/cls/mask_token: a string or an AddedToken object),
                             added_tokens_decoder, chat_template (a string, or a list of {name, template}),
                             split_special_tokens, clean_up_tokenization_spaces
    special_tokens_map.json  only when tokenizer_config.json has no added_tokens_decoder (as transformers reads it)
    chat_template.jinja, additional_chat_templates/<name>.jinja   templates written by newer transformers; they take
                             priority over tokenizer_config.json's chat_template
    generation_config.json   eos_token_id (an id or a list): `stop_ids`
Named special tokens missing from tokenizer.json's added tokens are added as special tokens, as transformers adds them.

Parity with transformers 5 (`AutoTokenizer.from_pretrained(dir)`; tests/test_data_hf_tokenizer.py checks it on the
fixtures of tools/make_hf_fixtures.py): `encode(text, add_special_tokens=True)` is `tokenizer(text).input_ids` (the
post-processor of tokenizer.json decides what is added: transformers 5 ignores add_bos_token / add_eos_token when
there is a tokenizer.json), `decode(ids)` is `decode(ids, skip_special_tokens=True)` (clean_up_tokenization_spaces
applies to non-BPE models only, as in transformers 5), `apply_chat_template(messages, ...)` is
`apply_chat_template(messages, tokenize=False, ...)` and `encode_chat` its `tokenize=True` ids. Not supported:
transformers' `continue_final_message`, tools given as Python functions, and its per-model-class rebuilding of the
pipeline (a tokenizer_class whose transformers class rewrites the pipeline can tokenize differently there).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Tokenizer

from jaxpt.config import DataError, read_json_object
from jaxpt.data.chat_template import render_chat_template

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
GENERATION_CONFIG_FILE = "generation_config.json"
# What a copy of the tokenizer takes along (`jaxpt.data.tokenizer.copy_tokenizer`); additional_chat_templates/ too.
TOKENIZER_FILES = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, CHAT_TEMPLATE_FILE, GENERATION_CONFIG_FILE)
# transformers' SPECIAL_TOKENS_ATTRIBUTES: the variables a chat template sees (bos_token, eos_token, ...).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_SPECIAL_TOKENS = ("additional_special_tokens", "extra_special_tokens")
_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _added_token(value: Any, where: str) -> AddedToken:
  """A special token from a config: a string or an AddedToken object ({"content": ..., "lstrip": ..., ...})."""
  if isinstance(value, str):
    return AddedToken(value, special=True, normalized=False)
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    fields = {k: bool(v) for k, v in value.items() if k in _ADDED_TOKEN_FIELDS[1:]}
    return AddedToken(value["content"], **{**fields, "special": True})
  raise DataError(f"{where}: expected a string or an AddedToken object with a string content, got {value!r:.80}")


class HFTokenizer:
  """Text <-> ids with a Hugging Face checkpoint's tokenizer (the interface of jaxpt.data.tokenizer.Tokenizer).

  Special ids (None when the token is not configured): bos_id, eos_id, unk_id, configured_pad_id; pad_id is the
  configured pad token, else eos_id (Llama-3 has no pad token). `stop_ids`: eos_id and generation_config.json's
  eos_token_id(s).
  """

  def __init__(self, path: str):
    self.path = path
    file = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isdir(path):
      raise DataError(f"{path}: not a Hugging Face tokenizer directory (no such directory)")
    if not os.path.isfile(file):
      raise DataError(f"{path}: not a Hugging Face tokenizer directory (no {TOKENIZER_FILE})")
    serialized = read_json_object(file)
    try:
      self._tok = Tokenizer.from_file(file)
    except Exception as e:  # tokenizers raises a plain Exception naming the serde error
      raise DataError(f"{file}: not a tokenizers serialization ({str(e).splitlines()[0]})") from None
    self._tok.no_padding()
    self._tok.no_truncation()
    self._is_bpe = (serialized.get("model") or {}).get("type") == "BPE"
    config_file = os.path.join(path, CONFIG_FILE)
    config = read_json_object(config_file, required=False)
    self._config = config
    self._add_special_tokens(serialized, config, config_file)
    split = config.get("split_special_tokens", False)
    self._tok.encode_special_tokens = bool(split)
    self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (
        not self._is_bpe or bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
    self.chat_templates, self._template_sources = self._read_chat_templates(config, config_file)
    generation = read_json_object(os.path.join(path, GENERATION_CONFIG_FILE), required=False).get("eos_token_id")
    generation = [generation] if isinstance(generation, int) else list(generation or [])
    self.stop_ids = tuple(dict.fromkeys(i for i in [self.eos_id, *generation] if isinstance(i, int)))
    self._vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1

  @property
  def model_proto(self) -> bytes:
    """The bytes that identify this tokenizer (its files, as `TOKENIZER_FILES` lists them), named like the
    SentencePiece Tokenizer's serialized model so that run records and data caches treat both alike."""
    parts = []
    for name in TOKENIZER_FILES:
      file = os.path.join(self.path, name)
      if os.path.isfile(file):
        with open(file, "rb") as f:
          parts.append(name.encode() + b"\x00" + f.read())
    return b"\x00".join(parts)

  @classmethod
  def load(cls, path: str) -> "HFTokenizer":
    """The tokenizer of checkpoint directory `path` (or of the directory holding tokenizer.json file `path`)."""
    return cls(os.path.dirname(path) if os.path.basename(path) == TOKENIZER_FILE else path)

  def _add_special_tokens(self, serialized: dict, config: dict, config_file: str) -> None:
    """self.special_tokens {name: content}; the configured special tokens the pipeline lacks are added to it."""
    decoder = config.get("added_tokens_decoder")
    where = {key: f"{config_file}: {key}" for key in config}
    if decoder is None:  # transformers' legacy path: special_tokens_map.json overrides, tokenizer.json's tokens
      map_file = os.path.join(self.path, SPECIAL_TOKENS_MAP_FILE)
      overrides = read_json_object(map_file, required=False)
      config = {**config, **overrides}
      where.update({key: f"{map_file}: {key}" for key in overrides})
      known = {t.get("content"): t for t in serialized.get("added_tokens") or [] if isinstance(t, dict)}
    elif isinstance(decoder, dict):
      known = {}
      for index, token in sorted(decoder.items(), key=lambda item: int(item[0]) if item[0].isdigit() else -1):
        if not (index.isdigit() and isinstance(token, dict) and isinstance(token.get("content"), str)):
          raise DataError(f"{config_file}: added_tokens_decoder[{index!r}]: expected an id and an AddedToken object")
        known[token["content"]] = token
        if self._tok.token_to_id(token["content"]) is None:  # in the config only: transformers adds it
          fields = {k: bool(v) for k, v in token.items() if k in _ADDED_TOKEN_FIELDS[1:]}
          self._tok.add_tokens([AddedToken(token["content"], **fields)])
    else:
      raise DataError(f"{config_file}: added_tokens_decoder: expected an object, got {type(decoder).__name__}")
    named: dict[str, AddedToken] = {}
    for key in SPECIAL_TOKENS:
      if config.get(key) is not None:
        named[key] = _added_token(config[key], where[key])
    extra = []
    for key in EXTRA_SPECIAL_TOKENS:
      values = config.get(key) or []
      values = list(values.values()) if isinstance(values, dict) else values
      if not isinstance(values, list):
        raise DataError(f"{where[key]}: expected a list of tokens, got {type(values).__name__}")
      extra += [_added_token(value, where[key]) for value in values]
    tokens = []
    for token in [*named.values(), *extra]:  # tokenizer.json's own properties of a token it already has win
      own = known.get(token.content)
      if isinstance(own, dict):
        token = AddedToken(token.content, **{k: bool(v) for k, v in own.items() if k in _ADDED_TOKEN_FIELDS[1:4]},
                           normalized=bool(own.get("normalized", False)), special=True)
      tokens.append(token)
    if tokens:
      self._tok.add_special_tokens(tokens)
    self.special_tokens = {key: token.content for key, token in named.items()}

  def _read_chat_templates(self, config: dict, config_file: str) -> tuple[dict[str, str], dict[str, str]]:
    """{name: template} and {name: where it was read}; the files written by newer transformers take priority."""
    templates, sources = {}, {}
    value = config.get("chat_template")
    if isinstance(value, str):
      templates["default"], sources["default"] = value, f"{config_file}: chat_template"
    elif isinstance(value, list):
      for i, entry in enumerate(value):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
          raise DataError(f"{config_file}: chat_template[{i}]: expected {{\"name\": str, \"template\": str}}")
        templates[entry["name"]] = entry["template"]
        sources[entry["name"]] = f"{config_file}: chat_template[{i}] ({entry['name']})"
    elif value is not None:
      raise DataError(f"{config_file}: chat_template: expected a string or a list of {{name, template}}, "
                      f"got {type(value).__name__}")
    files = {}
    if os.path.isfile(os.path.join(self.path, CHAT_TEMPLATE_FILE)):
      files["default"] = os.path.join(self.path, CHAT_TEMPLATE_FILE)
    directory = os.path.join(self.path, CHAT_TEMPLATE_DIR)
    if os.path.isdir(directory):
      for name in sorted(os.listdir(directory)):
        if name.endswith(".jinja"):
          files[name.removesuffix(".jinja")] = os.path.join(directory, name)
    if files:  # as transformers: the template files replace whatever tokenizer_config.json holds
      templates, sources = {}, {}
      for name, file in files.items():
        try:
          with open(file, encoding="utf-8") as f:
            templates[name], sources[name] = f.read(), file
        except UnicodeDecodeError as e:
          raise DataError(f"{file}: not UTF-8 text ({e.reason})") from None
    return templates, sources

  @property
  def vocab_size(self) -> int:
    """Every id is in [0, vocab_size): the model's vocabulary plus the added tokens."""
    return self._vocab_size

  def _token_id(self, key: str) -> int | None:
    token = self.special_tokens.get(key)
    return None if token is None else self._tok.token_to_id(token)

  @property
  def bos_id(self) -> int | None:
    return self._token_id("bos_token")

  @property
  def eos_id(self) -> int | None:
    return self._token_id("eos_token")

  @property
  def unk_id(self) -> int | None:
    return self._token_id("unk_token")

  @property
  def configured_pad_id(self) -> int | None:
    """The configured pad token's id; None when there is none (config.json's pad_token_id: an export claims no
    pad token the tokenizer does not have)."""
    return self._token_id("pad_token")

  @property
  def pad_id(self) -> int | None:
    """The configured pad token's id, else eos_id (what batches are padded with)."""
    pad = self.configured_pad_id
    return self.eos_id if pad is None else pad

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Ids of `text`; add_special_tokens: also those tokenizer.json's post-processor adds (e.g. Llama's bos), as
    transformers' `tokenizer(text)` does by default."""
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: list[str], num_threads: int = 2, add_special_tokens: bool = False) -> list[list[int]]:
    """Ids of each text (tokenizers' own thread pool; `num_threads` is accepted for jaxpt's Tokenizer interface)."""
    del num_threads
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens (bos/eos/pad, chat markers) decode to nothing unless not `skip_special_tokens`."""
    text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
    if self.clean_up_tokenization_spaces:
      for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text

  def chat_template(self, chat_template: str | None = None, tools: list | None = None) -> tuple[str, str]:
    """(template, where it was read): `chat_template` as a template name or text, else the tool_use template when
    there are tools and one, else the default (transformers' choice)."""
    if chat_template is not None:
      if chat_template in self.chat_templates:
        return self.chat_templates[chat_template], self._template_sources[chat_template]
      return chat_template, "chat_template argument"
    if not self.chat_templates:
      raise DataError(f"{self.path}: no chat template ({CONFIG_FILE} has no chat_template and there is no "
                      f"{CHAT_TEMPLATE_FILE})")
    name = "tool_use" if tools is not None and "tool_use" in self.chat_templates else "default"
    if name not in self.chat_templates:
      raise DataError(f"{self._template_sources[next(iter(self.chat_templates))]}: several chat templates and no "
                      f"'default' (pass chat_template=one of {sorted(self.chat_templates)})")
    return self.chat_templates[name], self._template_sources[name]

  def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = False,
                          tools: list[dict] | None = None, documents: list[dict] | None = None,
                          chat_template: str | None = None, **kwargs) -> str:
    """The chat `messages` ([{"role", "content", ...}]) as the template renders it: the variables are messages,
    tools, documents, add_generation_prompt, the special tokens (bos_token, eos_token, ...) and `kwargs` (which win
    over the special tokens). DataError naming the template's file when it does not compile or raises."""
    template, source = self.chat_template(chat_template, tools)
    if not messages:
      raise ValueError("cannot apply a chat template to an empty conversation")
    if tools is not None and not all(isinstance(tool, Mapping) for tool in tools):
      raise TypeError("tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(doc, Mapping) for doc in documents):
      raise TypeError("documents must be dicts (with 'title' and 'text' keys)")
    return render_chat_template(template, source, messages, add_generation_prompt, tools, documents,
                                self.special_tokens, kwargs)

  def encode_chat(self, messages: Sequence[Mapping], add_generation_prompt: bool = False, **kwargs) -> list[int]:
    """Ids of the rendered chat (transformers' `apply_chat_template(..., tokenize=True)`: the template writes the
    special tokens, none are added)."""
    return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs))
