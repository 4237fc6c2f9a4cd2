"""Hugging Face tokenizers (`jaxpt.data.hf_tokenizer`) against transformers' own outputs, without transformers.

tests/assets/hf/<family>/tokenizer_reference.json was written by tools/make_hf_fixtures.py with
`AutoTokenizer.from_pretrained(dir)` (transformers 5): encodings with and without special tokens, decodings, rendered
chats (system / user / assistant turns, tools and tool calls, reasoning, template kwargs) and their ids.
"""

import datetime
import json
import os
import shutil

import pytest

from jaxpt.config import DataError
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.data.chat_template import compile_chat_template
from jaxpt.data.hf_tokenizer import HFTokenizer
from jaxpt.data.tokenizer import Tokenizer, load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "tests", "assets", "hf")
FAMILIES = sorted(f for f in os.listdir(ASSETS) if os.path.isfile(os.path.join(ASSETS, f, "tokenizer_reference.json")))
# transformers 5 loads model_type qwen2 with its Qwen2Tokenizer class, whose unk_token defaults to <|endoftext|> when
# tokenizer_config.json does not name one; jaxpt reads the files only (the hub's Qwen2.5 configs say unk_token null).
CLASS_DEFAULTS = {"qwen2": {"unk_token"}}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
  path = os.path.join(ASSETS, request.param)
  with open(os.path.join(path, "tokenizer_reference.json"), encoding="utf-8") as f:
    ref = json.load(f)
  return request.param, HFTokenizer(path), ref


def one_line_error(match, fn, *args, **kwargs) -> str:
  with pytest.raises(DataError, match=match) as info:
    fn(*args, **kwargs)
  message = str(info.value)
  assert "\n" not in message, message
  return message


def copy_family(tmp_path, name="qwen2"):
  path = tmp_path / name
  shutil.copytree(os.path.join(ASSETS, name), path)
  return path


def edit_json(path, **changes):
  value = json.loads(path.read_text(encoding="utf-8"))
  for key, new in changes.items():
    if new is None:
      value.pop(key, None)
    else:
      value[key] = new
  path.write_text(json.dumps(value), encoding="utf-8")


def test_every_family_has_a_tokenizer():
  assert FAMILIES == ["llama", "mistral", "qwen2", "qwen3"]


def test_encode_matches_transformers(family):
  _, tok, ref = family
  for case in ref["texts"]:
    assert tok.encode(case["text"]) == case["ids"], case["text"]
    assert tok.encode(case["text"], add_special_tokens=True) == case["ids_special"], case["text"]
  texts = [case["text"] for case in ref["texts"]]
  assert tok.encode_batch(texts) == [case["ids"] for case in ref["texts"]]
  assert tok.encode_batch(texts, add_special_tokens=True) == [case["ids_special"] for case in ref["texts"]]


def test_decode_matches_transformers(family):
  _, tok, ref = family
  for case in ref["texts"]:
    assert tok.decode(case["ids_special"]) == case["decoded"], case["text"]
    assert tok.decode(case["ids_special"], skip_special_tokens=False) == case["decoded_special"], case["text"]


def test_chat_matches_transformers(family):
  _, tok, ref = family
  assert ref["chats"]
  for chat in ref["chats"]:
    assert tok.apply_chat_template(chat["messages"], **chat["kwargs"]) == chat["rendered"]
    assert tok.encode_chat(chat["messages"], **chat["kwargs"]) == chat["ids"]
    assert tok.decode(chat["ids"]) == chat["decoded"]


def test_special_ids_match_transformers(family):
  name, tok, ref = family
  assert tok.vocab_size == ref["len"]
  with open(os.path.join(ASSETS, name, "config.json")) as f:
    assert tok.vocab_size <= json.load(f)["vocab_size"]
  skip = CLASS_DEFAULTS.get(name, set())
  assert tok.special_tokens == {k: v for k, v in ref["special_tokens_map"].items() if k not in skip}
  assert (tok.bos_id, tok.eos_id) == (ref["bos_token_id"], ref["eos_token_id"])
  assert tok.unk_id == (None if "unk_token" in skip else ref["unk_token_id"])
  # pad: the configured pad token, else eos (transformers leaves pad_token_id None).
  assert tok.pad_id == (ref["eos_token_id"] if ref["pad_token_id"] is None else ref["pad_token_id"])
  assert tok.stop_ids == (ref["eos_token_id"],)  # generation_config.json: eos_token_id 2
  ids = tok.encode("abc")
  assert tok.decode([tok.pad_id, *ids, tok.eos_id, tok.pad_id]) == tok.decode(ids)


