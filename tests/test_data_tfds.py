"""TFDS: the local-text builder writes array_record without TensorFlow; datasets are reread by name."""

import collections
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

import ml_collections

from jaxpt.data import corpus, pipeline, tfds_text


def _write_corpus(folder, n=60):
  folder.mkdir(parents=True, exist_ok=True)
  for i in range(n):
    extra = "ünïcode line\n" * (i % 5) + ("dup\n" if i % 10 == 0 else "")
    (folder / f"doc{i:03d}.txt").write_text(f"document {i}\n" + extra)
  (folder / "dup_a.txt").write_text("same content\n")
  (folder / "dup_b.txt").write_text("same content\n")
  return folder


def test_builds_and_reads_with_tensorflow_hidden(tmp_path):
  source = _write_corpus(tmp_path / "corpus", n=8)
  script = textwrap.dedent(f"""
      import sys

      class HideTensorFlow:  # every finder now behaves as if TensorFlow were not installed
        def __init__(self, finder):
          self.finder = finder

        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] == "tensorflow" or not hasattr(self.finder, "find_spec"):
            return None
          return self.finder.find_spec(name, path, target)

      sys.meta_path[:] = [HideTensorFlow(f) for f in sys.meta_path]
      import importlib.util
      assert importlib.util.find_spec("tensorflow") is None
      from jaxpt.data import tfds_text
      builder = tfds_text.prepare_local({str(source)!r}, 1000, 0.2, {str(tmp_path / "tfds")!r})
      train = tfds_text.read_texts(tfds_text.local_sources(builder)["train"])
      assert "tensorflow" not in sys.modules
      print(len(train))
  """)
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  expected_train, _ = corpus.split_documents(corpus.path_documents(str(source)), 0.2)
  assert result.stdout.split()[-1] == str(len(expected_train))


def test_local_builder_builds_array_record_and_rereads_same_split(tmp_path, capfd):
  source = _write_corpus(tmp_path / "corpus")
  data_dir = str(tmp_path / "tfds")
  builder = tfds_text.prepare_local(str(source), 1000, 0.2, data_dir)
  out, err = capfd.readouterr()
  assert out == "" and "Downloading and preparing dataset" in err  # stdout is kept for commands' results
  files = os.listdir(builder.data_dir)
  assert any(f.startswith("jaxpt_local_text-train.array_record") for f in files)
  assert any(f.startswith("jaxpt_local_text-validation.array_record") for f in files)
  expected_train, expected_eval = corpus.split_documents(corpus.path_documents(str(source)), 0.2)
  assert expected_eval, "the fixture corpus should hold out some documents"
  train, held_out = (tfds_text.read_texts(s) for s in tfds_text.local_sources(builder).values())
  assert collections.Counter(train) == collections.Counter(expected_train)
  assert collections.Counter(held_out) == collections.Counter(expected_eval)
  assert "same content\n" not in set(train) & set(held_out)
  # A fresh reader from the directory alone, and tfds.data_source by name, see the same examples in the same order.
  reread = tfds.builder_from_directory(builder.data_dir).as_data_source()
  assert tfds_text.read_texts(reread["train"]) == train
  by_name = tfds.data_source(f"jaxpt_local_text/{builder.builder_config.name}", split="validation",
                             data_dir=data_dir)
  assert tfds_text.read_texts(by_name) == held_out
  # Preparing again reuses the files.
  mtime = os.path.getmtime(builder.data_dir)
  again = tfds_text.prepare_local(str(source), 1000, 0.2, data_dir)
  assert again.data_dir == builder.data_dir and os.path.getmtime(builder.data_dir) == mtime


def test_preparing_leaves_nothing_in_the_system_temp_dir(tmp_path, monkeypatch):
  """tfds makes a `tmp*tfds` folder in the system temp dir for each builder of a dataset not prepared yet, and never
  removes it; jaxpt gives it a folder of the data dir instead and removes that."""
  system_temp = tmp_path / "system_temp"
  system_temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_temp))  # a private TMPDIR
  data_dir = tmp_path / "tfds"
  tfds_text.prepare_local(str(_write_corpus(tmp_path / "corpus", n=5)), 1000, 0.2, str(data_dir))
  assert os.listdir(system_temp) == [] and tempfile.gettempdir() == str(system_temp)
  assert not [name for name in os.listdir(data_dir) if "tmp" in name], os.listdir(data_dir)


