"""GSM8K from local jsonl files as a TFDS dataset (array_record, no TensorFlow), and its problems read back.

The source folder holds `train.jsonl` and `test.jsonl`, one `{"question": ..., "answer": "...#### N"}` per line.
Features: question, answer (the full reasoning text), final (the number after `####`,
`jaxpt.data.math_prompts.parse_gsm8k_answer`). Nothing is downloaded; the folder is only read. See
`jaxpt.data.tfds_text` for how tfds 4.9.10 builds array_record without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Iterator

import tensorflow_datasets as tfds
from etils import epath

from jaxpt.config import DataError
from jaxpt.data import tfds_text
from jaxpt.data.arithmetic import Problem
from jaxpt.data.math_prompts import parse_gsm8k_answer

SPLITS = ("train", "test")
_CALCULATOR = re.compile(r"<<[^<>]*>>")


def read_jsonl(path: str) -> list[dict[str, str]]:
  """The examples of one GSM8K jsonl file: [{question, answer, final}], in file order.

  Raises DataError(`path:line: ...`) for a line that is not UTF-8 or not a JSON object with string `question` and
  `answer` fields, or whose answer has no `#### N`. Blank lines are skipped.
  """
  examples = []
  with open(path, "rb") as f:  # bytes, decoded line by line: a bad byte is reported with its line
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        where = f"byte 0x{raw[e.start]:02x} at offset {e.start} of the line"
        raise DataError(f"{path}:{lineno}: not valid UTF-8 ({where})") from None
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
      for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
          raise DataError(f"{path}:{lineno}: field {key!r} is missing or not a string")
      try:
        final = parse_gsm8k_answer(row["answer"])
      except ValueError as e:
        raise DataError(f"{path}:{lineno}: {e}") from None
      if not final:
        raise DataError(f"{path}:{lineno}: nothing after '####' in the answer")
      examples.append({"question": row["question"], "answer": row["answer"], "final": final})
  return examples


def fingerprint(source_path: str) -> str:
  """A hash of the contents of `source_path/{train,test}.jsonl`."""
  digest = hashlib.sha256()
  for split in SPLITS:
    with open(os.path.join(source_path, f"{split}.jsonl"), "rb") as f:
      digest.update(f.read())
  return digest.hexdigest()[:16]


@dataclasses.dataclass(eq=False)
class Gsm8kConfig(tfds.core.BuilderConfig):
  source_path: str = ""


class JaxptGsm8k(tfds.core.GeneratorBasedBuilder):
  """GSM8K read from `source_path/{train,test}.jsonl`; the config is named by a hash of the files' contents."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "GSM8K from local jsonl as array_record."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)  # see JaxptLocalText.code_path

  def __init__(self, *, source_path: str, data_dir: str | None = None, **kwargs):
    for split in SPLITS:
      if not os.path.isfile(os.path.join(source_path, f"{split}.jsonl")):
        raise ValueError(f"task.path={source_path!r}: no {split}.jsonl there")
    kwargs.setdefault("config", Gsm8kConfig(name="src_" + fingerprint(source_path), source_path=source_path,
                                            description=f"GSM8K from {source_path}"))
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="GSM8K grade-school math word problems.",
        disable_shuffling=True,  # file order: index i of a split is its file's i-th non-blank line
        features=tfds.features.FeaturesDict({"question": tfds.features.Text(), "answer": tfds.features.Text(),
                                             "final": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    # Parse every line before writing anything, so a malformed file fails with path:line and leaves no dataset.
    examples = {s: read_jsonl(os.path.join(self.builder_config.source_path, f"{s}.jsonl")) for s in SPLITS}
    return {s: self._generate_examples(examples[s]) for s in SPLITS}

  def _generate_examples(self, examples: list[dict[str, str]]) -> Iterator[tuple[int, dict[str, str]]]:
    yield from enumerate(examples)


def prepare(source_path: str, data_dir: str) -> JaxptGsm8k:
  """The GSM8K builder of `source_path` under `data_dir`, prepared (built once, reused while the files match)."""
  return tfds_text.prepare_quietly(JaxptGsm8k, data_dir, source_path=source_path)


def load_gsm8k(path: str, data_dir: str, split: str) -> list[Problem]:
  """The problems of `split` ('train' | 'test'), in file order, via the TFDS dataset prepared under `data_dir`.

  Problem.answer = the `####` number; solution = the reasoning before `####` without the `<<a*b=c>>` calculator
  annotations; meta = {kind 'gsm8k', index, full_answer}.
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: must be one of {SPLITS}")
  source = prepare(path, data_dir).as_data_source()[split]
  problems = []
  for i, example in enumerate(tfds_text.read_examples(source)):
    answer = tfds_text.as_text(example["answer"])
    solution = _CALCULATOR.sub("", answer[:answer.rfind("####")]).strip()
    problems.append(Problem(question=tfds_text.as_text(example["question"]),
                            answer=tfds_text.as_text(example["final"]), solution=solution,
                            meta={"kind": "gsm8k", "index": i, "full_answer": answer}))
  return problems
