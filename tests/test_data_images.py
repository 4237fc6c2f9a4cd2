"""Image data: the offline sets, their fixed splits, step-indexed augmented batches, TFDS errors."""

import dataclasses

import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

from jaxpt.config import ConfigError, DataError, from_section
from jaxpt.data.tfds_text import prepare_quietly
from jaxpt.data.images import (SHAPES, ImageData, ImageDataConfig, TFDSSplit, augment, fit_image, make_shapes,
                                 normalise)

DIGITS = ImageDataConfig(source="digits", batch_size=16, crop_padding=1, flip=True)


@pytest.fixture(scope="module")
def digits():
  return ImageData.create(DIGITS, seed=3, image_size=8)


def test_digits_split_is_fixed_and_complete(digits):
  sizes = {name: len(split) for name, split in digits.splits.items()}
  assert sizes == {"test": 359, "validation": 180, "train": 1258}
  assert digits.image_shape == (8, 8, 1) and digits.num_classes == 10
  again = ImageData.create(dataclasses.replace(DIGITS, batch_size=8), seed=99, image_size=8)
  for name, split in digits.splits.items():  # the split does not depend on the run's seed or batch
    np.testing.assert_array_equal(split.images, again.splits[name].images)
  assert sum(sizes.values()) == 1797


def test_batches_depend_on_the_step_only_and_split_over_processes(digits):
  whole = digits.train_batch(5)
  halves = [digits.train_batch(5, p, 2) for p in range(2)]
  for key in whole:
    np.testing.assert_array_equal(whole[key], np.concatenate([h[key] for h in halves]))
    np.testing.assert_array_equal(whole[key], digits.train_batch(5)[key])
  assert not np.array_equal(whole["images"], digits.train_batch(6)["images"])
  assert whole["images"].dtype == np.float32 and whole["images"].shape == (16, 8, 8, 1)
  assert whole["images"].min() >= -1.0 and whole["images"].max() <= 1.0


def test_augment_is_a_padded_crop_and_a_mirror():
  images = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1) + 1
  out = augment(images, np.random.default_rng(0), 2, 0, 2, padding=1, flip=True)
  rng = np.random.default_rng(0)  # the same draws, in augment's order: offsets, then flips
  offsets, flips = rng.integers(0, 3, (2, 2)), rng.random(2) < 0.5
  for image, got, (dy, dx), flip in zip(images, out, offsets, flips):
    padded = np.pad(image, [(1, 1), (1, 1), (0, 0)])
    want = padded[dy:dy + 4, dx:dx + 4]
    np.testing.assert_array_equal(got, want[:, ::-1] if flip else want)


def test_eval_batches_cover_the_split_once_with_padding(digits):
  batches = list(digits.eval_batches("validation"))
  assert [len(b["labels"]) for b in batches] == [16] * 12
  weights = np.concatenate([b["weights"] for b in batches])
  assert weights.sum() == 180 and np.all(weights[180:] == 0)
  labels = np.concatenate([b["labels"] for b in batches])[:180]
  np.testing.assert_array_equal(labels, digits.splits["validation"].labels)
  np.testing.assert_array_equal(batches[0]["images"], normalise(digits.splits["validation"].images[:16]))


def test_shapes_are_deterministic_and_each_class_has_its_shape():
  images, labels = make_shapes(40)
  again, _ = make_shapes(40)
  np.testing.assert_array_equal(images, again)
  assert images.shape == (40, 16, 16, 3) and set(labels) == set(range(len(SHAPES)))
  bright = (images.max(axis=-1) >= 120).sum(axis=(1, 2))
  assert np.all(bright >= 6)  # every image shows its shape
  data = ImageData.create(ImageDataConfig(source="shapes", shapes_count=40), seed=0, image_size=16)
  assert data.image_shape == (16, 16, 3) and data.num_classes == len(SHAPES)
  assert sum(len(split) for split in data.splits.values()) == 40


