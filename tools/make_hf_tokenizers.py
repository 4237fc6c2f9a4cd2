"""The tokenizer part of the Hugging Face fixtures (run through tools/make_hf_fixtures.py; needs transformers).

Per family, a tiny BPE of at most 256 ids (the fixture models' vocab_size) trained with `tokenizers` on TRAIN_TEXT,
with the family's real pipeline and a chat template in its style, saved by `PreTrainedTokenizerFast.save_pretrained`:
    llama    Llama-3: tiktoken-style regex split + byte-level BPE, `<|begin_of_text|>` prepended by the post-processor,
             no pad token, clean_up_tokenization_spaces=True (as the hub's Llama-3 config), a Llama-3.1-style
             template (date_string / strftime_now, tools as JSON) in chat_template.jinja
    mistral  Llama-2 / Mistral v0.1: `▁` metaspace BPE with byte fallback (only the bytes 0x80-0xFF and \\t \\n \\r:
             256 ids do not hold all 256 bytes, so other missing characters become <unk>), <unk>/<s>/</s>, the
             [INST] template as a list of named templates (default, tool_use) in tokenizer_config.json
    qwen2    Qwen2.5: NFC + regex split + byte-level BPE, ChatML specials, <tool_call> as a non-special added token,
             Qwen2.5's template (tools, system default) as a string in tokenizer_config.json (the hub's form)
    qwen3    as qwen2 plus <think> / </think>; the template adds reasoning_content; chat_template.jinja
Byte-level vocabularies hold only the bytes of TRAIN_TEXT: other bytes (most of an emoji's) are dropped by the BPE
(no unk), which the reference exercises too (partial UTF-8 sequences decode to U+FFFD). No `limit_alphabet`: its
cut breaks frequency ties in hash order, so training would not be deterministic (it is now: reruns write the same
bytes).

tokenizer_reference.json holds AutoTokenizer.from_pretrained(dir)'s outputs: encode with and without special tokens,
decode (skipping special tokens and not), the rendered chats and their ids (`apply_chat_template(tokenize=True)`).
"""

from __future__ import annotations

import json
import os
import shutil

import tokenizers
import transformers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers

VOCAB_SIZE = 256
TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A language model predicts the next token from the ones before it.
We train the model on a corpus of text, then we fine-tune it to follow instructions and to answer questions.
The assistant answers the user's question: it's short, and it doesn't make things up. You are a helpful assistant.
Hello world! How are you today? I am fine, thank you. What is the weather like in Berlin and in Shanghai?
Grüße aus München: Äpfel, Öl, Übermut und Straße. Schöne Grüße, bis bald! Das Wetter ist heute schön.
你好，世界！今天天气很好。我们学习机器学习和语言模型。
def add(a, b):
\treturn a + b


def main():
    for i in range(10):
        if i % 2 == 0:
            print(f"even {i}")
    return {"name": "value", "items": [1, 2, 3]}


class Model:
    def __init__(self, config):
        self.config = config
