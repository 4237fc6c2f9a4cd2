"""SentencePiece tokenizer, trained on the training corpus at first use and cached in the workdir.

Ids: pad=0, eos=1, bos=2, unk=3. Byte fallback and identity normalisation make `decode(encode(s)) == s` for any
string. A run's tokenizer is `<dir>/spm.model` with the settings it was trained with in `<dir>/spm.json`; every
tokenizer trained there is also kept under `<dir>/cache/`, named by a digest of its settings (which include a
digest of the corpus's content), and never overwritten. A resumed run keeps its `spm.model` as it is.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np
import sentencepiece as spm

from jaxpt import oserrors
from jaxpt.config import ConfigError, DataError

if TYPE_CHECKING:
  from jaxpt.data.hf_tokenizer import HFTokenizer

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_FILE = "spm.model"  # a run's tokenizer in its `tokenizer/` folder
_CHUNK_CHARS = 2048  # training "sentences" are line-aligned chunks of documents of at most this many characters
_MAX_SENTENCES = 4000  # at most this many chunks (~8 MB) are trained on: a few seconds

# Trainer options other than the vocabulary size; part of the cache key.
TRAINER_OPTIONS = dict(
    model_type="bpe",
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    bos_id=BOS_ID,
    unk_id=UNK_ID,
    byte_fallback=True,
    hard_vocab_limit=False,  # a small corpus may not support the full vocabulary: use fewer pieces, not fail
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,
    split_digits=True,
    character_coverage=0.9995,
    input_sentence_size=0,  # we sample (deterministically) ourselves, see _MAX_SENTENCES
    shuffle_input_sentence=False,
    max_sentence_length=4 * _CHUNK_CHARS,
    seed_sentencepiece_size=200_000,
)


class Tokenizer:
  """Text <-> int ids with a trained SentencePiece model."""

  def __init__(self, model_proto: bytes):
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto

  @classmethod
  def load(cls, model_file: str) -> "Tokenizer":
    with open(model_file, "rb") as f:
      return cls(f.read())

  @property
  def vocab_size(self) -> int:
    """Number of pieces; every id is in [0, vocab_size). At most the size asked for at training."""
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return self._sp.pad_id()

  @property
  def configured_pad_id(self) -> int:
    """pad_id: jaxpt's tokenizers always have a pad token (the HFTokenizer interface)."""
    return self.pad_id

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids generation stops at: EOS (the HFTokenizer interface, whose checkpoints may add end-of-turn ids)."""
    return (self.eos_id,)

  @property
  def bos_id(self) -> int:
    return self._sp.bos_id()

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without bos/eos."""
    return self._sp.encode(text)

  def encode_batch(self, texts: list[str], num_threads: int = 2) -> list[list[int]]:
    """Ids of each text, without bos/eos."""
    return self._sp.encode(texts, num_threads=num_threads)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; pad/eos/bos ids decode to nothing."""
    return self._sp.decode([int(i) for i in ids])


def load_tokenizer(path: str) -> "Tokenizer | HFTokenizer":
  """The tokenizer at `path`: a Hugging Face checkpoint directory (tokenizer.json: `HFTokenizer`) or a directory with
  a SentencePiece spm.model (jaxpt's `Tokenizer`), or either file itself. DataError when there is neither."""
  from jaxpt.data.hf_tokenizer import TOKENIZER_FILE, HFTokenizer  # imports `tokenizers` only when needed

  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, TOKENIZER_FILE)):
      return HFTokenizer(path)
    if os.path.isfile(os.path.join(path, MODEL_FILE)):
      return Tokenizer.load(os.path.join(path, MODEL_FILE))
    raise DataError(f"{path}: no tokenizer ({TOKENIZER_FILE} or {MODEL_FILE})")
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file or directory")
  if os.path.basename(path) == TOKENIZER_FILE:
    return HFTokenizer.load(path)
  try:
    return Tokenizer.load(path)
  except RuntimeError as e:  # sentencepiece's parse error
    raise DataError(f"{path}: not a SentencePiece model ({str(e).splitlines()[0]})") from None


PROMPT_FORMATS = ("plain", "chat")


def chat_prompt(tokenizer: "Tokenizer | HFTokenizer", text: str, field: str) -> str:
  """`text` as one user turn in the tokenizer's chat template, with the generation prompt (the assistant's turn
  opened). ConfigError naming `field` (the config's prompt_format) for a tokenizer without chat templates."""
  if not hasattr(tokenizer, "apply_chat_template"):
    raise ConfigError(field, "needs a Hugging Face tokenizer with a chat template (config.init_from='hf:DIR')", "chat")
  return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def encode_prompts_as_trained(tokenizer: "Tokenizer | HFTokenizer", texts: list[str], chat: bool) -> list[list[int]]:
  """Ids of prompt `texts` as the tokenizer's own library gives them, the one rule trainers and generation share:
  an HF tokenizer adds its post-processor's special tokens (Llama's BOS) to plain text, as `tokenizer(text)` does
  in transformers, and nothing to chat-template renderings (`chat`), which write their own; jaxpt's sentencepiece
  tokenizer adds none."""
  from jaxpt.data.hf_tokenizer import HFTokenizer

  if isinstance(tokenizer, HFTokenizer):
    return tokenizer.encode_batch(texts, add_special_tokens=not chat)
  return tokenizer.encode_batch(texts)


