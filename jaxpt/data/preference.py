"""Preference pairs: the record type, a strict jsonl reader (hh-rlhf dialogues included) and a TFDS builder.

A jsonl line is an object with string fields `chosen` and `rejected` and an optional string `prompt`. Without
`prompt`, an hh-rlhf dialogue ("\\n\\nHuman: ...\\n\\nAssistant: ...") is split by `split_hh_dialogue`; texts with
no "\\n\\nAssistant:" marker at all are a prompt-less pair (prompt ''). Malformed lines raise
ValueError("path:LINE: ..."); pairs with an empty or whitespace-only response, and pairs whose two responses are
identical, are skipped, listed in the `ReadReport` and logged.

The TFDS builder `JaxptPreferences` writes a local preference file (or a folder holding `train*.jsonl[.gz]` and
`test*.jsonl[.gz]`) as array_record without TensorFlow, like `jaxpt.data.tfds_text`. A single file is split into
train/test by a hash of each pair's prompt (`is_test_pair`), so every pair of one prompt lands on the same side.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from jaxpt.config import ConfigError, DataError
from jaxpt.data import corpus
from jaxpt.data.tfds_text import as_text, prepare_quietly, read_examples

ASSISTANT = "\n\nAssistant:"
TRAIN, TEST = "train", "test"
_SUFFIXES = (".jsonl", ".jsonl.gz")
_SHOWN_LINES = 20  # at most this many line numbers per warning


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  """One comparison: `prompt` + `chosen` is preferred over `prompt` + `rejected` (responses exclude the prompt).

  `meta` carries per-pair facts: "source"/"line" (where it was read), "chosen_longer" (synthetic task),
  "sycophancy" (0/1) and "sycophancy_side" (set by `jaxpt.data.bias.inject_sycophancy`).
  """

  prompt: str
  chosen: str
  rejected: str
  meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ReadReport:
  """What `read_preference_jsonl` read: non-blank `rows`, `kept` pairs, and the 1-based line numbers it skipped."""

  rows: int = 0
  kept: int = 0
  empty: list[int] = dataclasses.field(default_factory=list)
  identical: list[int] = dataclasses.field(default_factory=list)


def split_hh_dialogue(chosen_full: str, rejected_full: str) -> tuple[str, str, str]:
  """(prompt, chosen_response, rejected_response) of two hh-rlhf dialogues that share their history.

  The prompt is the longest common prefix of the two texts cut after its last "\\n\\nAssistant:"; the responses
  are the remaining tails, so prompt + response == the full text. Raises ValueError when the shared prefix holds
  no "\\n\\nAssistant:".
  """
  shared = os.path.commonprefix([chosen_full, rejected_full])
  cut = shared.rfind(ASSISTANT)
  if cut < 0:
    raise ValueError(f"chosen and rejected share no {ASSISTANT!r} turn (shared prefix {shared[:60]!r})")
  cut += len(ASSISTANT)
  return chosen_full[:cut], chosen_full[cut:], rejected_full[cut:]


def _numbered_lines(path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, text) of a plain or gzipped UTF-8 file; ValueError("path:LINE: ...") on bad UTF-8."""
  with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
    for number, raw in enumerate(f, start=1):
      try:
        yield number, raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{number}: not UTF-8: {e}") from e


def _string_field(row: dict, name: str, where: str, required: bool) -> str | None:
  if name not in row:
    if required:
      raise DataError(f"{where}: missing field {name!r} (fields: {sorted(row)})")
    return None
  value = row[name]
  if not isinstance(value, str):
    raise DataError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
  return value


def _parse_line(line: str, where: str) -> tuple[str, str, str]:
  """(prompt, chosen response, rejected response) of one jsonl line; ValueError(where: ...) if malformed."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise DataError(f"{where}: invalid JSON: {e}") from e
  if not isinstance(row, dict):
    raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
  chosen = _string_field(row, "chosen", where, required=True)
  rejected = _string_field(row, "rejected", where, required=True)
  prompt = _string_field(row, "prompt", where, required=False)
  if prompt is not None:
    return prompt, chosen, rejected
  if ASSISTANT not in chosen and ASSISTANT not in rejected:
    return "", chosen, rejected
  try:
    return split_hh_dialogue(chosen, rejected)
  except ValueError as e:
    raise DataError(f"{where}: {e}") from e


def _warn_skipped(path: str, kind: str, lines: list[int]) -> None:
  if lines:
    shown = ", ".join(map(str, lines[:_SHOWN_LINES])) + (", ..." if len(lines) > _SHOWN_LINES else "")
    logging.warning("%s: skipped %d pairs with %s responses (lines %s)", path, len(lines), kind, shown)


def read_preference_jsonl(path: str) -> tuple[list[PreferencePair], ReadReport]:
  """The pairs of a .jsonl or .jsonl.gz file in file order, and what was skipped; meta = {"source", "line"}."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such preference file")
  pairs, report = [], ReadReport()
  source = os.path.basename(path)
  for number, line in _numbered_lines(path):
    if not line.strip():
      continue
    report.rows += 1
    prompt, chosen, rejected = _parse_line(line, f"{path}:{number}")
    if not chosen.strip() or not rejected.strip():
      report.empty.append(number)
    elif chosen == rejected:
      report.identical.append(number)
    else:
      pairs.append(PreferencePair(prompt, chosen, rejected, {"source": source, "line": number}))
  report.kept = len(pairs)
  _warn_skipped(path, "empty", report.empty)
  _warn_skipped(path, "identical", report.identical)
  return pairs, report


