"""Language-model data: config -> TFDS source -> SentencePiece tokenizer -> packed rows -> deterministic batches.

The local corpus (`data.path`, '' = embedded stdlib corpus) goes through the `JaxptLocalText` TFDS builder
(array_record under `WORKDIR/tfds`); `data.tfds_name` reads a prepared registered dataset instead. Both are read
through random-access data sources, tokenized once, packed (see `jaxpt.data.packing`) and cached as `.npy` under
`WORKDIR/data/packed_<key>`, where the key covers the source, the tokenizer model and `seq_len`.

Order: the global stream of training rows is epoch after epoch, each epoch a permutation of all packed rows drawn
from (seed, epoch). Step k takes rows [k * B, (k + 1) * B) of that stream, so a batch depends only on (seed, k)
and a run resumed at step k sees the batches an uninterrupted run would have. Process p of P takes rows
[p * B / P, (p + 1) * B / P) of each global batch and reads only those.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any, Iterator

import numpy as np

from jaxpt import oserrors
from jaxpt.config import ConfigError, from_section
from jaxpt.data.config import LMDataConfig
from jaxpt.data import order, packing
from jaxpt.data import tfds_text
from jaxpt.data import tokenizer as tokenizer_lib

PACKING_VERSION = 1
_ARRAYS = ("train_tokens", "train_segments", "eval_tokens", "eval_segments")


def _open_sources(config: LMDataConfig, workdir: str) -> tuple[dict[str, Any], str, int | None]:
  """({'train', 'validation'} -> TFDS data source, identity of the source, byte cap for reading or None)."""
  if config.tfds_name:
    sources, identity = tfds_text.named_sources(config.tfds_name, config.tfds_data_dir)
    return sources, f"tfds|{identity}|{config.tfds_text_key}|{config.max_corpus_bytes}", config.max_corpus_bytes
  builder = tfds_text.prepare_local(config.path, config.max_corpus_bytes, config.eval_fraction,
                                    os.path.join(workdir, "tfds"))
  return tfds_text.local_sources(builder), f"local|{builder.builder_config.name}", None


def local_corpus_id(config: LMDataConfig) -> str | None:
  """The `corpus_id` LMData.create gives a local corpus (`data.path` or the embedded one), computed without
  preparing anything (a digest of the text's content); None for a TFDS dataset by name."""
  if config.tfds_name:
    return None
  return f"local|{tfds_text.local_text_config(config.path, config.max_corpus_bytes, config.eval_fraction).name}"


def _pack_texts(texts: list[str], tokenizer: tokenizer_lib.Tokenizer, seq_len: int) -> tuple[np.ndarray, ...]:
  if not texts:
    return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
  return packing.pack(tokenizer.encode_batch(texts), seq_len, tokenizer.eos_id)


def _save_npy(path: str, array: np.ndarray) -> None:
  """np.save through Python's file object: a short write raises OSError with its errno (ENOSPC, EDQUOT, EFBIG),
  where np.save's C write says only '180736 requested and 142304 written'."""
  with open(path, "wb") as f:
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(np.ascontiguousarray(array).data)


def _load_or_pack(cache_dir: str, read_splits, tokenizer, seq_len: int) -> dict[str, np.ndarray]:
  """The packed arrays, memory-mapped from `cache_dir` if present, else packed from `read_splits()` and saved."""
  if not all(os.path.exists(os.path.join(cache_dir, f"{name}.npy")) for name in _ARRAYS):
    train_texts, eval_texts = read_splits()
    arrays = dict(zip(_ARRAYS, _pack_texts(train_texts, tokenizer, seq_len) +
                      _pack_texts(eval_texts, tokenizer, seq_len)))
    tmp = f"{cache_dir}.tmp{os.getpid()}"
    with oserrors.writing(cache_dir, temporary=tmp):  # a full disk: one line naming cache_dir, no partial arrays
      os.makedirs(tmp, exist_ok=True)
      for name, array in arrays.items():
        _save_npy(os.path.join(tmp, f"{name}.npy"), array)
    try:
      os.rename(tmp, cache_dir)
    except OSError:  # another process finished first: its arrays are identical
      for name in _ARRAYS:
        os.remove(os.path.join(tmp, f"{name}.npy"))
      os.rmdir(tmp)
  return {name: np.load(os.path.join(cache_dir, f"{name}.npy"), mmap_mode="r") for name in _ARRAYS}


class LMData:
  """Packed training rows and held-out rows of one corpus, with its tokenizer. Build with `LMData.create`."""

  def __init__(self, config: LMDataConfig, tokenizer: tokenizer_lib.Tokenizer, seed: int,
               arrays: dict[str, np.ndarray], workdir: str, corpus_id: str = ""):
    self.config = config
    self.corpus_id = corpus_id  # names the training text's content (a run record's `inputs`)
    self.workdir = workdir
    self.tokenizer = tokenizer
    self.seed = seed
    self._arrays = arrays
    self._order = order.StepOrder(seed, arrays["train_tokens"].shape[0], config.batch_size)

  @classmethod
  def create(cls, data_config: LMDataConfig | Any, vocab_size: int, workdir: str, seed: int,
             keep_tokenizer: bool = False, tokenizer: Any = None) -> "LMData":
    """Prepares (or reuses from `workdir`) the TFDS source, tokenizer and packing of `data_config` (an LMDataConfig,
    or a `data` section, checked here). `vocab_size` is the model's; the tokenizer has at most that many ids.
    keep_tokenizer: the run resumes, so the workdir's tokenizer is kept as it is (see `tokenizer.load_or_train`).
    tokenizer: use this one (e.g. the `init_from` run's) instead of training one on the corpus.
    Raises ConfigError naming the field.
    """
    config = from_section(LMDataConfig, data_config, "config.data")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    os.makedirs(workdir, exist_ok=True)
    sources, identity, max_bytes = _open_sources(config, workdir)
    text_key = config.tfds_text_key if config.tfds_name else "text"

    def read(split):
      return tfds_text.read_texts(sources[split], text_key, max_bytes)

    training_texts = functools.cache(lambda: read(tfds_text.TRAIN))  # read only if tokenizer or packing need it
    if tokenizer is None:
      tokenizer = tokenizer_lib.load_or_train(os.path.join(workdir, "tokenizer"), vocab_size, identity,
                                              training_texts, keep_existing=keep_tokenizer)
    key = hashlib.sha256(f"{identity}|{hashlib.sha256(tokenizer.model_proto).hexdigest()}|"
                         f"{config.seq_len}|{PACKING_VERSION}".encode()).hexdigest()[:20]
    arrays = _load_or_pack(os.path.join(workdir, "data", f"packed_{key}"),
                           lambda: (training_texts(), read(tfds_text.VALIDATION)), tokenizer, config.seq_len)
    data = cls(config, tokenizer, int(seed), arrays, workdir, corpus_id=identity)
    if data.num_train_rows == 0:
      raise ConfigError("config.data.tfds_name", "has an empty 'train' split", config.tfds_name)
    needed = config.eval_batches * config.batch_size
    if data.num_eval_rows < needed:
      raise ConfigError(
          "config.data.eval_batches", f"needs {needed} held-out rows of data.seq_len={config.seq_len} "
          f"(data.batch_size={config.batch_size}), but the held-out split (data.eval_fraction="
          f"{config.eval_fraction}) packs into {data.num_eval_rows}", config.eval_batches)
    return data

  @property
  def num_train_rows(self) -> int:
    return self._arrays["train_tokens"].shape[0]

  @property
  def num_eval_rows(self) -> int:
    return self._arrays["eval_tokens"].shape[0]

  def train_batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict[str, np.ndarray]:
    """This process's rows of the global batch of `step` (a function of seed and step only); [B / P, seq_len]."""
    rows = self._order.rows(step, process_index, process_count)
    return packing.make_batch(self._arrays["train_tokens"][rows], self._arrays["train_segments"][rows])

  def train_batches(self, start_step: int = 0, process_index: int = 0,
                    process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches for steps start_step, start_step + 1, ... (see `train_batch`)."""
    return order.step_batches(self.train_batch, self.config.batch_size, start_step, process_index, process_count)

  def train_rows(self) -> tuple[np.ndarray, np.ndarray]:
    """All packed training rows (tokens, segment_ids), int32 [rows, seq_len] each; `train_batch` draws from them."""
    return self._arrays["train_tokens"], self._arrays["train_segments"]

  def held_out_rows(self) -> tuple[np.ndarray, np.ndarray]:
    """All packed held-out rows (tokens, segment_ids), int32 [rows, seq_len] each, in corpus order; `eval_batches`
    reads the first data.eval_batches * data.batch_size of them."""
    return self._arrays["eval_tokens"], self._arrays["eval_segments"]

  def eval_batches(self, process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """The fixed held-out batches: `data.eval_batches` batches of consecutive held-out rows, always the same."""
    begin, end = order.process_slice(self.config.batch_size, process_index, process_count)
    batch = self.config.batch_size
    tokens, segments = self._arrays["eval_tokens"], self._arrays["eval_segments"]
    return [packing.make_batch(tokens[i * batch + begin:i * batch + end], segments[i * batch + begin:i * batch + end])
            for i in range(self.config.eval_batches)]