def tokenizer_files(directory: str) -> list[str]:
  """The tokenizer files in `directory` (spm.model, or tokenizer.json and its companions), as paths."""
  from jaxpt.data.hf_tokenizer import CHAT_TEMPLATE_DIR, TOKENIZER_FILES

  names = [MODEL_FILE, *TOKENIZER_FILES]
  files = [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]
  templates = os.path.join(directory, CHAT_TEMPLATE_DIR)
  if os.path.isdir(templates):
    files += [os.path.join(templates, n) for n in sorted(os.listdir(templates)) if n.endswith(".jinja")]
  return files


def has_tokenizer(directory: str) -> bool:
  """Whether `directory` holds a tokenizer: spm.model or tokenizer.json (a generation_config.json or
  tokenizer_config.json alone, as `save_pretrained` writes beside a model, is not one)."""
  from jaxpt.data.hf_tokenizer import TOKENIZER_FILE

  return any(os.path.isfile(os.path.join(directory, n)) for n in (MODEL_FILE, TOKENIZER_FILE))


def copy_tokenizer(source: str, directory: str) -> None:
  """Copies the tokenizer files of directory `source` into `directory` (each written atomically, relative paths
  kept), so a run keeps its own copy of the tokenizer it started from. DataError when `source` has none."""
  from jaxpt.data.hf_tokenizer import TOKENIZER_FILES

  if not has_tokenizer(source):
    raise DataError(f"{source}: no tokenizer ({TOKENIZER_FILES[0]} or {MODEL_FILE})")
  for file in tokenizer_files(source):
    target = os.path.join(directory, os.path.relpath(file, source))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    oserrors.write_atomically(target, pathlib.Path(file).read_bytes())


def save_tokenizer(tokenizer: "Tokenizer | HFTokenizer", directory: str) -> None:
  """Writes `tokenizer` into `directory` (spm.model, or a copy of the HF tokenizer's files) unless `directory`
  already holds a tokenizer."""
  if has_tokenizer(directory):
    return
  if isinstance(tokenizer, Tokenizer):
    os.makedirs(directory, exist_ok=True)
    oserrors.write_atomically(os.path.join(directory, MODEL_FILE), tokenizer.model_proto)
  else:
    copy_tokenizer(tokenizer.path, directory)


def _training_sentences(documents: Iterable[str]) -> Iterator[str]:
  """Line-aligned chunks of at most ~_CHUNK_CHARS characters (newlines kept, so they become pieces)."""
  for doc in documents:
    chunk = []
    size = 0
    for line in doc.splitlines(keepends=True):
      if size + len(line) > _CHUNK_CHARS and chunk:
        yield "".join(chunk)
        chunk, size = [], 0
      chunk.append(line[: 2 * _CHUNK_CHARS])
      size += len(chunk[-1])
    if chunk:
      yield "".join(chunk)


def _sample(sentences: list[str], limit: int) -> list[str]:
  """At most `limit` of `sentences`, chosen by a fixed-seed draw (same on every run and host), order kept."""
  if len(sentences) <= limit:
    return sentences
  keep = np.sort(np.random.default_rng(0).choice(len(sentences), size=limit, replace=False))
  return [sentences[i] for i in keep]


def train(documents: Iterable[str], vocab_size: int, num_threads: int = 2) -> Tokenizer:
  """A tokenizer of at most `vocab_size` pieces trained (in memory) on `documents`; deterministic."""
  model = io.BytesIO()
  sentences = _sample(list(_training_sentences(documents)), _MAX_SENTENCES)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
        num_threads=num_threads, minloglevel=2, **TRAINER_OPTIONS)
  except RuntimeError as e:
    raise ConfigError("config.model.vocab_size", f"SentencePiece training failed "
                      f"(byte fallback needs 260 ids plus the corpus's characters): {e}", vocab_size) from e
  return Tokenizer(model.getvalue())


def load_or_train(directory: str, vocab_size: int, corpus_id: str, documents: Callable[[], Iterable[str]],
                  keep_existing: bool = False) -> Tokenizer:
  """The run's tokenizer, `directory/spm.model` (its settings in `spm.json`).

  keep_existing: the run resumes from a checkpoint, whose embedding rows are this tokenizer's ids: an existing
    `spm.model` is used as it is, whatever the settings now say (never retrained or overwritten).
  Otherwise the tokenizer of these settings (vocab_size, trainer options, `corpus_id`: a digest of the training
  corpus's content) is taken from the content-addressed cache `directory/cache/<settings digest>.model`, trained
  into it at first use (never overwritten), and made the run's `spm.model`. `documents()` is only called to train.
  """
  settings = {"vocab_size": vocab_size, "corpus_id": corpus_id, "sentencepiece": spm.__version__,
              **TRAINER_OPTIONS}
  model_file = os.path.join(directory, MODEL_FILE)
  settings_file = os.path.join(directory, "spm.json")
  if keep_existing and os.path.exists(model_file):
    return Tokenizer.load(model_file)
  encoded_settings = json.dumps(settings, indent=1, sort_keys=True).encode()
  cached = os.path.join(directory, "cache", hashlib.sha256(encoded_settings).hexdigest()[:16])
  if os.path.exists(f"{cached}.model"):
    tokenizer = Tokenizer.load(f"{cached}.model")
  else:
    tokenizer = train(documents(), vocab_size)
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    oserrors.write_atomically(f"{cached}.json", encoded_settings)
    oserrors.write_atomically(f"{cached}.model", tokenizer.model_proto)
  if not (os.path.exists(model_file) and pathlib.Path(model_file).read_bytes() == tokenizer.model_proto):
    oserrors.write_atomically(settings_file, encoded_settings)
    oserrors.write_atomically(model_file, tokenizer.model_proto)
  return tokenizer
