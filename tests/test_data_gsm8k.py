"""The GSM8K TFDS builder on the real shared files (read in place, never copied), and its error reporting."""

import glob
import json
import os
import re

import pytest

from jaxpt.config import DataError
from jaxpt.data import gsm8k

GSM8K = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "gsm8k")
GSM8K = os.path.normpath(GSM8K) if os.path.isdir(GSM8K) else "/work/shared/data/gsm8k"
needs_data = pytest.mark.skipif(not os.path.isdir(GSM8K), reason="needs ../shared/data/gsm8k")  # the error tests don't


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("gsm8k_tfds"))
  return {split: gsm8k.load_gsm8k(GSM8K, data_dir, split) for split in gsm8k.SPLITS}, data_dir


@needs_data
def test_row_counts_and_file_order(splits):
  problems, _ = splits
  assert len(problems["train"]) == 7473 and len(problems["test"]) == 1319
  with open(os.path.join(GSM8K, "test.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  for i in (0, 1, 700, 1318):
    assert problems["test"][i].question == lines[i]["question"]
    assert problems["test"][i].meta["full_answer"] == lines[i]["answer"]
    assert problems["test"][i].meta["index"] == i


@needs_data
def test_real_answers_parsed(splits):
  train, test = splits[0]["train"], splits[0]["test"]
  assert train[0].question.startswith("Natalia sold clips") and train[0].answer == "72"
  assert train[1].answer == "10" and train[2].answer == "5"
  assert test[0].question.startswith("Janet") and test[0].answer == "18"
  assert test[1].answer == "3" and test[-1].answer == "14"
  assert train[345].answer == "1080" and train[367].answer == "850000"  # '#### 1,080', '#### 850,000'
  # The solution is the reasoning without the <<48/2=24>> calculator annotations or the #### line.
  assert train[0].solution == ("Natalia sold 48/2 = 24 clips in May.\n"
                               "Natalia sold 48+24 = 72 clips altogether in April and May.")
  assert all("<<" not in p.solution and "####" not in p.solution for p in train[:200])


@needs_data
def test_prepared_once_and_reused(splits):
  _, data_dir = splits
  builder = gsm8k.JaxptGsm8k(source_path=GSM8K, data_dir=data_dir)
  assert builder.is_prepared()
  assert builder.info.splits["train"].num_examples == 7473
  source = builder.as_data_source()["test"]
  assert source[0]["final"].decode() == "18"


def _write(folder, train_lines, test_lines=('{"question": "q", "answer": "a #### 1"}',)):
  os.makedirs(folder, exist_ok=True)
  for name, lines in (("train.jsonl", train_lines), ("test.jsonl", test_lines)):
    with open(os.path.join(folder, name), "w") as f:
      f.write("\n".join(lines) + "\n")
  return os.path.join(folder, "train.jsonl")


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    ('{"question": "q"}', "'answer' is missing"),
    ('{"question": "q", "answer": "no final number"}', "no '####'"),
    ('["q", "a #### 1"]', "expected a JSON object"),
])
def test_malformed_line_names_path_and_line(tmp_path, bad, message):
  good = '{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}'
  path = _write(str(tmp_path / "src"), [good, "", bad])
  with pytest.raises(ValueError, match=rf"{path}:3: .*{message}"):
    gsm8k.load_gsm8k(str(tmp_path / "src"), str(tmp_path / "tfds"), "train")
  assert not glob.glob(str(tmp_path / "tfds" / "**" / "dataset_info.json"), recursive=True)  # nothing prepared


def test_bad_byte_names_path_and_line(tmp_path):
  """A non-UTF-8 byte is a DataError at its file:line (it was a bare UnicodeDecodeError with neither)."""
  good = b'{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n'
  path = _write(str(tmp_path / "src"), [])
  with open(path, "wb") as f:
    f.write(good + b"\n" + b'{"question": "caf\xe9?", "answer": "#### 1"}\n' + good)
  want = rf"^{re.escape(path)}:3: not valid UTF-8 \(byte 0xe9 at offset 17 of the line\)$"
  with pytest.raises(DataError, match=want):
    gsm8k.load_gsm8k(str(tmp_path / "src"), str(tmp_path / "tfds"), "train")
  assert not glob.glob(str(tmp_path / "tfds" / "**" / "dataset_info.json"), recursive=True)  # nothing prepared


def test_small_valid_folder_and_missing_file(tmp_path):
  path = _write(str(tmp_path / "src"), ['{"question": "How many?", "answer": "2 + 2 = <<2+2=4>>4\\n#### 4"}'])
  problems = gsm8k.load_gsm8k(os.path.dirname(path), str(tmp_path / "tfds"), "train")
  assert [(p.question, p.answer, p.solution) for p in problems] == [("How many?", "4", "2 + 2 = 4")]
  os.remove(os.path.join(os.path.dirname(path), "test.jsonl"))
  with pytest.raises(ValueError, match="test.jsonl"):
    gsm8k.load_gsm8k(os.path.dirname(path), str(tmp_path / "tfds"), "train")