def test_special_token_layouts():
  """What the fixtures exercise: Llama's post-processor bos, no pad (eos), Qwen's bos-less ChatML, Mistral's unk."""
  llama, mistral, qwen2 = (HFTokenizer(os.path.join(ASSETS, f)) for f in ("llama", "mistral", "qwen2"))
  assert llama.encode("hi", add_special_tokens=True) == [llama.bos_id, *llama.encode("hi")]
  assert llama.pad_id == llama.eos_id and llama.special_tokens.get("pad_token") is None
  assert qwen2.bos_id is None and qwen2.encode("hi", add_special_tokens=True) == qwen2.encode("hi")
  assert qwen2.pad_id != qwen2.eos_id
  assert mistral.unk_id == 0 and mistral.unk_id in mistral.encode("~")  # no piece or byte piece for "~"
  assert qwen2.encode("<|im_end|>") == [qwen2.eos_id]  # special tokens in text are matched (split_special_tokens)
  assert qwen2.decode(qwen2.encode("<tool_call>x")) == "<tool_call>x"  # an added token that is not special


def test_pad_fallback_and_stop_ids_from_files(tmp_path):
  path = copy_family(tmp_path)
  edit_json(path / "tokenizer_config.json", pad_token=None)
  edit_json(path / "generation_config.json", eos_token_id=[2, 0])
  tok = HFTokenizer(str(path))
  assert tok.pad_id == tok.eos_id == 2
  assert tok.stop_ids == (2, 0)


def test_missing_special_token_is_added(tmp_path):
  path = copy_family(tmp_path)
  edit_json(path / "tokenizer_config.json", eos_token="<|new_eos|>")
  tok = HFTokenizer(str(path))
  assert tok.eos_id == 256 and tok.vocab_size == 257
  assert tok.encode("a<|new_eos|>")[-1] == 256
  assert tok.decode(tok.encode("a<|new_eos|>")) == "a"


def test_special_tokens_map_and_added_tokens_decoder(tmp_path):
  path = copy_family(tmp_path)
  # special_tokens_map.json (legacy) overrides tokenizer_config.json when it has no added_tokens_decoder.
  (path / "special_tokens_map.json").write_text(json.dumps(
      {"pad_token": {"content": "<|im_start|>", "lstrip": False, "rstrip": False, "normalized": False}}))
  assert HFTokenizer(str(path)).pad_id == 1
  # A config with added_tokens_decoder (as transformers 4 writes it) is read from there; the map is ignored.
  with open(path / "tokenizer.json", encoding="utf-8") as f:
    added = {str(t.pop("id")): t for t in json.load(f)["added_tokens"]}
  edit_json(path / "tokenizer_config.json", added_tokens_decoder=added)
  tok = HFTokenizer(str(path))
  assert tok.pad_id == 0 and tok.vocab_size == 256
  with open(os.path.join(ASSETS, "qwen2", "tokenizer_reference.json"), encoding="utf-8") as f:
    ref = json.load(f)
  assert [tok.encode(c["text"]) for c in ref["texts"]] == [c["ids"] for c in ref["texts"]]


def test_chat_template_sources(tmp_path):
  path = copy_family(tmp_path)
  messages = [{"role": "user", "content": "hi"}]
  (path / "chat_template.jinja").write_text("{{ bos_token is defined }}|{% for m in messages %}{{ m.content }}"
                                            "{% endfor %}{{ eos_token }}")
  (path / "additional_chat_templates").mkdir()
  (path / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools | tojson }}")
  tok = HFTokenizer(str(path))  # the .jinja files win over tokenizer_config.json's chat_template
  assert tok.apply_chat_template(messages) == "False|hi<|im_end|>"
  assert tok.apply_chat_template(messages, tools=[{"name": "f", "d": "ü<&>"}]) == '[{"name": "f", "d": "ü<&>"}]'
  assert tok.apply_chat_template(messages, chat_template="tool_use", tools=None) == "null"
  assert tok.apply_chat_template(messages, chat_template="{{ messages[0].role }}") == "user"
  # kwargs are template variables, and win over the special tokens
  assert tok.apply_chat_template(messages, eos_token="END") == "False|hiEND"


