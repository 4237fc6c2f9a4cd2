"""An FID-style metric that runs offline: the Fréchet distance between Gaussian fits of classifier features of real
and generated images.

    (mu, S)   = mean and covariance (ddof 1) of the features f(x) of a set of images            [d], [d, d]
    FD        = ||mu_r - mu_g||^2 + tr(S_r) + tr(S_g) - 2 tr((S_r^(1/2) S_g S_r^(1/2))^(1/2))

FID proper takes f from an ImageNet Inception-v3; here f is the pooled final hidden state (the input of the head) of
a small ViT classifier trained in-repo on the same data set (a `jaxpt vit` run), so nothing is downloaded. Its
numbers are comparable only between models scored with the same classifier run and the same sample count, and not
with published FIDs. The matrix square root is taken through symmetric eigen-decompositions (S_r^(1/2) S_g S_r^(1/2)
is symmetric positive semi-definite), in float64.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import ConfigError, Section, at_least, from_section
from jaxpt.models.vit import ViT, ViTConfig, init_vit_params
from jaxpt.nn.vision import pool
from jaxpt.engine.checkpoint import load_run_params
from jaxpt.engine.record import recorded_config
from jaxpt.engine.trainers import recorded_trainer


@dataclasses.dataclass(frozen=True)
class FIDConfig(Section):
  """The FID-style metric of a DiT run's eval (the `fid` section; see `jaxpt.trainers.fid`).

  Attributes:
    classifier: the workdir of a `jaxpt vit` run on the same image set whose latest params give the features; ''
      = no metric.
    num_samples: images generated per eval (labels cycling through the classes), compared with the whole test split.
  """

  classifier: str = ""
  num_samples: int = 500

  def check(self) -> None:
    at_least(self, "num_samples", 2)


def gaussian_fit(features) -> tuple[np.ndarray, np.ndarray]:
  """float [n, d] -> (mean [d], covariance [d, d]) in float64, the covariance with ddof 1."""
  features = np.asarray(features, np.float64)
  return features.mean(axis=0), np.cov(features, rowvar=False, ddof=1)


def psd_sqrt(matrix: np.ndarray) -> np.ndarray:
  """The symmetric positive semi-definite square root of a symmetric matrix (negative eigenvalues clipped to 0)."""
  values, vectors = np.linalg.eigh((matrix + matrix.T) / 2.0)
  return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def frechet_distance(mean_a, cov_a, mean_b, cov_b) -> float:
  """||mu_a - mu_b||^2 + tr(S_a) + tr(S_b) - 2 tr((S_a^(1/2) S_b S_a^(1/2))^(1/2)), float64."""
  root_a = psd_sqrt(np.asarray(cov_a, np.float64))
  cross = psd_sqrt(root_a @ np.asarray(cov_b, np.float64) @ root_a)
  diff = np.asarray(mean_a, np.float64) - np.asarray(mean_b, np.float64)
  return float(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(cross))


@dataclasses.dataclass
class ClassifierFeatures:
  """features(images float [n, H, W, C] in [-1, 1]) -> float32 [n, d_model]: the pooled final hidden states of a
  `jaxpt vit` run's latest params."""

  workdir: str
  vit: ViTConfig
  features: Callable[[jax.Array], jax.Array]

  @classmethod
  def from_run(cls, workdir: str, field: str = "config.fid.classifier") -> "ClassifierFeatures":
    """ConfigError naming `field` when `workdir` is not a ViT run with a checkpoint."""
    try:
      recorded = recorded_config(workdir)
    except ValueError as e:
      raise ConfigError(field, str(e), workdir) from None
    if recorded_trainer(recorded) != "vit":
      raise ConfigError(field, "not the workdir of a `jaxpt vit` run", workdir)
    from jaxpt.trainers.vit import ViTRunConfig

    run = from_section(ViTRunConfig, recorded, "config")
    model = ViT(run.model, run.vit)
    params = load_run_params(workdir, init_vit_params(run.model, run.vit, jax.random.PRNGKey(0)), field)

    @jax.jit
    def features(images):
      _, hidden = model.apply({"params": params}, images, return_hidden=True)
      return pool(hidden, run.vit.pooling).astype(jnp.float32)

    return cls(workdir, run.vit, features)

  def check_images(self, image_size: int, channels: int, field: str = "config.fid.classifier") -> None:
    """ConfigError naming `field` when the classifier reads other images than image_size x image_size x channels."""
    if (self.vit.image_size, self.vit.channels) != (image_size, channels):
      raise ConfigError(field, f"the classifier reads {self.vit.image_size}x{self.vit.image_size}x{self.vit.channels} "
                        f"images, the DiT makes {image_size}x{image_size}x{channels}", self.workdir)

  def statistics(self, images) -> tuple[np.ndarray, np.ndarray]:
    """`gaussian_fit` of the features of `images` [n, H, W, C]."""
    return gaussian_fit(jax.device_get(self.features(jnp.asarray(images, jnp.float32))))


def make_fid(classifier: ClassifierFeatures, real_images: dict[str, np.ndarray],
             sample: Callable[[Any, jax.Array, jax.Array], jax.Array], num_classes: int, num_samples: int,
             key: jax.Array) -> Callable[[Any], dict[str, float]]:
  """fid(params) -> {name: the Fréchet distance between the features of `real_images[name]` [n, H, W, C] (each set
  fitted once) and of the same `num_samples` images}: one draw `sample(params, labels, key)` per call, labels
  i mod num_classes, the same key every call, scored against every real set (e.g. the test and the validation
  split: sampling once, the distances are cheap)."""
  real = {name: classifier.statistics(images) for name, images in real_images.items()}
  labels = jnp.arange(num_samples, dtype=jnp.int32) % num_classes

  def fid(params: Any) -> dict[str, float]:
    generated = classifier.statistics(sample(params, labels, key))
    return {name: frechet_distance(*statistics, *generated) for name, statistics in real.items()}

  return fid