"""
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN25_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided \
with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Qwen3's addition: an assistant turn's reasoning_content inside <think> ... </think>.
QWEN3_TEMPLATE = QWEN25_TEMPLATE.replace(
    """(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}""",
    """(message.role == "assistant" and not message.tool_calls) %}
        {%- if message.role == "assistant" and message.reasoning_content is defined %}
            {{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' \
+ message.content.lstrip('\\n') + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
        {%- endif %}""")
assert QWEN3_TEMPLATE != QWEN25_TEMPLATE

LLAMA31_TEMPLATE = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions. To call a function, respond with JSON.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + \
'<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MISTRAL_TOOL_TEMPLATE = ("{{ bos_token }}[AVAILABLE_TOOLS] {{ tools | tojson }} [/AVAILABLE_TOOLS]"
                         + MISTRAL_TEMPLATE.removeprefix("{{ bos_token }}"))

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FAMILIES = {  # family -> tokenizer settings
    "llama": dict(kind="byte_level", pattern=LLAMA3_PATTERN, nfc=False,
                  specials=["<|end_of_text|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                            "<|end_header_id|>"],
                  added=[], bos_template="<|begin_of_text|>",
                  tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
                  config=dict(clean_up_tokenization_spaces=True, model_max_length=131072),
                  template=LLAMA31_TEMPLATE, jinja=True),
    "mistral": dict(kind="metaspace", specials=["<unk>", "<s>", "</s>"],
                    tokens=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
                    config=dict(clean_up_tokenization_spaces=False, model_max_length=32768),
                    template={"default": MISTRAL_TEMPLATE, "tool_use": MISTRAL_TOOL_TEMPLATE}, jinja=False),
    "qwen2": dict(kind="byte_level", pattern=QWEN_PATTERN, nfc=True, specials=QWEN_SPECIALS,
                  added=["<tool_call>", "</tool_call>"], bos_template=None,
                  tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
                  config=dict(clean_up_tokenization_spaces=False, model_max_length=131072, errors="replace"),
                  template=QWEN25_TEMPLATE, jinja=False),
    "qwen3": dict(kind="byte_level", pattern=QWEN_PATTERN, nfc=True, specials=QWEN_SPECIALS,
                  added=["<tool_call>", "</tool_call>", "<think>", "</think>"], bos_template=None,
                  tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
                  config=dict(clean_up_tokenization_spaces=False, model_max_length=40960, errors="replace"),
                  template=QWEN3_TEMPLATE, jinja=True),
}

TEXTS = [
    "Hello world! The model answers the user's question, doesn't it?",
    "Grüße aus München: Äpfel, Öl, Übermut und Straße. ÄÖÜ äöü ß",
    "你好，世界！今天天气很好。",
    "emoji 😀👍🏽 and flags 🇩🇪 — done",
    "def add(a, b):\n\treturn a + b\n\n\nclass Model:\n    def __init__(self):\n        pass  # comment\n",
    "  leading and trailing spaces  \n\n\r\n",
    "",
    " .,;:!? 0123456789 3.14159e-10 ",
]
SYSTEM_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Grüße! Was ist 你好 auf Deutsch? 😀"},
    {"role": "assistant", "content": "def add(a, b):\n\treturn a + b\n"},
    {"role": "user", "content": "Thank you, how are you today?"},
]
PLAIN_CHAT = SYSTEM_CHAT[1:]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "Die Stadt, z. B. München"}}}}}]
TOOL_CHAT = [
    {"role": "user", "content": "What is the weather in München?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "München"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"°C\"}"},
]
REASONING_CHAT = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "reasoning_content": "\nTwo plus two is four.\n", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]
CHATS = {  # family -> [(messages, apply_chat_template kwargs)]
    "llama": [(SYSTEM_CHAT, dict(add_generation_prompt=True, date_string="26 Jul 2024")),
              (PLAIN_CHAT, dict(add_generation_prompt=False, date_string="26 Jul 2024")),
              (TOOL_CHAT, dict(add_generation_prompt=True, date_string="26 Jul 2024", tools=TOOLS))],
    "mistral": [(PLAIN_CHAT[:2], dict(add_generation_prompt=True)),
                (PLAIN_CHAT, dict(add_generation_prompt=False)),
                (PLAIN_CHAT, dict(add_generation_prompt=True, tools=TOOLS))],
    "qwen2": [(SYSTEM_CHAT, dict(add_generation_prompt=True)), (PLAIN_CHAT, dict(add_generation_prompt=False)),
              (TOOL_CHAT, dict(add_generation_prompt=True, tools=TOOLS))],
    "qwen3": [(SYSTEM_CHAT, dict(add_generation_prompt=True)), (REASONING_CHAT, dict(add_generation_prompt=True)),
              (TOOL_CHAT, dict(add_generation_prompt=True, tools=TOOLS))],
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "additional_chat_templates", "tokenizer_reference.json")


def byte_level(settings: dict) -> tokenizers.Tokenizer:
  """Llama-3 / Qwen2 pipeline: (NFC,) regex split, byte-level BPE without unk; specials get the first ids."""
  tok = tokenizers.Tokenizer(models.BPE())
  if settings["nfc"]:
    tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(settings["pattern"]), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
  trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(settings["added"]), show_progress=False,
                                special_tokens=[AddedToken(t, special=True, normalized=False)
                                                for t in settings["specials"]])
  tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer)
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in settings["added"]])
  post = [processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]
  if settings["bos_template"]:
    bos = settings["bos_template"]
    post.append(processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                              special_tokens=[(bos, tok.token_to_id(bos))]))
  tok.post_processor = processors.Sequence(post)
  return tok


def metaspace(settings: dict) -> tokenizers.Tokenizer:
  """Llama-2 / Mistral v0.1 pipeline: `▁` for spaces, BPE with byte fallback, <s> prepended; ids <unk>, <s>, </s>,
  the byte pieces, then the learned pieces."""
  learner = tokenizers.Tokenizer(models.BPE())
  learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
  byte_pieces = [f"<0x{b:02X}>" for b in (0x09, 0x0A, 0x0D, *range(0x80, 0x100))]
  fixed = settings["specials"] + byte_pieces
  learner.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainers.BpeTrainer(
      vocab_size=VOCAB_SIZE - len(fixed), show_progress=False))
  learned = learner.get_vocab()
  vocab = {piece: i for i, piece in enumerate(fixed)}
  for piece, _ in sorted(learned.items(), key=lambda item: item[1]):
    vocab[piece] = len(vocab)
  merges = json.loads(learner.to_str())["model"]["merges"]
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges], unk_token="<unk>",
                                        byte_fallback=True, fuse_unk=True))
  tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
  tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in settings["specials"]])
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1",
                                                     special_tokens=[("<s>", 1)])
  return tok


def reference(directory: str, family: str) -> dict:
  """AutoTokenizer's view of `directory`, as tests/test_data_hf_tokenizer.py compares it."""
  tok = transformers.AutoTokenizer.from_pretrained(directory)
  texts = TEXTS + [f"before {tok.eos_token} after{tok.eos_token}"]
  out = dict(transformers=transformers.__version__, tokenizers=tokenizers.__version__,
             tokenizer_class=type(tok).__name__, len=len(tok), bos_token_id=tok.bos_token_id,
             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, unk_token_id=tok.unk_token_id,
             special_tokens_map=tok.special_tokens_map, texts=[], chats=[])
  for text in texts:
    ids = tok.encode(text, add_special_tokens=False)
    ids_special = tok.encode(text)
    out["texts"].append(dict(
        text=text, ids=ids, ids_special=ids_special, decoded=tok.decode(ids_special, skip_special_tokens=True),
        decoded_special=tok.decode(ids_special, skip_special_tokens=False)))
  for messages, kwargs in CHATS[family]:
    rendered = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), type(ids)
    assert ids == tok.encode(rendered, add_special_tokens=False)
    out["chats"].append(dict(messages=messages, kwargs=kwargs, rendered=rendered, ids=ids,
                             decoded=tok.decode(ids, skip_special_tokens=True)))
  return out


def make_tokenizer(family: str, directory: str) -> dict:
  """Writes the tokenizer files of `family` into `directory` (see the module doc); returns a summary."""
  settings = FAMILIES[family]
  for name in TOKENIZER_FILES:
    path = os.path.join(directory, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)
  backend = byte_level(settings) if settings["kind"] == "byte_level" else metaspace(settings)
  assert backend.get_vocab_size(with_added_tokens=True) <= VOCAB_SIZE, backend.get_vocab_size()
  tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=settings["template"],
                                             **settings["tokens"], **settings["config"])
  tok.save_pretrained(directory, save_jinja_files=settings["jinja"])
  ref = reference(directory, family)
  assert ref["len"] <= VOCAB_SIZE, ref["len"]
  with open(os.path.join(directory, "tokenizer_reference.json"), "w", encoding="utf-8") as f:
    f.write(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
  return {"tokenizer_class": ref["tokenizer_class"], "len": ref["len"]}
