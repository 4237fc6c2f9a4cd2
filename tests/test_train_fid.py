"""The FID-style metric: the Fréchet distance against its formula (scipy.linalg.sqrtm), and end to end on the digits
with the features of a micro `jaxpt vit` run (slow)."""

import jax
import numpy as np
import pytest
import scipy.linalg

import jaxpt
from jaxpt.config import ConfigError
from jaxpt.trainers.fid import ClassifierFeatures, frechet_distance, gaussian_fit
from jaxpt.engine.metrics import read_metrics


def random_covariance(rng, d):
  a = rng.normal(size=(d, 2 * d))
  return a @ a.T / (2 * d)


def test_frechet_distance_matches_the_formula_with_sqrtm():
  rng = np.random.default_rng(0)
  for d in (1, 3, 8):
    mean_a, mean_b = rng.normal(size=(2, d))
    cov_a, cov_b = random_covariance(rng, d), random_covariance(rng, d)
    cross = scipy.linalg.sqrtm(cov_a @ cov_b).real
    want = np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a) + np.trace(cov_b) - 2 * np.trace(cross)
    np.testing.assert_allclose(frechet_distance(mean_a, cov_a, mean_b, cov_b), want, rtol=1e-8, atol=1e-10)
    assert abs(frechet_distance(mean_a, cov_a, mean_a, cov_a)) < 1e-9


def test_make_fid_samples_once_and_scores_every_real_set():
  """One draw per call, scored against each real set: the distances equal frechet_distance of the fits."""
  from jaxpt.trainers.fid import make_fid

  rng = np.random.default_rng(2)
  features = lambda images: jax.numpy.reshape(images, (images.shape[0], -1))[:, :3] * 2.0
  classifier = ClassifierFeatures("", None, features)
  real = {"eval_fid": rng.normal(size=(40, 2, 2, 1)), "eval_val_fid": rng.normal(1.0, 1.0, size=(30, 2, 2, 1))}
  draws = []

  def sample(params, labels, key):
    draws.append(labels)
    return params + jax.random.normal(key, (labels.shape[0], 2, 2, 1))

  fid = make_fid(classifier, real, sample, num_classes=3, num_samples=25, key=jax.random.PRNGKey(0))
  got = fid(0.5)
  assert len(draws) == 1 and list(np.asarray(draws[0])) == [i % 3 for i in range(25)]
  generated = gaussian_fit(features(0.5 + jax.random.normal(jax.random.PRNGKey(0), (25, 2, 2, 1))))
  for name, images in real.items():
    want = frechet_distance(*gaussian_fit(features(jax.numpy.asarray(images))), *generated)
    np.testing.assert_allclose(got[name], want, rtol=1e-6)
  assert got == fid(0.5)  # the same key every call


def test_gaussian_fit_is_the_sample_mean_and_unbiased_covariance():
  features = np.random.default_rng(1).normal(size=(50, 4))
  mean, cov = gaussian_fit(features)
  centred = features - features.mean(0)
  np.testing.assert_allclose(mean, features.mean(0))
  np.testing.assert_allclose(cov, centred.T @ centred / 49)


@pytest.mark.slow
def test_dit_eval_reports_the_fid_of_a_vit_classifiers_features(tmp_path):
  """A micro ViT run gives the features: real test vs validation images are far closer than test vs noise, and a
  micro DiT run with fid.classifier reports a finite eval_fid."""
  from tests import test_train_dit, test_train_vit

  classifier_dir = str(tmp_path / "vit")
  jaxpt.train("vit", test_train_vit.micro_config(steps=100, eval_every=0, checkpoint_every=100), classifier_dir)
  classifier = ClassifierFeatures.from_run(classifier_dir)
  from jaxpt.data.images import ImageData, ImageDataConfig

  data = ImageData.create(ImageDataConfig(), seed=0, image_size=8)
  test = classifier.statistics(data.split_images("test"))
  validation = classifier.statistics(data.split_images("validation"))
  noise = classifier.statistics(jax.random.uniform(jax.random.PRNGKey(0), (300, 8, 8, 1), minval=-1, maxval=1))
  assert 5 * frechet_distance(*test, *validation) < frechet_distance(*test, *noise)

  workdir = str(tmp_path / "dit")
  jaxpt.train("dit", test_train_dit.micro_config(**{"fid.classifier": classifier_dir, "fid.num_samples": 100}), workdir)
  rows = [r for r in read_metrics(workdir) if "eval_fid" in r]
  assert [r["step"] for r in rows] == [40, 80]
  assert all(np.isfinite(r[k]) and r[k] > 0 for r in rows for k in ("eval_fid", "eval_val_fid"))
  assert all(r["eval_fid"] != r["eval_val_fid"] for r in rows)
  with pytest.raises(ConfigError, match="config.fid.classifier=.*not the workdir of a `jaxpt vit` run"):
    ClassifierFeatures.from_run(workdir)
