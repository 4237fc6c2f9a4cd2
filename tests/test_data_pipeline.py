"""LMData: config validation, resumable deterministic order, process slices, fixed held-out batches, caching."""

import itertools
import os

import ml_collections
import numpy as np
import pytest

from jaxpt.data import corpus, pipeline

VOCAB = 512
# ../shared beside the repository, as on every developer machine and in CI.
SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                           "tinyshakespeare")
_WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have "
          "an they you were her she there been one all we their has would when if so no will more out up into "
          "what about who them then some these two may could its only other new any time").split()


def data_config(**overrides):
  values = dict(path="", tfds_name="", tfds_text_key="text", tfds_data_dir="", seq_len=32, batch_size=8,
                eval_batches=2, eval_fraction=0.1, max_corpus_bytes=200_000)
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def write_paragraphs(path, n, seed=0):
  rng = np.random.default_rng(seed)
  paragraphs = [f"Para {i}: " + " ".join(rng.choice(_WORDS, size=rng.integers(3, 60))) + "."
                for i in range(n)]
  path.write_text("\n\n".join(paragraphs) + "\n")
  return paragraphs


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "paragraphs.txt"
  write_paragraphs(path, 1500)
  return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("workdir"))


@pytest.fixture(scope="module")
def data(corpus_file, workdir):
  return pipeline.LMData.create(data_config(path=str(corpus_file)), VOCAB, workdir, seed=7)


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_batch_format(data):
  batch = next(data.train_batches())
  assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
      "inputs": (np.int32, (8, 32)), "targets": (np.int32, (8, 32)), "positions": (np.int32, (8, 32)),
      "segment_ids": (np.int32, (8, 32)), "weights": (np.float32, (8, 32))}
  assert 0 <= batch["inputs"].min() and batch["inputs"].max() < data.tokenizer.vocab_size <= VOCAB
  assert (batch["inputs"] == data.tokenizer.eos_id).any()
  text = data.tokenizer.decode(batch["inputs"][0])
  assert any(w in text.split() for w in _WORDS)


def test_train_rows_are_the_rows_train_batches_draw(data):
  tokens, segments = data.train_rows()
  assert tokens.shape == segments.shape == (data.num_train_rows, 32) and tokens.dtype == np.int32
  rows = {tuple(row) for row in tokens.tolist()}
  for step in range(3):
    assert all(tuple(row) in rows for row in data.train_batch(step)["inputs"].tolist())


def test_resume_from_step_k_matches_uninterrupted_run_across_epochs(data):
  steps_per_epoch = data.num_train_rows // 8
  assert steps_per_epoch > 10
  total = steps_per_epoch + 6  # crosses into the second epoch
  uninterrupted = list(itertools.islice(data.train_batches(), total))
  for k in (0, 3, steps_per_epoch - 2):
    resumed = list(itertools.islice(data.train_batches(start_step=k), total - k))
    for a, b in zip(resumed, uninterrupted[k:]):
      _assert_batches_equal(a, b)
  # A restarted process (new LMData from the same workdir and seed) resumes identically.
  restarted = pipeline.LMData.create(data.config, VOCAB, data.workdir, seed=7)
  _assert_batches_equal(next(restarted.train_batches(start_step=5)), uninterrupted[5])
  # The first epoch visits every packed row once; the second epoch is in another order.
  first_epoch = np.concatenate([b["inputs"] for b in uninterrupted[:steps_per_epoch]])
  assert len({row.tobytes() for row in first_epoch}) == len(first_epoch)
  epoch_rows = [np.concatenate([data.train_batch(e * steps_per_epoch + s)["inputs"] for s in range(3)])
                for e in (0, 1, 2)]
  assert not np.array_equal(epoch_rows[0], epoch_rows[1])
  assert not np.array_equal(epoch_rows[1], epoch_rows[2])


def test_different_seeds_differ_same_seed_agrees(data):
  other = pipeline.LMData.create(data.config, VOCAB, data.workdir, seed=8)
  same = pipeline.LMData.create(data.config, VOCAB, data.workdir, seed=7)
  assert not np.array_equal(next(other.train_batches())["inputs"], next(data.train_batches())["inputs"])
  _assert_batches_equal(next(same.train_batches(start_step=2)), next(data.train_batches(start_step=2)))


@pytest.mark.parametrize("process_count", [2, 4, 8])
def test_process_slices_partition_the_global_batch(data, process_count):
  for step in (0, 1, 50):
    whole = data.train_batch(step)
    parts = [next(data.train_batches(step, p, process_count)) for p in range(process_count)]
    assert all(part["inputs"].shape == (8 // process_count, 32) for part in parts)
    for key in whole:
      np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), whole[key])
  evals = [data.eval_batches(p, process_count) for p in range(process_count)]
  for i, whole in enumerate(data.eval_batches()):
    np.testing.assert_array_equal(np.concatenate([e[i]["inputs"] for e in evals]), whole["inputs"])


def test_process_count_must_divide_batch(data):
  with pytest.raises(ValueError, match="data.batch_size=8: must be divisible by process_count=3"):
    next(data.train_batches(process_index=0, process_count=3))
  with pytest.raises(ValueError, match="process_index"):
    next(data.train_batches(process_index=2, process_count=2))


def _segments(batch, tokenizer):
  """(text, is_whole_document) of every segment of every row.

  A segment is surely a whole document when it ends with EOS and is not the row's first segment (which may be
  the continuation of a document cut at the previous row's end).
  """
  out = []
  for tokens, segments in zip(batch["inputs"], batch["segment_ids"]):
    for s in np.unique(segments[segments > 0]):
      ids = tokens[segments == s]
      whole = s > 1 and ids[-1] == tokenizer.eos_id
      out.append((tokenizer.decode(ids), whole))
  return out


