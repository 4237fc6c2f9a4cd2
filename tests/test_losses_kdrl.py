"""KDRL's knowledge-distillation term (`jaxpt.losses.grpo.kd_term`, every policy loss's optional `teacher_logp`)
against a float64 NumPy statement of Xu et al. 2025: the reverse KL(pi_theta || pi_T) on the student's own samples,
estimated by k2 = 0.5 (logp - logp_T)^2 or k3 = exp(logp_T - logp) - (logp_T - logp) - 1 per token, aggregated like
the policy loss, weighted per rollout (reward-guided masking); values and gradients by central finite differences,
the teacher equal to the student (term and gradient 0), padding holding -inf, and every registered policy loss
adding exactly kd_coef * KD to its value and gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import get_loss, known_losses
from jaxpt.losses import grpo as G
from tests.finite_differences import finite_diff
from tests.test_losses_grpo import MODES, np_agg, np_kl, np_weights, random_batch


def np_kd(lp, teacher, m, kind, mode, w=None):
  """kd = agg(w_b k(lp_bt, teacher_bt)) over mask m, float64 (np_kl: k2 = d^2 / 2, k3 = exp(-d) + d - 1, d = lp - T)."""
  w = np.ones(m.shape[0]) if w is None else np.asarray(w, np.float64)
  return np_agg(w[:, None] * np_kl(lp, teacher, kind), m, mode)


@pytest.mark.parametrize("kind", G.KD_KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_kd_term_value_and_gradient_match_the_numpy_statement(kind, mode, weighted):
  logp, _, teacher, _, mask = random_batch(3, scale=0.6)
  mask[1] = 0.0
  w = np.array([1.0, 1.0, 0.0, 1.0], np.float32) if weighted else None
  fn = lambda lp: G.kd_term(lp, teacher, mask, kind, mode, None, w)
  (kd, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
  x = logp.astype(np.float64)
  np.testing.assert_allclose(kd, np_kd(x, teacher, mask, kind, mode, w), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, finite_diff(lambda z: np_kd(z, teacher, mask, kind, mode, w), x), rtol=1e-4,
                             atol=1e-7)
  # the closed forms: d k2 / d logp = d, d k3 / d logp = 1 - exp(-d), times agg's weight and w
  d = x - teacher
  per_token = d if kind == "k2" else 1.0 - np.exp(-d)
  weights = np_weights(mask, mode) * (np.ones(4) if w is None else w)[:, None]
  np.testing.assert_allclose(grad, per_token * weights, rtol=1e-4, atol=1e-7)
  assert np.all(np.asarray(grad)[mask == 0] == 0.0)
  assert float(metrics["kd"]) == float(kd)
  np.testing.assert_allclose(metrics["teacher_kl"], (d * mask).sum() / mask.sum(), rtol=1e-5)
  assert float(metrics["kd_rows"]) == pytest.approx(2 / 3 if weighted else 1.0)


def test_teacher_equal_to_the_student_gives_zero_term_and_zero_gradient():
  logp, _, _, _, mask = random_batch(5)
  for kind in G.KD_KINDS:
    (kd, _), grad = jax.value_and_grad(lambda lp: G.kd_term(lp, logp, mask, kind), has_aux=True)(jnp.asarray(logp))
    assert float(kd) == 0.0 and np.all(np.asarray(grad) == 0.0)


def test_padding_holding_minus_inf_changes_nothing():
  logp, _, teacher, _, mask = random_batch(7)
  bad_lp, bad_t = logp.copy(), teacher.copy()
  bad_lp[mask == 0], bad_t[mask == 0] = -np.inf, np.nan
  for kind in G.KD_KINDS:
    f = lambda lp, t: jax.value_and_grad(lambda x: G.kd_term(x, t, mask, kind)[0])(jnp.asarray(lp))
    (v, g), (v_bad, g_bad) = f(logp, teacher), f(bad_lp, bad_t)
    assert float(v) == float(v_bad) and np.array_equal(g, g_bad) and np.all(np.isfinite(g_bad))


def test_unknown_estimator_is_refused():
  logp, _, teacher, _, mask = random_batch(1)
  with pytest.raises(ValueError, match="k1"):
    G.kd_term(logp, teacher, mask, "k1")


def _kwargs(name):
  return {"rng": jax.random.PRNGKey(0), "clip_cov_ratio": 0.2, "clip_cov_lb": -10.0} if name == "clip_cov" else {}


@pytest.mark.parametrize("name", known_losses("policy"))
@pytest.mark.parametrize("kind", G.KD_KINDS)
def test_every_policy_loss_adds_kd_coef_times_the_term(name, kind):
  """loss(teacher_logp, kd_coef) - loss() = kd_coef * KD, value and gradient, with the loss's own aggregation and
  the reference-KL / entropy terms on; the metrics gain kd, teacher_kl, kd_rows."""
  logp, old, ref, adv, mask = random_batch(11, scale=0.4)
  teacher = (logp + np.random.default_rng(0).normal(size=logp.shape)).astype(np.float32)
  w = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  mode = "seq-mean-token-sum"
  loss = get_loss("policy", name)
  base = dict(agg=mode, ref_logp=ref, kl_coef=0.05, **_kwargs(name))
  f = lambda lp, **kw: loss(lp, old, adv, mask, **base, **kw)
  (plain, _), g_plain = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp))
  (with_kd, metrics), g_kd = jax.value_and_grad(
      lambda lp: f(lp, teacher_logp=teacher, kd_coef=0.3, kd_kind=kind, kd_weight=w), has_aux=True)(
      jnp.asarray(logp))
  x = logp.astype(np.float64)
  np.testing.assert_allclose(with_kd - plain, 0.3 * np_kd(x, teacher, mask, kind, mode, w), rtol=1e-4, atol=1e-6)
  fd = finite_diff(lambda z: 0.3 * np_kd(z, teacher, mask, kind, mode, w), x)
  np.testing.assert_allclose(np.asarray(g_kd) - np.asarray(g_plain), fd, rtol=1e-4, atol=1e-6)
  assert {"kd", "teacher_kl", "kd_rows"} <= set(metrics) and float(metrics["loss"]) == float(with_kd)


_kd_jit = jax.jit(G.kd_term, static_argnums=(3, 4))


@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(G.KD_KINDS), mode=st.sampled_from(MODES),
       gap=st.floats(0.0, 30.0))
def test_property_kd_is_non_negative_and_zero_only_at_the_teacher(seed, kind, mode, gap):
  """k2 and k3 are >= 0 per token, so the term is (to float32 rounding); at any gap it is finite, matches the
  statement (k3 clamped to 10), and vanishes where the student's log-probs equal the teacher's on the mask."""
  rng = np.random.default_rng(seed)
  logp = -np.abs(rng.normal(size=(4, 6))).astype(np.float32)
  teacher = (logp + rng.normal(size=logp.shape) * gap).astype(np.float32)
  mask = (rng.random((4, 6)) > 0.3).astype(np.float32)
  kd, _ = _kd_jit(logp, teacher, mask, kind, mode)
  want = np_kd(logp.astype(np.float64), teacher, mask, kind, mode)
  assert np.isfinite(float(kd)) and float(kd) >= -1e-6   # k3 in float32: exp(-d) + d - 1 cancels near d = 0
  assert abs(float(kd) - want) <= 1e-5 * max(1.0, abs(want))
  if not np.any((logp != teacher) & (mask != 0)):
    assert float(kd) == 0.0