def test_template_environment_matches_transformers():
  render = lambda text, **kw: compile_chat_template(text).render(**kw)
  assert render("  {% if x %}\n  yes\n{% endif %}\n", x=True) == "  yes\n"  # trim_blocks + lstrip_blocks
  assert render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "01"
  assert render("{{ x | tojson(indent=2) }}", x={"a": "ö<"}) == '{\n  "a": "ö<"\n}'
  assert render("{% generation %}{{ 'answer' }}{% endgeneration %}") == "answer"
  assert render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ dict(a=1) }}") == "2{'a': 1}"
  assert render("{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)


def test_strftime_now_when_no_date_given():
  tok = HFTokenizer(os.path.join(ASSETS, "llama"))
  rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}])
  assert f"Today Date: {datetime.datetime.now().strftime('%d %b %Y')}" in rendered


def test_message_fields_as_transformers_passes_them():
  tok = HFTokenizer(os.path.join(ASSETS, "qwen3"))
  template = "{% for m in messages %}{{ m.keys() | sort | join(',') }};{% endfor %}"
  messages = [{"role": "assistant", "content": "4", "thinking": "t", "tool_calls": None}]
  # None-valued keys dropped; reasoning under all of reasoning_content / thinking
  assert tok.apply_chat_template(messages, chat_template=template) == "content,reasoning_content,role,thinking;"