def is_test_pair(pair: PreferencePair, test_fraction: float) -> bool:
  """Whether `pair` is held out: a stable hash of its prompt (of its responses when the prompt is '') < fraction."""
  key = pair.prompt if pair.prompt else f"{pair.chosen}\x00{pair.rejected}"
  return corpus.is_eval_document(key, test_fraction)


def split_files(path: str) -> dict[str, str] | None:
  """{'train': file, 'test': file} of a folder holding train*.jsonl[.gz] and test*.jsonl[.gz]; None for a file."""
  if not os.path.isdir(path):
    return None
  found = {}
  for split in (TRAIN, TEST):
    names = sorted(n for n in os.listdir(path) if n.startswith(split) and n.endswith(_SUFFIXES))
    if len(names) != 1:
      raise ConfigError("config.data.source", f"folder {path!r} must hold exactly one {split}*.jsonl[.gz] file, "
                        f"found {names}")
    found[split] = os.path.join(path, names[0])
  return found


def _read_some_pairs(path: str) -> list[PreferencePair]:
  """read_preference_jsonl's pairs; DataError naming `path` when it holds none (empty, or every pair skipped)."""
  pairs, report = read_preference_jsonl(path)
  if not pairs:
    why = ("the file is empty" if not report.rows else f"all {report.rows} rows skipped: {len(report.empty)} with an "
           f"empty response, {len(report.identical)} with identical responses")
    raise DataError(f"{path}: holds no preference pairs ({why})")
  return pairs


def read_splits(path: str, test_fraction: float) -> dict[str, list[PreferencePair]]:
  """{'train', 'test'} -> pairs of a preference file (hash split by `is_test_pair`) or of a train/test folder.

  Raises DataError naming the file when a file holds no pairs, ConfigError(test_fraction) when a single file's
  pairs all land on one side."""
  files = split_files(path)
  if files is not None:
    return {split: _read_some_pairs(file) for split, file in files.items()}
  if not 0.0 < test_fraction < 1.0:
    raise ConfigError("config.data.test_fraction", "must be in (0, 1)", test_fraction)
  pairs = _read_some_pairs(path)
  held_out = [is_test_pair(p, test_fraction) for p in pairs]
  train = [p for p, t in zip(pairs, held_out) if not t]
  test = [p for p, t in zip(pairs, held_out) if t]
  if not train or not test:
    raise ConfigError("config.data.test_fraction", f"leaves {len(train)} train and {len(test)} test pairs of the "
                      f"{len(pairs)} in {path}", test_fraction)
  return {TRAIN: train, TEST: test}


@dataclasses.dataclass(eq=False)
class PreferenceConfig(tfds.core.BuilderConfig):
  """A local preference file or train/test folder, and the held-out fraction used when it is a single file."""

  source_path: str = ""
  test_fraction: float = 0.1


def preference_config(source_path: str, test_fraction: float) -> PreferenceConfig:
  """The config for a source, named by a fingerprint of its files and split, so a changed source is rebuilt."""
  if not source_path or not os.path.exists(source_path):
    raise ConfigError("config.data.source", f"{source_path!r} does not exist")
  key = f"{corpus.fingerprint(source_path, 0)}|{test_fraction!r}"
  name = "src_" + hashlib.sha256(key.encode()).hexdigest()[:16]
  return PreferenceConfig(name=name, description=f"preference pairs of {source_path}",
                          source_path=os.path.abspath(source_path), test_fraction=test_fraction)


class JaxptPreferences(tfds.core.GeneratorBasedBuilder):
  """Preference pairs of a local jsonl file, as array_record.

  Features: prompt, chosen, rejected (Text; responses exclude the prompt), line (int32, the source line), source
  (Text, the source file's name). Splits: 'train', 'test'.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Local preference jsonl as array_record."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)  # see jaxpt.data.tfds_text.JaxptLocalText.code_path

  def __init__(self, *, source_path: str = "", test_fraction: float = 0.1, data_dir: str | None = None, **kwargs):
    kwargs.setdefault("config", preference_config(source_path, test_fraction))
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self, description="Preference pairs (prompt, chosen response, rejected response).",
        features=tfds.features.FeaturesDict({
            "prompt": text, "chosen": text, "rejected": text, "source": text,
            "line": tfds.features.Scalar(dtype=np.int32)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    config = self.builder_config
    splits = read_splits(config.source_path, config.test_fraction)
    return {split: self._generate_examples(pairs) for split, pairs in splits.items()}

  def _generate_examples(self, pairs: Sequence[PreferencePair]) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, pair in enumerate(pairs):
      yield i, {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected,
                "source": pair.meta["source"], "line": pair.meta["line"]}


def prepare_preferences(path: str, data_dir: str, test_fraction: float = 0.1) -> JaxptPreferences:
  """The builder of a preference source under `data_dir`, prepared (built once; reused while it is unchanged)."""
  return prepare_quietly(JaxptPreferences, data_dir, source_path=path, test_fraction=test_fraction)


def load_preferences(builder: JaxptPreferences, split: str) -> list[PreferencePair]:
  """The pairs of a prepared builder's `split`, in source order (by file, then line), as `PreferencePair`s."""
  sources = builder.as_data_source()
  if split not in sources:
    raise ValueError(f"split {split!r} is not one of {sorted(sources)}")
  source = sources[split]
  pairs = [PreferencePair(as_text(e["prompt"]), as_text(e["chosen"]), as_text(e["rejected"]),
                          {"source": as_text(e["source"]), "line": int(e["line"])}) for e in read_examples(source)]
  return sorted(pairs, key=lambda p: (p.meta["source"], p.meta["line"]))
