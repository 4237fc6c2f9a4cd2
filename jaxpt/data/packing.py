"""Packing of tokenized documents into fixed-length rows, and the batch dict the model and trainer consume.

Documents, each followed by EOS, are concatenated in order and cut into rows of `seq_len` tokens; only the last
row is padded (id 0). A document that crosses a row boundary continues at the start of the next row as a new
segment whose positions restart at 0 (so positions are always < seq_len); the one target across the cut is lost.

Batch (numpy), B rows of L = seq_len:
  inputs      int32   [B, L]  token ids (0 at padding)
  targets     int32   [B, L]  inputs shifted left by one; last column 0
  positions   int32   [B, L]  index within the segment, 0 at each segment start and at padding
  segment_ids int32   [B, L]  1, 2, 3, ... per segment within the row; 0 at padding
  weights     float32 [B, L]  1.0 where targets[t] = inputs[t + 1] is the next token of the same segment, else 0
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxpt.config import ConfigError


def pack(documents: Sequence[Sequence[int]], seq_len: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Packs `documents` (each followed by `eos_id`) into rows.

  Returns (tokens int32 [rows, seq_len], segment_ids int32 [rows, seq_len]); rows = ceil(total / seq_len).
  """
  if seq_len <= 0:
    raise ConfigError("config.data.seq_len", "must be > 0", seq_len)
  lengths = np.fromiter((len(d) + 1 for d in documents), dtype=np.int64, count=len(documents))
  total = int(lengths.sum())
  rows = -(-total // seq_len)
  tokens = np.zeros(rows * seq_len, np.int32)
  doc_ids = np.full(rows * seq_len, -1, np.int64)
  ends = np.cumsum(lengths)
  for i, doc in enumerate(documents):
    start = ends[i] - lengths[i]
    tokens[start:ends[i] - 1] = doc
    tokens[ends[i] - 1] = eos_id
  doc_ids[:total] = np.repeat(np.arange(len(documents)), lengths)
  tokens = tokens.reshape(rows, seq_len)
  doc_ids = doc_ids.reshape(rows, seq_len)
  new_segment = np.ones_like(doc_ids, dtype=bool)
  new_segment[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
  segment_ids = np.where(doc_ids >= 0, np.cumsum(new_segment, axis=1), 0).astype(np.int32)
  return tokens, segment_ids


def make_batch(tokens: np.ndarray, segment_ids: np.ndarray) -> dict[str, np.ndarray]:
  """The batch dict (see module docstring) of packed rows `tokens`, `segment_ids` int32 [B, L]."""
  tokens = np.asarray(tokens, np.int32)
  segment_ids = np.asarray(segment_ids, np.int32)
  length = tokens.shape[1]
  index = np.arange(length, dtype=np.int32)
  starts = np.ones(segment_ids.shape, dtype=bool)
  starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
  segment_start = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
  positions = np.where(segment_ids > 0, index - segment_start, 0).astype(np.int32)
  targets = np.zeros_like(tokens)
  targets[:, :-1] = tokens[:, 1:]
  weights = np.zeros(tokens.shape, np.float32)
  weights[:, :-1] = (segment_ids[:, :-1] > 0) & (segment_ids[:, :-1] == segment_ids[:, 1:])
  return {"inputs": tokens, "targets": targets, "positions": positions, "segment_ids": segment_ids,
          "weights": weights}