def test_missing_and_bad_files(tmp_path):
  one_line_error(r"no-such-dir: not a Hugging Face tokenizer directory \(no such directory\)",
                 HFTokenizer, str(tmp_path / "no-such-dir"))
  one_line_error(r"no tokenizer.json", HFTokenizer, str(tmp_path))
  path = copy_family(tmp_path)
  (path / "tokenizer.json").write_text('{"version": "1.0", ')
  one_line_error(r"tokenizer.json: not valid JSON", HFTokenizer, str(path))
  (path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
  one_line_error(r"tokenizer.json: not a tokenizers serialization", HFTokenizer, str(path))

  path = copy_family(tmp_path, "qwen3")
  (path / "tokenizer_config.json").write_text("[1, 2]")
  one_line_error(r"tokenizer_config.json: expected a JSON object, got list", HFTokenizer, str(path))
  (path / "tokenizer_config.json").write_text('{"eos_token": 5}')
  one_line_error(r"tokenizer_config.json: eos_token: expected a string or an AddedToken", HFTokenizer, str(path))
  (path / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x": {}}}')
  one_line_error(r"tokenizer_config.json: added_tokens_decoder\['x'\]", HFTokenizer, str(path))
  (path / "tokenizer_config.json").write_text("{}")
  (path / "special_tokens_map.json").write_text('{"pad_token": ["a"]}')
  one_line_error(r"special_tokens_map.json: pad_token: expected a string", HFTokenizer, str(path))


def test_bad_chat_templates(tmp_path):
  messages = [{"role": "user", "content": "hi"}]
  path = copy_family(tmp_path)
  edit_json(path / "tokenizer_config.json", chat_template={"default": "x"})
  one_line_error(r"tokenizer_config.json: chat_template: expected a string or a list", HFTokenizer, str(path))
  edit_json(path / "tokenizer_config.json", chat_template=[{"name": "a"}])
  one_line_error(r"tokenizer_config.json: chat_template\[0\]: expected", HFTokenizer, str(path))
  edit_json(path / "tokenizer_config.json", chat_template=[{"name": "a", "template": "x"}])
  one_line_error(r"tokenizer_config.json: chat_template\[0\] \(a\): several chat templates and no 'default' "
                 r"\(pass chat_template=one of \['a'\]\)", HFTokenizer(str(path)).apply_chat_template, messages)
  edit_json(path / "tokenizer_config.json", chat_template=None)
  one_line_error(r"qwen2: no chat template \(tokenizer_config.json has no chat_template and there is no "
                 r"chat_template.jinja\)", HFTokenizer(str(path)).apply_chat_template, messages)
  edit_json(path / "tokenizer_config.json", chat_template="{% for m in messages %}{{ m.content }")
  one_line_error(r"tokenizer_config.json: chat_template: the chat template does not compile \(.*line 1\)",
                 HFTokenizer(str(path)).apply_chat_template, messages)
  (path / "chat_template.jinja").write_text("{{ messages[0].content + 1 }}")
  one_line_error(r"chat_template.jinja: the chat template failed to render", HFTokenizer(str(path)).apply_chat_template,
                 messages)
  (path / "chat_template.jinja").write_text("{% set ns = namespace() %}{% set ns._x = 1 %}")
  one_line_error(r"chat_template.jinja: the chat template failed to render .*underscore",
                 HFTokenizer(str(path)).apply_chat_template, messages)
  # raise_exception: Mistral's template has no system role
  mistral = HFTokenizer(os.path.join(ASSETS, "mistral"))
  message = one_line_error(r"tokenizer_config.json: chat_template\[0\] \(default\): the chat template failed to render "
                           r"\(Conversation roles must alternate", mistral.apply_chat_template,
                           [{"role": "system", "content": "s"}, *messages])
  assert "mistral" in message


def test_load_tokenizer_dispatch(tmp_path):
  for name in FAMILIES:
    assert isinstance(load_tokenizer(os.path.join(ASSETS, name)), HFTokenizer)
  tok = load_tokenizer(os.path.join(ASSETS, "qwen2", "tokenizer.json"))
  assert isinstance(tok, HFTokenizer) and tok.eos_id == 2
  spm = tokenizer_lib.train(["hello world, the quick brown fox\n"] * 50, 300)
  (tmp_path / "spm.model").write_bytes(spm.model_proto)
  for path in (tmp_path, tmp_path / "spm.model"):
    loaded = load_tokenizer(str(path))
    assert isinstance(loaded, Tokenizer) and loaded.model_proto == spm.model_proto
  (tmp_path / "empty").mkdir()
  one_line_error(r"empty: no tokenizer \(tokenizer.json or spm.model\)", load_tokenizer, str(tmp_path / "empty"))
  one_line_error(r"nothing: no such file or directory", load_tokenizer, str(tmp_path / "nothing"))
  (tmp_path / "bad.model").write_bytes(b"not a model")
  one_line_error(r"bad.model: not a SentencePiece model", load_tokenizer, str(tmp_path / "bad.model"))


EXTRA_TEXTS = [
    "Mixed: naïve café, Ελληνικά, русский, العربية, हिन्दी, 日本語 ｶﾀｶﾅ, 한국어",
    "tabs\tand\u00a0nbsp\u2009thin\u200bzero-width\r\nCRLF\x00nul",
    "<|im_start|>user<|im_end|><s></s><|begin_of_text|><|eot_id|> <tool_call></tool_call><think>",
    "    indented\n        more\n\n\n   \t  \n",
    "'s 're n't I'm you'll don't 12345678901234567890 1,000.50",
    "🧑‍🤝‍🧑 family 👨‍👩‍👧‍👦 skin 👋🏿 keycap 1️⃣",
]


@pytest.mark.slow
def test_live_against_transformers(tmp_path):
  """Extra strings, chats and edited files against AutoTokenizer (needs transformers)."""
  transformers = pytest.importorskip("transformers")
  edited = copy_family(tmp_path)
  edit_json(edited / "tokenizer_config.json", eos_token="<|new_eos|>", pad_token=None)
  paths = [os.path.join(ASSETS, name) for name in FAMILIES] + [str(edited)]
  chat = [{"role": "user", "content": EXTRA_TEXTS[0]}, {"role": "assistant", "content": EXTRA_TEXTS[3]},
          {"role": "user", "content": EXTRA_TEXTS[2]}]
  for path in paths:
    ref, tok = transformers.AutoTokenizer.from_pretrained(path), HFTokenizer(path)
    assert (tok.vocab_size, tok.eos_id, tok.bos_id) == (len(ref), ref.eos_token_id, ref.bos_token_id), path
    for text in EXTRA_TEXTS + [ref.eos_token * 2]:
      ids = ref.encode(text, add_special_tokens=True)
      assert tok.encode(text) == ref.encode(text, add_special_tokens=False), (path, text)
      assert tok.encode(text, add_special_tokens=True) == ids, (path, text)
      assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), (path, text)
      assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids), (path, text)
    if "mistral" in path:
      continue
    for generation_prompt in (False, True):
      kwargs = dict(add_generation_prompt=generation_prompt, date_string="1 Jan 2025")
      rendered = ref.apply_chat_template(chat, tokenize=False, **kwargs)
      assert tok.apply_chat_template(chat, **kwargs) == rendered, path
      assert tok.encode_chat(chat, **kwargs) == ref.apply_chat_template(chat, return_dict=False, **kwargs), path
