"""Reading corpora (embedded stdlib, folders, paragraph files) and the deterministic train/validation split."""

import os

import pytest

from jaxpt.data import corpus


def test_embedded_corpus_is_capped_sorted_stdlib_without_tests():
  docs = corpus.embedded_documents(300_000)
  size = sum(len(d.encode("utf-8")) for d in docs)
  assert 250_000 < size <= 300_000
  assert docs == corpus.embedded_documents(300_000)
  files = corpus._stdlib_files()
  for folder in {os.path.dirname(f) for f in files}:
    names = [os.path.basename(f) for f in files if os.path.dirname(f) == folder]
    assert names == sorted(names)
  assert all(f.endswith(".py") for f in files)
  parts = {p for f in files for p in os.path.relpath(f, corpus.stdlib_dir()).split(os.sep)[:-1]}
  assert not parts & {"site-packages", "test", "tests", "__pycache__"}
  # The first documents are whole files, in walk order.
  with open(files[0], encoding="utf-8") as f:
    assert docs[0] == f.read()
  assert corpus.embedded_documents(1_000_000)[: len(docs) - 1] == docs[:-1]


def test_embedded_corpus_bad_cap_names_field():
  with pytest.raises(ValueError, match="data.max_corpus_bytes"):
    corpus.embedded_documents(0)


def test_folder_reads_text_files_recursively_sorted_and_skips_binary(tmp_path):
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "z.txt").write_text("zeta\n\nstill one document")
  (tmp_path / "a.md").write_text("alpha ü")
  (tmp_path / "c.bin").write_bytes(b"\x00\x01\x02binary")
  (tmp_path / "d.txt").write_bytes("latin1 \xe9".encode("latin-1"))
  (tmp_path / "e.txt").write_text("   \n")
  (tmp_path / ".hidden").write_text("hidden")
  assert corpus.path_documents(str(tmp_path)) == ["alpha ü", "zeta\n\nstill one document"]


def test_skipped_binary_files_are_counted_and_named_in_one_warning(tmp_path, caplog):
  """Binary / non-UTF-8 files of a data folder are skipped with one warning line (they were skipped silently)."""
  (tmp_path / "text.txt").write_text("kept")
  for i in range(7):
    (tmp_path / f"blob{i}.bin").write_bytes(b"\x00\x01" if i % 2 else b"caf\xe9")
  with caplog.at_level("WARNING"):
    assert corpus.path_documents(str(tmp_path)) == ["kept"]
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == [f"{tmp_path}: skipped 7 files that are not UTF-8 text (binary or another encoding): "
                      "blob0.bin, blob1.bin, blob2.bin, blob3.bin, blob4.bin, ..."]
  caplog.clear()
  with caplog.at_level("WARNING"):
    corpus.path_documents(str(tmp_path / "text.txt"))
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.txt").write_text("a")
    corpus.path_documents(str(tmp_path / "only"))
  assert not caplog.records  # nothing skipped, nothing said


def test_single_file_splits_on_blank_lines(tmp_path):
  path = tmp_path / "t.txt"
  path.write_text("\nFirst:\nline two\n\n\nSecond para\n  \t\nThird\n")
  assert corpus.path_documents(str(path)) == ["First:\nline two", "Second para", "Third"]


@pytest.mark.parametrize("kind", ["missing", "empty_file", "empty_dir"])
def test_bad_path_names_field_and_path(tmp_path, kind):
  path = tmp_path / "nothing"
  if kind == "empty_file":
    path.write_text("\n\n")
  elif kind == "empty_dir":
    path.mkdir()
  with pytest.raises(ValueError, match=f"data.path: '{path}'"):
    corpus.read_documents(str(path), 1000)


def test_split_is_stable_content_based_and_near_fraction():
  docs = [f"document number {i}\n" * (i % 7 + 1) for i in range(4000)]
  train, held_out = corpus.split_documents(docs, 0.1)
  assert len(train) + len(held_out) == len(docs)
  assert 300 < len(held_out) < 500
  assert not set(train) & set(held_out)
  # Same answer when documents are reordered or others are added: membership depends on content only.
  train2, held_out2 = corpus.split_documents(docs[::-1] + ["new doc"], 0.1)
  assert set(held_out2) - {"new doc"} == set(held_out)
  assert corpus.split_documents(docs, 0.1) == (train, held_out)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5])
def test_split_bad_fraction_names_field(fraction):
  with pytest.raises(ValueError, match="data.eval_fraction"):
    corpus.split_documents(["a", "b"], fraction)


def test_fingerprint_changes_with_source(tmp_path):
  path = tmp_path / "c.txt"
  path.write_text("one\n\ntwo")
  before = corpus.fingerprint(str(path), 100)
  assert before == corpus.fingerprint(str(path), 100)
  path.write_text("one\n\ntwo\n\nthree")
  assert corpus.fingerprint(str(path), 100) != before
  assert corpus.fingerprint("", 100) != corpus.fingerprint("", 200)


def test_folder_with_one_file_is_split_over_paragraphs(tmp_path):
  """A folder holding a single big file (like tinyshakespeare/) still gets a held-out split."""
  paragraphs = [f"Speaker {i}:\nline {i} of the play.\n" for i in range(400)]
  (tmp_path / "input.txt").write_text("\n".join(paragraphs))
  docs = corpus.path_documents(str(tmp_path))
  assert len(docs) == 1
  train, held_out = corpus.split_documents(docs, 0.05)
  assert held_out and train
  assert len(train) + len(held_out) == 400
  assert "\n\n".join(train + held_out).count("Speaker") == 400


def test_split_that_holds_nothing_out_names_the_field():
  with pytest.raises(ValueError, match="data.eval_fraction=0.01: holds out none"):
    corpus.split_documents(["just one paragraph"], 0.01)
