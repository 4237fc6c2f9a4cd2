"""lm_cross_entropy against a plain numpy re-statement, including gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import get_loss, known_losses, register_loss
from jaxpt.losses.lm import lm_cross_entropy


def numpy_lm_loss(logits, targets, weights, z_loss):
  logits = logits.astype(np.float64)
  m = logits.max(-1, keepdims=True)
  lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
  nll = lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  n = weights.sum()
  return (weights * nll).sum() / n + z_loss * (weights * lse**2).sum() / n, (weights * nll).sum() / n


def numpy_grad(logits, targets, weights, z_loss):
  """d loss / d logits = w/N * (softmax - onehot + 2 z lse softmax)."""
  logits = logits.astype(np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  onehot = np.eye(logits.shape[-1])[targets]
  scale = (weights / weights.sum())[..., None]
  return scale * (p - onehot + 2 * z_loss * lse[..., None] * p)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
  targets = rng.integers(0, 11, size=(2, 5)).astype(np.int32)
  weights = (rng.random((2, 5)) > 0.3).astype(np.float32)
  weights[0, 0] = 1.0
  return logits, targets, weights


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_matches_numpy_value_and_grad(batch, z_loss):
  logits, targets, weights = batch
  (loss, metrics), grad = jax.value_and_grad(lm_cross_entropy, has_aux=True)(
      jnp.asarray(logits), targets, weights, z_loss)
  want_loss, want_nll = numpy_lm_loss(logits, targets, weights, z_loss)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(metrics["nll"], want_nll, rtol=1e-5)
  np.testing.assert_allclose(metrics["z_loss"], want_loss - want_nll, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(grad, numpy_grad(logits, targets, weights, z_loss), rtol=1e-4, atol=1e-7)
  assert metrics["num_tokens"] == weights.sum()
  want_acc = ((logits.argmax(-1) == targets) * weights).sum() / weights.sum()
  np.testing.assert_allclose(metrics["accuracy"], want_acc, rtol=1e-6)


def test_stable_for_huge_logits_and_bf16(batch):
  logits, targets, weights = batch
  big = jnp.asarray(logits * 1e4, jnp.bfloat16)
  loss, _ = lm_cross_entropy(big, targets, weights)
  grad = jax.grad(lambda x: lm_cross_entropy(x, targets, weights, 1e-4)[0])(big)
  assert loss.dtype == jnp.float32 and np.isfinite(loss)
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


def test_zero_weights_give_zero_loss(batch):
  logits, targets, _ = batch
  loss, metrics = lm_cross_entropy(logits, targets, np.zeros(targets.shape, np.float32), 1e-3)
  assert float(loss) == 0.0 and float(metrics["num_tokens"]) == 0.0


def test_registry():
  assert get_loss("lm", "lm_cross_entropy") is lm_cross_entropy
  assert "lm_cross_entropy" in known_losses("lm")
  with pytest.raises(KeyError, match=r"unknown lm loss 'no_such_loss' \(known: .*lm_cross_entropy"):
    get_loss("lm", "no_such_loss")
  with pytest.raises(ValueError, match="lm loss 'lm_cross_entropy' is already registered"):
    register_loss("lm", "lm_cross_entropy")(lambda: None)
  register_loss("lm", "lm_cross_entropy")(lm_cross_entropy)  # the same function again is fine
  assert get_loss("lm", "lm_cross_entropy") is lm_cross_entropy


_loss_and_grad = jax.jit(jax.value_and_grad(lambda lg, t, w: lm_cross_entropy(lg, t, w, z_loss=1e-4)[0]))


@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 1e2, 1e4]),
       masked_rows=st.integers(0, 3))
def test_property_finite_nonnegative_and_masked_tokens_get_no_gradient(seed, scale, masked_rows):
  """Any logits scale, any number of all-masked rows: finite loss >= 0; masked tokens get exactly zero grad."""
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(3, 4, 7)) * scale).astype(np.float32)
  targets = rng.integers(0, 7, size=(3, 4)).astype(np.int32)
  weights = (rng.random((3, 4)) > 0.5).astype(np.float32)
  weights[:masked_rows] = 0.0
  loss, grad = _loss_and_grad(logits, targets, weights)
  assert np.isfinite(loss) and loss >= 0.0
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(np.asarray(grad)[weights == 0], 0.0)
  if weights.sum() == 0:
    assert loss == 0.0


_lm_vg = jax.jit(jax.value_and_grad(lambda lg, t, w: lm_cross_entropy(lg, t, w, z_loss=1e-4), has_aux=True))


def _masked_batch(seed, masked_rows):
  rng = np.random.default_rng(seed)
  targets = rng.integers(0, 7, size=(3, 4)).astype(np.int32)
  weights = (rng.random((3, 4)) > 0.3).astype(np.float32)
  weights[np.array(masked_rows)] = 0.0
  return rng, targets, weights


@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e2, 1e3, 1e4]),
       masked_rows=st.lists(st.booleans(), min_size=3, max_size=3))
def test_property_matches_numpy_at_any_logit_scale(seed, scale, masked_rows):
  """Loss, nll and d loss / d logits (float32, z_loss 1e-4) equal the float64 statement for logits up to +-1e4 and
  any fully masked rows (all of them: loss 0, gradient 0). Loss tolerance: a few float32 ulps of max |logit|
  (nll_t = lse_t - logit_t cancels when the target is the argmax)."""
  rng, targets, weights = _masked_batch(seed, masked_rows)
  logits = (rng.normal(size=(3, 4, 7)) * scale).astype(np.float32)
  (loss, metrics), grad = _lm_vg(logits, targets, weights)
  if weights.sum() == 0:
    assert float(loss) == 0.0 and float(metrics["nll"]) == 0.0
    np.testing.assert_array_equal(grad, 0.0)
    return
  want_loss, want_nll = numpy_lm_loss(logits, targets, weights, 1e-4)
  ulps = 8 * np.spacing(np.float32(np.abs(logits).max()))
  np.testing.assert_allclose(metrics["nll"], want_nll, rtol=1e-5, atol=ulps)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=ulps)
  np.testing.assert_allclose(grad, numpy_grad(logits, targets, weights, 1e-4), rtol=1e-4, atol=1e-7)


@given(seed=st.integers(0, 2**31 - 1), level=st.floats(-1e4, 1e4, width=32),
       masked_rows=st.lists(st.booleans(), min_size=3, max_size=3))
def test_property_uniform_logits_give_log_vocab(seed, level, masked_rows):
  """Degenerate logits (all V = 7 equal, at any level c in +-1e4; some rows fully masked): nll = log V, and
  d nll / d logits = w/N (1/V - onehot); the level only moves the z-loss (lse = c + log V). Tolerance for nll: a
  few float32 ulps of c (lse and the target logit cancel)."""
  _, targets, weights = _masked_batch(seed, masked_rows)
  logits = np.full((3, 4, 7), level, np.float32)
  (loss, metrics), grad = _lm_vg(logits, targets, weights)
  n = weights.sum()
  if n == 0:
    assert float(loss) == 0.0
    np.testing.assert_array_equal(grad, 0.0)
    return
  ulps = 8 * np.spacing(np.float32(abs(level)))
  np.testing.assert_allclose(metrics["nll"], np.log(7.0), rtol=1e-6, atol=ulps)
  lse = np.float64(level) + np.log(7.0)
  np.testing.assert_allclose(loss, np.log(7.0) + 1e-4 * lse**2, rtol=1e-5, atol=ulps)
  w = (weights / n)[..., None]
  want = w * (1.0 / 7.0 - np.eye(7)[targets] + 2e-4 * lse / 7.0)
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(grad, numpy_grad(logits, targets, weights, 1e-4), rtol=1e-4, atol=1e-7)
