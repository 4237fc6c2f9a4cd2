"""TFDS access to text: a builder for local corpora (written as array_record, no TensorFlow needed) and random-access
readers of its splits or of any prepared, registered TFDS dataset by name.

tfds 4.9.10 prepares a `GeneratorBasedBuilder` with `file_format='array_record'` without TensorFlow, and
`as_data_source()` / `tfds.data_source` read it back through array_record; `Text` features come back as UTF-8 bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
from typing import Any, Iterator, Sequence

import tensorflow_datasets as tfds
from etils import epath

from jaxpt import oserrors
from jaxpt.config import ConfigError
from jaxpt.data import corpus

TRAIN, VALIDATION = "train", "validation"
_EVAL_SPLITS = ("validation", "test")  # for datasets by name: the first of these that exists is held out


@dataclasses.dataclass(eq=False)
class LocalTextConfig(tfds.core.BuilderConfig):
  """A local corpus: `source_path` ('' = the embedded standard-library corpus, capped at `max_bytes`)."""

  source_path: str = ""
  max_bytes: int = 4_000_000
  eval_fraction: float = 0.05


def local_text_config(source_path: str, max_bytes: int, eval_fraction: float) -> LocalTextConfig:
  """The config for a corpus, named by a fingerprint of its files and split, so a changed source is rebuilt."""
  key = f"{corpus.fingerprint(source_path, max_bytes)}|{eval_fraction!r}"
  name = "src_" + hashlib.sha256(key.encode()).hexdigest()[:16]
  return LocalTextConfig(name=name, description=f"text of {source_path or 'the embedded stdlib corpus'}",
                         source_path=source_path, max_bytes=max_bytes, eval_fraction=eval_fraction)


class JaxptLocalText(tfds.core.GeneratorBasedBuilder):
  """Documents of a local text file or folder (see `jaxpt.data.corpus`), split into train and validation.

  Features: {'text': Text}. Splits: 'train', 'validation' (held out by `corpus.split_documents`). Each document is
  one example; TFDS stores examples in an order fixed by a hash of their keys.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Local text corpora as array_record."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # tfds's default resolves the package through `importlib_resources`, which is not installed with tfds and
    # fails for editable installs; this file is the answer it would compute.
    return epath.Path(__file__)

  def __init__(self, *, source_path: str = "", max_bytes: int = 4_000_000, eval_fraction: float = 0.05,
               data_dir: str | None = None, **kwargs):
    kwargs.setdefault("config", local_text_config(source_path, max_bytes, eval_fraction))
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Local text corpus, one document per example.",
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    config = self.builder_config
    docs = corpus.read_documents(config.source_path, config.max_bytes)
    train, held_out = corpus.split_documents(docs, config.eval_fraction)
    return {TRAIN: self._generate_examples(train), VALIDATION: self._generate_examples(held_out)}

  def _generate_examples(self, docs: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    for i, doc in enumerate(docs):
      yield i, {"text": doc}


@contextlib.contextmanager
def _temp_dir_in(directory: str) -> Iterator[None]:
  """The system temp dir is a new folder of `directory` meanwhile, removed afterwards: a builder whose dataset is not
  prepared yet makes a `tmp*tfds` folder there (`DatasetInfo.initialize_from_bucket`, tfds 4.9) and never removes
  it. Sets `tempfile.tempdir`, so a data preparation is the only work the process should do meanwhile."""
  os.makedirs(directory, exist_ok=True)
  folder = tempfile.mkdtemp(prefix="jaxpt-tfds-tmp-", dir=directory)
  previous, tempfile.tempdir = tempfile.tempdir, folder
  try:
    yield
  finally:
    tempfile.tempdir = previous
    shutil.rmtree(folder, ignore_errors=True)


def prepare_quietly(builder_type: type[tfds.core.DatasetBuilder], data_dir: str,
                    **config: Any) -> tfds.core.DatasetBuilder:
  """`builder_type(data_dir=data_dir, **config)`, its dataset prepared from local files only (built once; later
  calls reuse the prepared files), without tfds's progress bars (a one-off build of a small source; keeps the
  training bar readable) and with its "Downloading and preparing dataset" lines moved from stdout to stderr (stdout
  carries a command's result, e.g. `jaxpt eval`'s JSON line). TFDS's temporary files stay under `data_dir` and are
  removed; a full disk is one OSError naming the dataset's folder (tfds removes its incomplete files)."""
  was_shown = getattr(tfds.core.utils.tqdm_utils, "_active", True)
  tfds.display_progress_bar(False)
  try:
    with _temp_dir_in(data_dir):
      builder = builder_type(data_dir=data_dir, **config)
      with oserrors.writing(str(builder.data_dir)), contextlib.redirect_stdout(sys.stderr):
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  finally:
    tfds.display_progress_bar(was_shown)
  return builder


def as_text(value: Any) -> str:
  """A `Text` feature as read back from array_record (UTF-8 bytes) -> str."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_examples(source: Any, chunk: int = 1024) -> Iterator[dict]:
  """Every example of a random-access TFDS data source, in index order, read `chunk` at a time."""
  for begin in range(0, len(source), chunk):
    yield from source.__getitems__(range(begin, min(begin + chunk, len(source))))


def prepare_local(source_path: str, max_bytes: int, eval_fraction: float, data_dir: str) -> JaxptLocalText:
  """The builder of a local corpus under `data_dir`, prepared (built once; reused while the source is unchanged)."""
  return prepare_quietly(JaxptLocalText, data_dir, source_path=source_path, max_bytes=max_bytes,
                         eval_fraction=eval_fraction)


def read_texts(source, text_key: str = "text", max_bytes: int | None = None) -> list[str]:
  """Texts of a random-access TFDS data source in index order, stopping once `max_bytes` UTF-8 bytes are read."""
  texts, total = [], 0
  for example in read_examples(source):
    if text_key not in example:
      raise ConfigError("config.data.tfds_text_key", f"{text_key!r} is not a feature (features: {sorted(example)})")
    value = example[text_key]
    texts.append(as_text(value))
    total += len(value)
    if max_bytes is not None and total >= max_bytes:
      return texts
  return texts


def local_sources(builder: JaxptLocalText) -> dict[str, Any]:
  """{'train', 'validation'} -> random-access array_record data sources of a prepared local-text builder."""
  sources = builder.as_data_source()
  return {TRAIN: sources[TRAIN], VALIDATION: sources[VALIDATION]}


def named_sources(name: str, data_dir: str = "") -> tuple[dict[str, Any], str]:
  """Data sources of a prepared, registered TFDS dataset (e.g. 'lm1b', 'c4/en'), and an identity for cache keys.

  Returns ({'train': source, 'validation': source}, identity); 'validation' is the dataset's 'validation' split,
  else its 'test' split. Nothing is downloaded: the dataset must have been prepared as array_record under
  `data_dir` ('' = the TFDS default data dir).
  """
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except Exception as e:  # tfds raises several types for unknown names / configs
    raise ConfigError("config.data.tfds_name", f"cannot open TFDS dataset {name!r} "
                      f"(data.tfds_data_dir={data_dir!r}): {e}") from e
  splits = builder.info.splits
  if not builder.is_prepared() or TRAIN not in splits:
    raise ConfigError("config.data.tfds_name", f"{name!r} has no prepared 'train' split under {builder.data_dir} "
                      f"(data.tfds_data_dir={data_dir!r})")
  held_out = next((s for s in _EVAL_SPLITS if s in splits), None)
  if held_out is None:
    raise ConfigError("config.data.tfds_name", f"{name!r} has no 'validation' or 'test' split (splits: "
                      f"{sorted(splits)})")
  try:
    sources = builder.as_data_source()
  except Exception as e:
    raise ConfigError("config.data.tfds_name", f"{name!r} under {builder.data_dir} cannot be read as a random-access "
                      f"data source (it must be prepared with file_format='array_record'): {e}") from e
  identity = f"{builder.info.full_name}|{builder.data_dir}|{splits[TRAIN].num_examples}|{held_out}"
  return {TRAIN: sources[TRAIN], VALIDATION: sources[held_out]}, identity