def test_eval_batches_fixed_and_from_held_out_documents_only(data, corpus_file):
  batches = data.eval_batches()
  assert len(batches) == 2 and all(b["inputs"].shape == (8, 32) for b in batches)
  for a, b in zip(batches, data.eval_batches()):
    _assert_batches_equal(a, b)
  train_docs, eval_docs = corpus.split_documents(corpus.path_documents(str(corpus_file)), 0.1)
  assert not set(train_docs) & set(eval_docs)
  eval_text = "".join(eval_docs)
  segments = _segments(batches[0], data.tokenizer) + _segments(batches[1], data.tokenizer)
  assert any(whole for _, whole in segments)
  for text, whole in segments:
    assert text in eval_text
    if whole:
      assert text in eval_docs and text not in train_docs
  # No training batch of the first epoch holds a whole held-out document.
  eval_set = set(eval_docs)
  for step in range(data.num_train_rows // 8):
    for text, whole in _segments(data.train_batch(step), data.tokenizer):
      assert not (whole and text in eval_set)


def test_cache_invalidated_when_source_or_seq_len_changes(tmp_path):
  source = tmp_path / "small.txt"
  write_paragraphs(source, 200, seed=1)
  workdir = str(tmp_path / "work")
  config = data_config(path=str(source), eval_batches=1)
  first = pipeline.LMData.create(config, 384, workdir, seed=0)
  model_file = os.path.join(workdir, "tokenizer", "spm.model")
  mtime = os.path.getmtime(model_file)
  reused = pipeline.LMData.create(config, 384, workdir, seed=0)
  assert os.path.getmtime(model_file) == mtime
  _assert_batches_equal(next(reused.train_batches()), next(first.train_batches()))
  assert len(os.listdir(os.path.join(workdir, "data"))) == 1
  longer = pipeline.LMData.create(data_config(path=str(source), eval_batches=1, seq_len=64), 384, workdir, 0)
  assert longer.train_batch(0)["inputs"].shape == (8, 64)
  assert len(os.listdir(os.path.join(workdir, "data"))) == 2
  write_paragraphs(source, 400, seed=2)
  changed = pipeline.LMData.create(config, 384, workdir, seed=0)
  assert os.path.getmtime(model_file) != mtime
  assert changed.num_train_rows > first.num_train_rows
  assert len(os.listdir(os.path.join(workdir, "data"))) == 3


def test_embedded_default_corpus(tmp_path):
  data = pipeline.LMData.create(data_config(path="", max_corpus_bytes=150_000, seq_len=64), VOCAB,
                                str(tmp_path), seed=0)
  text = data.tokenizer.decode(data.train_batch(0)["inputs"].reshape(-1))
  assert any(word in text for word in ("def ", "import ", "return", "self"))
  assert data.num_train_rows * 64 < 150_000  # at least ~1 byte per token, so the cap was applied


@pytest.mark.parametrize("field, value", [
    ("seq_len", 0), ("seq_len", "64"), ("batch_size", 0), ("eval_batches", -1), ("eval_fraction", 0.0),
    ("eval_fraction", 1.5), ("max_corpus_bytes", 0), ("path", 3), ("tfds_text_key", "")])
def test_config_errors_name_the_field(tmp_path, field, value):
  config = data_config(**{field: value, **({"tfds_name": "lm1b"} if field == "tfds_text_key" else {})})
  with pytest.raises(ValueError, match=f"data.{field}"):
    pipeline.LMData.create(config, VOCAB, str(tmp_path), seed=0)
  assert not os.listdir(tmp_path)  # validated before any work


def test_missing_field_and_bad_path_name_the_field(tmp_path):
  config = data_config()
  del config["seq_len"]
  with pytest.raises(ValueError, match="data.seq_len: missing"):
    pipeline.LMData.create(config, VOCAB, str(tmp_path), seed=0)
  with pytest.raises(ValueError, match=f"data.path='{tmp_path / 'absent.txt'}': no such file or directory"):
    pipeline.LMData.create(data_config(path=str(tmp_path / "absent.txt")), VOCAB, str(tmp_path), seed=0)


def test_eval_split_too_small_names_eval_batches(data, corpus_file):
  with pytest.raises(ValueError, match="data.eval_batches=10000"):
    pipeline.LMData.create(data_config(path=str(corpus_file), eval_batches=10000), VOCAB, data.workdir, seed=7)


@pytest.mark.skipif(not os.path.exists(SHAKESPEARE), reason=f"{SHAKESPEARE} is absent on this machine")
def test_tinyshakespeare(tmp_path):
  data = pipeline.LMData.create(data_config(path=SHAKESPEARE, seq_len=128, eval_fraction=0.05), 1024,
                                str(tmp_path), seed=0)  # the folder, as `--config.data.path=` takes it
  docs = corpus.path_documents(os.path.join(SHAKESPEARE, "input.txt"))
  assert len(docs) > 5000 and docs[0].startswith("First Citizen:")
  assert data.tokenizer.vocab_size == 1024
  tokens = data.tokenizer.encode(docs[0])
  assert len(tokens) < len(docs[0]) / 2.5
  assert data.tokenizer.decode(tokens) == docs[0]
  batch = data.train_batch(0)
  assert batch["weights"].mean() > 0.9  # dense packing: few padding or cut targets
  text = data.tokenizer.decode(batch["inputs"].reshape(-1))
  assert ":\n" in text  # speaker turns
  assert data.num_eval_rows >= 2 * 8
