"""Packing of token documents into rows and the batch dict derived from them."""

import numpy as np
from hypothesis import given, settings, strategies as st

from jaxpt.data import packing

EOS = 1


def test_pack_handcrafted_exact_fields():
  docs = [[10, 11, 12], [20], [30, 31, 32, 33, 34, 35, 36]]
  tokens, segments = packing.pack(docs, seq_len=6, eos_id=EOS)
  # stream: 10 11 12 E 20 E | 30 31 32 33 34 35 | 36 E pad pad pad pad
  np.testing.assert_array_equal(tokens, [[10, 11, 12, 1, 20, 1],
                                         [30, 31, 32, 33, 34, 35],
                                         [36, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(segments, [[1, 1, 1, 1, 2, 2],
                                           [1, 1, 1, 1, 1, 1],
                                           [1, 1, 0, 0, 0, 0]])
  batch = packing.make_batch(tokens, segments)
  assert {k: v.dtype for k, v in batch.items()} == {
      "inputs": np.int32, "targets": np.int32, "positions": np.int32, "segment_ids": np.int32,
      "weights": np.float32}
  assert all(v.shape == (3, 6) for v in batch.values())
  np.testing.assert_array_equal(batch["inputs"], tokens)
  np.testing.assert_array_equal(batch["targets"], [[11, 12, 1, 20, 1, 0],
                                                   [31, 32, 33, 34, 35, 0],
                                                   [1, 0, 0, 0, 0, 0]])
  # The continuation of doc 3 in row 3 restarts its positions at 0.
  np.testing.assert_array_equal(batch["positions"], [[0, 1, 2, 3, 0, 1],
                                                     [0, 1, 2, 3, 4, 5],
                                                     [0, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch["segment_ids"], segments)
  np.testing.assert_array_equal(batch["weights"], [[1, 1, 1, 0, 1, 0],
                                                   [1, 1, 1, 1, 1, 0],
                                                   [1, 0, 0, 0, 0, 0]])


def test_pack_exact_fit_has_no_padding_row():
  tokens, segments = packing.pack([[5, 6, 7], [8, 9, 10]], seq_len=4, eos_id=EOS)
  np.testing.assert_array_equal(tokens, [[5, 6, 7, 1], [8, 9, 10, 1]])
  np.testing.assert_array_equal(segments, [[1, 1, 1, 1], [1, 1, 1, 1]])


def test_empty_document_is_just_eos():
  tokens, segments = packing.pack([[4], [], [5]], seq_len=8, eos_id=EOS)
  np.testing.assert_array_equal(tokens, [[4, 1, 1, 5, 1, 0, 0, 0]])
  np.testing.assert_array_equal(segments, [[1, 1, 2, 3, 3, 0, 0, 0]])
  np.testing.assert_array_equal(packing.make_batch(tokens, segments)["weights"], [[1, 0, 0, 1, 0, 0, 0, 0]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(4, 500), max_size=40), min_size=1, max_size=25), st.integers(2, 17))
def test_pack_loses_and_duplicates_no_token(docs, seq_len):
  tokens, segments = packing.pack(docs, seq_len, EOS)
  expected = [t for d in docs for t in d + [EOS]]
  assert tokens.shape == segments.shape == (-(-len(expected) // seq_len), seq_len)
  assert tokens[segments > 0].tolist() == expected  # row-major order = the document stream
  assert not tokens[segments == 0].any()
  batch = packing.make_batch(tokens, segments)
  weights, targets, positions = batch["weights"], batch["targets"], batch["positions"]
  assert not weights[segments == 0].any() and not weights[:, -1].any()
  same_next = np.zeros_like(weights, dtype=bool)
  same_next[:, :-1] = (segments[:, :-1] == segments[:, 1:]) & (segments[:, :-1] > 0)
  np.testing.assert_array_equal(weights, same_next.astype(np.float32))
  np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])
  # Weighted targets are exactly the next token inside each document: one fewer than its tokens, per piece.
  pieces = sum(len(np.unique(row[row > 0])) for row in segments)
  assert weights.sum() == len(expected) - pieces
  for row_pos, row_seg in zip(positions, segments):
    for s in np.unique(row_seg[row_seg > 0]):
      np.testing.assert_array_equal(row_pos[row_seg == s], np.arange((row_seg == s).sum()))