def test_changed_source_or_split_gets_a_new_config(tmp_path):
  source = _write_corpus(tmp_path / "corpus", n=5)
  first = tfds_text.local_text_config(str(source), 1000, 0.2)
  assert tfds_text.local_text_config(str(source), 1000, 0.2).name == first.name
  assert tfds_text.local_text_config(str(source), 1000, 0.3).name != first.name
  (source / "doc999.txt").write_text("a new document\n")
  assert tfds_text.local_text_config(str(source), 1000, 0.2).name != first.name


def test_read_texts_stops_at_byte_cap(tmp_path):
  builder = tfds_text.prepare_local(str(_write_corpus(tmp_path / "corpus")), 1000, 0.2, str(tmp_path / "tfds"))
  source = tfds_text.local_sources(builder)["train"]
  texts = tfds_text.read_texts(source, max_bytes=100)
  assert 0 < len(texts) < len(source)
  assert sum(len(t.encode()) for t in texts[:-1]) < 100 <= sum(len(t.encode()) for t in texts)


class JaxptTestNamedText(tfds.core.GeneratorBasedBuilder):
  """A registered dataset with a 'sentence' feature and train/test splits, standing in for e.g. lm1b."""

  VERSION = tfds.core.Version("1.0.0")

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(__file__)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"sentence": tfds.features.Text(), "label": tfds.features.Scalar(dtype=np.int64)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(0, 40), "test": self._generate_examples(40, 50)}

  def _generate_examples(self, begin, end):
    for i in range(begin, end):
      yield i, {"sentence": f"sentence {i} ✓", "label": i}


def test_registered_dataset_by_name(tmp_path):
  JaxptTestNamedText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  sources, identity = tfds_text.named_sources("jaxpt_test_named_text", str(tmp_path))
  train = tfds_text.read_texts(sources["train"], "sentence")
  held_out = tfds_text.read_texts(sources["validation"], "sentence")
  assert sorted(train) == sorted(f"sentence {i} ✓" for i in range(40))
  assert sorted(held_out) == sorted(f"sentence {i} ✓" for i in range(40, 50))
  assert "jaxpt_test_named_text" in identity
  with pytest.raises(ValueError, match="data.tfds_text_key: 'text'"):
    tfds_text.read_texts(sources["train"], "text")


def test_unknown_or_unprepared_dataset_names_field(tmp_path):
  with pytest.raises(ValueError, match="data.tfds_name"):
    tfds_text.named_sources("no_such_dataset_xyz", str(tmp_path))
  with pytest.raises(ValueError, match="data.tfds_name: 'jaxpt_test_named_text' has no prepared"):
    tfds_text.named_sources("jaxpt_test_named_text", str(tmp_path / "empty"))


def test_pipeline_reads_registered_dataset_by_name(tmp_path):
  JaxptTestNamedText(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
  config = ml_collections.ConfigDict(dict(
      path="ignored when tfds_name is set", tfds_name="jaxpt_test_named_text", tfds_text_key="sentence",
      tfds_data_dir=str(tmp_path / "tfds"), seq_len=8, batch_size=2, eval_batches=1, eval_fraction=0.05,
      max_corpus_bytes=1_000_000))
  data = pipeline.LMData.create(config, 300, str(tmp_path / "work"), seed=0)
  train_text = "".join(data.tokenizer.decode(data.train_batch(s)["inputs"].reshape(-1)) for s in range(5))
  assert "sentence" in train_text and "✓" in train_text
  eval_ids = data.eval_batches()[0]["inputs"]
  assert eval_ids.shape == (2, 8)
  eval_numbers = {int(w) for w in data.tokenizer.decode(eval_ids.reshape(-1)).replace("✓", " ").split()
                  if w.isdigit()}
  assert eval_numbers and eval_numbers <= set(range(40, 50))  # the 'test' split is held out
  # max_corpus_bytes caps what is read from a named dataset.
  config.max_corpus_bytes = 100
  capped = pipeline.LMData.create(config, 300, str(tmp_path / "work"), seed=0)
  assert capped.num_train_rows < data.num_train_rows
