"""The KTO loss (`jaxpt.losses.preference.kto`) against a float64 NumPy statement of its equations, with gradients,
and hypothesis properties (bounded, monotone in the implicit reward, the reference point clamped at 0 and carrying no
gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpt.losses import get_loss
from jaxpt.losses.preference import kto


def sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def numpy_kto(pi, ref, kl_pi, kl_ref, desirable, beta, lam_d, lam_u, w=None):
  """(loss, d loss / d pi) in float64: the paper's L = E[lambda_y - v(x, y)] with z0 = max(0, mean(kl_pi - kl_ref))
  held constant; d/d pi_i = -(w_i / W) lambda_i beta s_i (1 - s_i) for desirable rows, + for undesirable ones."""
  pi, ref, kl_pi, kl_ref = (np.asarray(v, np.float64) for v in (pi, ref, kl_pi, kl_ref))
  good = np.asarray(desirable) > 0
  w = np.ones_like(pi) if w is None else np.asarray(w, np.float64)
  z0 = max(0.0, (w * (kl_pi - kl_ref)).sum() / w.sum())
  r = pi - ref
  lam = np.where(good, lam_d, lam_u)
  s = sigmoid(np.where(good, beta * (r - z0), beta * (z0 - r)))
  loss = (w * (lam - lam * s)).sum() / w.sum()
  grad = np.where(good, -1.0, 1.0) * w / w.sum() * lam * beta * s * (1 - s)
  return loss, grad, z0


def _inputs(seed, n=8):
  rng = np.random.default_rng(seed)
  pi, ref = -rng.uniform(5, 40, n), -rng.uniform(5, 40, n)
  kl_pi, kl_ref = -rng.uniform(5, 40, n), -rng.uniform(5, 40, n)
  desirable = rng.integers(0, 2, n)
  return [x.astype(np.float32) for x in (pi, ref, kl_pi, kl_ref)] + [desirable.astype(np.int32)]


@pytest.mark.parametrize("beta,lam_d,lam_u,weighted", [(0.1, 1.0, 1.0, False), (0.5, 1.33, 1.0, True),
                                                      (0.05, 1.0, 2.0, True)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kto_matches_numpy_value_and_grad(seed, beta, lam_d, lam_u, weighted):
  pi, ref, kl_pi, kl_ref, desirable = _inputs(seed)
  w = np.array([1, 1, 0, 1, 0.5, 1, 1, 1], np.float32) if weighted else None
  fn = lambda p, kp: kto(p, ref, kp, kl_ref, desirable, beta, lam_d, lam_u, w)  # noqa: E731
  (loss, metrics), (g_pi, g_kl) = jax.value_and_grad(fn, argnums=(0, 1), has_aux=True)(jnp.asarray(pi),
                                                                                       jnp.asarray(kl_pi))
  want, want_grad, z0 = numpy_kto(pi, ref, kl_pi, kl_ref, desirable, beta, lam_d, lam_u, w)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(g_pi, want_grad, rtol=1e-4, atol=1e-8)
  np.testing.assert_array_equal(g_kl, 0.0)  # the reference point carries no gradient
  np.testing.assert_allclose(metrics["kl"], z0, rtol=1e-5, atol=1e-6)
  ww = np.ones(8) if w is None else w
  good = desirable > 0
  r = beta * (pi.astype(np.float64) - ref)
  np.testing.assert_allclose(metrics["desirable_reward"], (ww * good * r).sum() / (ww * good).sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["undesirable_reward"], (ww * ~good * r).sum() / (ww * ~good).sum(), rtol=1e-5)


def test_reference_point_is_clamped_at_zero_and_can_be_positive():
  pi, ref, kl_pi, kl_ref, desirable = _inputs(3)
  _, metrics = kto(pi, ref, kl_ref - 1.0, kl_ref, desirable)  # mean KL estimate -1 -> z0 = 0
  assert float(metrics["kl"]) == 0.0
  _, metrics = kto(pi, ref, kl_ref + 2.0, kl_ref, desirable)
  np.testing.assert_allclose(metrics["kl"], 2.0, rtol=1e-6)


def test_registered_as_a_preference_loss():
  assert get_loss("preference", "kto") is kto


_vg = jax.jit(jax.value_and_grad(lambda pi, ref, kl_pi, kl_ref, d: kto(pi, ref, kl_pi, kl_ref, d, 0.1, 1.5, 1.0)[0]))


@settings(deadline=None, max_examples=40)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 1e2, 1e4]))
def test_property_bounded_finite_and_monotone(seed, scale):
  """0 <= L <= max(lambda) for any log-probs; finite gradients; raising a desirable row's log-prob (or lowering an
  undesirable one's) never raises the loss."""
  pi, ref, kl_pi, kl_ref, desirable = (x * scale if x.dtype == np.float32 else x for x in _inputs(seed))
  loss, grad = _vg(pi, ref, kl_pi, kl_ref, desirable)
  assert 0.0 <= float(loss) <= 1.5 + 1e-6 and np.all(np.isfinite(grad))
  assert np.all(np.asarray(grad)[desirable > 0] <= 0) and np.all(np.asarray(grad)[desirable == 0] >= 0)