def test_unprepared_tfds_set_is_one_line(tmp_path):
  config = ImageDataConfig(source="tfds:cifar10", tfds_data_dir=str(tmp_path))
  with pytest.raises(DataError) as error:
    ImageData.create(config, seed=0, image_size=32)
  message = str(error.value)
  assert message.startswith("config.data.source='tfds:cifar10': not prepared under") and "\n" not in message
  assert "tfds build cifar10 --file_format=array_record" in message


@pytest.mark.parametrize("overrides, message", [
    (dict(source="mnist"), "config.data.source='mnist': must be one of digits, shapes or tfds:NAME"),
    (dict(test_fraction=0.6, validation_fraction=0.4), "config.data.validation_fraction=0.4: plus"),
    (dict(crop_padding=-1), "config.data.crop_padding=-1: must be >= 0"),
])
def test_impossible_data_config_names_the_field(overrides, message):
  with pytest.raises(ConfigError) as error:
    from_section(ImageDataConfig, {**dataclasses.asdict(DIGITS), **overrides}, "config.data")
  assert str(error.value).startswith(message), str(error.value)


def test_tfds_split_reads_rows_and_fits_their_size():
  """A TFDS split (any random-access source of {image, label}): images of other sizes are resized on the shorter
  side and centre-cropped; an image of the right size passes unchanged."""
  rng = np.random.default_rng(0)
  source = [{"image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": 4},
            {"image": rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), "label": 7}]
  images, labels = TFDSSplit(source, 8).rows(np.array([1, 0]))
  assert images.shape == (2, 8, 8, 3) and images.dtype == np.uint8
  np.testing.assert_array_equal(labels, [7, 4])
  np.testing.assert_array_equal(images[1], source[0]["image"])
  ramp = np.broadcast_to((np.arange(24) * 10).astype(np.uint8)[None, :, None], (16, 24, 1))  # column j: 10 j
  fitted = fit_image(np.ascontiguousarray(ramp), 8)[..., 0].astype(float)
  assert fitted.shape == (8, 8)
  assert abs(fitted.mean() - 115) < 3  # centred: the mean of columns 4 .. 19
  assert fitted[:, 0].mean() > 35 and fitted[:, -1].mean() < 195  # columns 0 .. 3 and 20 .. 23 cropped away


class JaxptTestTinyImages(tfds.core.GeneratorBasedBuilder):
  """A prepared TFDS image set in miniature: 12 train and 6 test 8x8 RGB images, 3 classes (raw uint8 tensors:
  TFDS encodes an Image feature with TensorFlow, which the tests do without)."""

  VERSION = tfds.core.Version("1.0.0")

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:  # as jaxpt.data.tfds_text.JaxptLocalText: no importlib_resources lookup
    return epath.Path(__file__)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Tensor(shape=(8, 8, 3), dtype=np.uint8),
        "label": tfds.features.ClassLabel(num_classes=3)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(12, 0), "test": self._generate_examples(6, 1)}

  def _generate_examples(self, count=0, seed=0):
    rng = np.random.default_rng(seed)
    for index in range(count):
      yield index, {"image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": index % 3}


def test_a_prepared_tfds_set_is_read_by_name(tmp_path):
  prepare_quietly(JaxptTestTinyImages, str(tmp_path), file_format="array_record")
  config = ImageDataConfig(source="tfds:jaxpt_test_tiny_images", tfds_data_dir=str(tmp_path), batch_size=4)
  data = ImageData.create(config, seed=0, image_size=8)
  assert {name: len(split) for name, split in data.splits.items()} == {"train": 12, "test": 6}
  assert data.image_shape == (8, 8, 3) and data.num_classes == 3
  batch = data.train_batch(2)
  assert batch["images"].shape == (4, 8, 8, 3) and set(batch["labels"]) <= {0, 1, 2}
  assert sum(b["weights"].sum() for b in data.eval_batches("test")) == 6
