"""The `data` config section of language-model runs (pretraining, SFT): `LMDataConfig`."""

from __future__ import annotations

import dataclasses
import os

from jaxpt.config import Section, at_least, fail, in_range


@dataclasses.dataclass(frozen=True)
class LMDataConfig(Section):
  """Where the text comes from and how it is batched (the `data` section of LM runs).

  Attributes:
    seq_len: tokens per packed row.
    batch_size: global rows per step.
    path: a text file or folder ('' = the embedded default corpus, the Python standard library's sources).
    tfds_name: read a prepared TFDS dataset instead of `path` (e.g. 'lm1b'); '' = off.
    tfds_text_key: the TFDS dataset's text feature (e.g. 'text').
    tfds_data_dir: where the TFDS dataset is ('' = TFDS's default).
    eval_batches: held-out batches per eval (0 = no eval).
    eval_fraction: share of the local corpus's documents held out.
    max_corpus_bytes: cap on the text read.
  """

  seq_len: int
  batch_size: int
  path: str = ""
  tfds_name: str = ""
  tfds_text_key: str = "text"
  tfds_data_dir: str = ""
  eval_batches: int = 4
  eval_fraction: float = 0.05
  max_corpus_bytes: int = 4_000_000

  def check(self) -> None:
    if self.seq_len <= 1:
      raise fail(self, "seq_len", "must be > 1")
    at_least(self, "batch_size", 1)
    at_least(self, "eval_batches", 0)
    in_range(self, "eval_fraction", 0.0, 1.0, low_open=True, high_open=True)
    at_least(self, "max_corpus_bytes", 1)
    if self.tfds_name and not self.tfds_text_key:
      raise fail(self, "tfds_text_key", "must name the text feature when data.tfds_name is set")
    if self.path and not self.tfds_name and not os.path.exists(os.path.expanduser(self.path)):
      raise fail(self, "path", "no such file or directory")
