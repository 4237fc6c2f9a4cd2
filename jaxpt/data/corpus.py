"""Text corpora as lists of documents (str), and their deterministic train/validation split.

Two sources:
- the embedded default corpus: the Python standard library's own `.py` files, present on every machine;
- a user path (`data.path`): a folder (every decodable text file under it is one document) or a single file
  (split on blank lines into paragraph documents).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig
from typing import Sequence

from absl import logging

from jaxpt.config import ConfigError

# Folder names never read from the standard library (third-party code and test suites).
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_SHOWN_FILES = 5  # skipped files named in the warning


def stdlib_dir() -> str:
  """The folder holding the running interpreter's standard library sources."""
  return sysconfig.get_paths()["stdlib"]


def _stdlib_files() -> list[str]:
  """Sorted `.py` files of the standard library, without site-packages and test folders."""
  root = stdlib_dir()
  files = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP_DIRS and not d.startswith("."))
    for name in sorted(names):
      if name.endswith(".py") and not name.startswith("test_"):
        files.append(os.path.join(folder, name))
  return files


def _read_text(path: str) -> str | None:
  """The file's text, or None when it is binary (NUL bytes) or not UTF-8."""
  with open(path, "rb") as f:
    raw = f.read()
  if b"\x00" in raw:
    return None
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    return None


def embedded_documents(max_bytes: int) -> list[str]:
  """Standard-library source files in sorted order, one document each, capped at `max_bytes` UTF-8 bytes.

  The file that crosses the cap is cut at a line boundary, so the corpus is a deterministic prefix.
  """
  if max_bytes <= 0:
    raise ConfigError("config.data.max_corpus_bytes", "must be > 0", max_bytes)
  docs, total = [], 0
  for path in _stdlib_files():
    text = _read_text(path)
    if not text or not text.strip():
      continue
    size = len(text.encode("utf-8"))
    if total + size > max_bytes:
      head = text.encode("utf-8")[: max_bytes - total].decode("utf-8", errors="ignore")
      head = head[: head.rfind("\n") + 1]
      if head.strip():
        docs.append(head)
      break
    docs.append(text)
    total += size
  if not docs:
    raise ConfigError("config.data.max_corpus_bytes", f"keeps no document of the standard library {stdlib_dir()}",
                      max_bytes)
  return docs


def _folder_files(root: str) -> list[str]:
  """Every file under `root`, recursively, sorted by relative path; hidden files and folders are skipped."""
  files = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    files.extend(os.path.join(folder, n) for n in sorted(names) if not n.startswith("."))
  return files


def split_paragraphs(text: str) -> list[str]:
  """Blank-line separated paragraphs of `text`, stripped of surrounding newlines, empty ones dropped."""
  parts = (p.strip("\n") for p in _PARAGRAPH_BREAK.split(text))
  return [p for p in parts if p.strip()]


def path_documents(path: str) -> list[str]:
  """Documents of a user path: a folder gives one per text file, a single file one per paragraph.

  Files of a folder that are not UTF-8 text (NUL bytes or invalid UTF-8) are skipped with one warning naming how
  many and the first few."""
  if not path or not os.path.exists(path):
    raise ConfigError("config.data.path", f"{path!r} does not exist")
  if os.path.isdir(path):
    docs, skipped = [], []
    for file in _folder_files(path):
      text = _read_text(file)
      if text is None:
        skipped.append(os.path.relpath(file, path))
      elif text.strip():
        docs.append(text)
    if skipped:
      shown = ", ".join(skipped[:_SHOWN_FILES]) + (", ..." if len(skipped) > _SHOWN_FILES else "")
      logging.warning("%s: skipped %d files that are not UTF-8 text (binary or another encoding): %s", path,
                      len(skipped), shown)
  else:
    text = _read_text(path)
    if text is None:
      raise ConfigError("config.data.path", f"{path!r} is not a UTF-8 text file")
    docs = split_paragraphs(text)
  if not docs:
    raise ConfigError("config.data.path", f"{path!r} holds no non-empty text document")
  return docs


def read_documents(path: str, max_bytes: int) -> list[str]:
  """Documents of `data.path`, or of the embedded corpus (capped at `max_bytes`) when `path` is ''."""
  return path_documents(path) if path else embedded_documents(max_bytes)


def fingerprint(path: str, max_bytes: int) -> str:
  """A hex digest of the corpus `read_documents(path, max_bytes)` reads: the content (bytes and relative names)
  of every file under a user path; for the embedded corpus, the standard library's folder and Python version."""
  h = hashlib.sha256()
  if not path:
    h.update(f"stdlib|{stdlib_dir()}|{sys.version}|{max_bytes}".encode())
    return h.hexdigest()
  if not os.path.exists(path):
    raise ConfigError("config.data.path", f"{path!r} does not exist")
  path = os.path.abspath(path)
  files = _folder_files(path) if os.path.isdir(path) else [path]
  h.update(b"content")
  for file in files:
    h.update(f"|{os.path.relpath(file, path)}|{os.path.getsize(file)}|".encode())
    with open(file, "rb") as f:
      while chunk := f.read(1 << 24):
        h.update(chunk)
  return h.hexdigest()


def is_eval_document(doc: str, eval_fraction: float) -> bool:
  """Whether `doc` is held out: a stable hash of its content, mapped to [0, 1), falls below `eval_fraction`.

  Content-based, so identical documents always land in the same split and the split never changes between runs
  or when other documents are added.
  """
  digest = hashlib.blake2b(doc.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "big") / 2.0**64 < eval_fraction


def _split_by_hash(docs: Sequence[str], eval_fraction: float) -> tuple[list[str], list[str]]:
  train, held_out = [], []
  for doc in docs:
    (held_out if is_eval_document(doc, eval_fraction) else train).append(doc)
  return train, held_out


def split_documents(docs: Sequence[str], eval_fraction: float) -> tuple[list[str], list[str]]:
  """(train, validation) documents, order preserved; validation holds about `eval_fraction` of them.

  When the documents are too few for whole ones to land on both sides (e.g. a folder with one big file), the
  split is made over their blank-line paragraphs instead.
  """
  if not 0.0 < eval_fraction < 1.0:
    raise ConfigError("config.data.eval_fraction", "must be in (0, 1)", eval_fraction)
  train, held_out = _split_by_hash(docs, eval_fraction)
  if not train or not held_out:
    paragraphs = [p for doc in docs for p in split_paragraphs(doc)]
    train, held_out = _split_by_hash(paragraphs, eval_fraction)
    docs = paragraphs
  if not train:
    raise ConfigError("config.data.eval_fraction", f"leaves no training document (of {len(docs)})", eval_fraction)
  if not held_out:
    raise ConfigError("config.data.eval_fraction", f"holds out none of the corpus's {len(docs)} documents or "
                      "paragraphs: raise it, or give data.path more text", eval_fraction)
  return train, held_out
