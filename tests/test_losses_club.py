"""CLUB estimator (DIR): numpy re-statement of the spec's equations, dependence detection, and stop-gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import club
from tests.finite_differences import finite_diff


def numpy_log_q(params, x):
  """log q(. | X) for the Linear-ReLU-Linear estimator, float64."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  h = np.maximum(np.asarray(x, np.float64) @ p["w1"] + p["b1"], 0.0)
  logits = h @ p["w2"] + p["b2"]
  m = logits.max(-1, keepdims=True)
  return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def numpy_club(params, x, a, w=None):
  """The spec's estimator, literally: (1/N) sum_i log q(a_i|X_i) - (1/N^2) sum_i sum_j log q(a_j|X_i)."""
  lq = numpy_log_q(params, x)
  n = len(a)
  w = np.ones(n) if w is None else np.asarray(w, np.float64)
  big_n = w.sum()
  pos = sum(w[i] * lq[i, a[i]] for i in range(n)) / big_n
  neg = sum(w[i] * w[j] * lq[i, a[j]] for i in range(n) for j in range(n)) / big_n**2
  return pos - neg


def numpy_estimator_loss(params, x, a):
  lq = numpy_log_q(params, x)
  return -np.mean(lq[np.arange(len(a)), a])


@pytest.fixture(scope="module")
def small():
  rng = np.random.default_rng(0)
  n, d, c = 6, 5, 3
  params = club.init_club_estimator(jax.random.PRNGKey(0), d, n_classes=c, hidden=7)
  x = rng.normal(size=(n, d)).astype(np.float32)
  a = rng.integers(0, c, size=n).astype(np.int32)
  return params, x, a


def test_init_shapes_and_dtype():
  p = club.init_club_estimator(jax.random.PRNGKey(1), 12)
  assert {k: v.shape for k, v in p.items()} == {"w1": (12, 1024), "b1": (1024,), "w2": (1024, 2), "b2": (2,)}
  assert all(v.dtype == jnp.float32 for v in p.values())
  bound = 1 / np.sqrt(12)
  assert np.abs(p["w1"]).max() <= bound and np.abs(p["w1"]).max() > 0.9 * bound


@pytest.mark.parametrize("weighted", [False, True])
def test_club_estimate_matches_numpy_value_and_grad(small, weighted):
  params, x, a = small
  w = np.array([1, 0, 1, 1, 0.5, 1], np.float32) if weighted else None
  (est, m), gx = jax.value_and_grad(club.club_estimate, argnums=1, has_aux=True)(params, jnp.asarray(x), a, w)
  want = numpy_club(params, x, a, w)
  np.testing.assert_allclose(est, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m["club_positive"] - m["club_negative"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gx, finite_diff(lambda xx: numpy_club(params, xx, a, w), x), rtol=1e-4, atol=1e-5)
  if weighted:  # a zero-weight pair changes nothing, whatever its X
    x2 = x.copy()
    x2[1] += 100.0
    np.testing.assert_allclose(club.club_estimate(params, x2, a, w)[0], est, rtol=1e-6)


def test_estimator_loss_matches_numpy_and_stops_gradient_to_x(small):
  params, x, a = small
  loss, m = club.club_estimator_loss(params, x, a)
  np.testing.assert_allclose(loss, numpy_estimator_loss(params, x, a), rtol=1e-5)
  np.testing.assert_allclose(m["accuracy"], np.mean(numpy_log_q(params, x).argmax(-1) == a), rtol=1e-6)
  gx = jax.grad(lambda xx: club.club_estimator_loss(params, xx, a)[0])(jnp.asarray(x))
  np.testing.assert_array_equal(gx, 0.0)
  gp = jax.grad(lambda p: club.club_estimator_loss(p, x, a)[0])(params)
  assert float(jnp.abs(gp["w2"]).sum()) > 0


def test_penalty_gradient_reaches_x_but_not_estimator(small):
  params, x, a = small
  f = lambda p, xx: club.club_penalty(p, xx, a)[0]
  gp, gx = jax.grad(f, argnums=(0, 1))(params, jnp.asarray(x))
  for v in jax.tree_util.tree_leaves(gp):
    np.testing.assert_array_equal(v, 0.0)
  np.testing.assert_allclose(gx, jax.grad(lambda xx: club.club_estimate(params, xx, a)[0])(jnp.asarray(x)), rtol=1e-6)
  assert float(jnp.abs(gx).sum()) > 0
  # The un-stopped estimate does give psi a gradient (so the zero above is the stop_gradient's doing).
  gp_free = jax.grad(lambda p: club.club_estimate(p, x, a)[0])(params)
  assert float(jnp.abs(gp_free["w2"]).sum()) > 0


def synthetic(seed, n=1024, d=8, dependent=True):
  rng = np.random.default_rng(seed)
  a = rng.integers(0, 2, size=n).astype(np.int32)
  noise = rng.normal(size=(n, d))
  if dependent:
    w = rng.normal(size=(2, d)) * 1.5
    x = np.eye(2)[a] @ w + noise
  else:
    x = noise
  return jnp.asarray(x, jnp.float32), jnp.asarray(a)


_OPT = optax.adamw(3e-3, weight_decay=0.01)
_fit = jax.jit(lambda p, s, x, a: club.inner_update(p, s, x, a, _OPT, 30))


def fitted_estimate(seed, dependent):
  x, a = synthetic(seed, dependent=dependent)
  params = club.init_club_estimator(jax.random.PRNGKey(seed), x.shape[1], hidden=32)
  params, _, metrics = _fit(params, _OPT.init(params), x, a)
  return params, x, a, metrics


def test_inner_update_detects_dependence_and_x_steps_reduce_it():
  p_dep, x_dep, a_dep, m_dep = fitted_estimate(1, True)
  p_ind, x_ind, a_ind, _ = fitted_estimate(2, False)
  est_dep = float(club.club_estimate(p_dep, x_dep, a_dep)[0])
  est_ind = float(club.club_estimate(p_ind, x_ind, a_ind)[0])
  assert m_dep["estimator_loss"].shape == (30,)
  assert m_dep["estimator_loss"][-1] < m_dep["estimator_loss"][0]
  assert m_dep["estimator_accuracy"][-1] > 0.8
  # CLUB is an upper bound (a confident q makes the negative term very negative), so only the order is pinned.
  assert est_dep > 0.5, est_dep
  assert abs(est_ind) < 0.1, est_ind
  # Gradient descent on X with psi fixed (what the RM loss does to the representation) lowers the estimate.
  grad_x = jax.jit(jax.grad(lambda xx: club.club_penalty(p_dep, xx, a_dep)[0]))
  x = x_dep
  for _ in range(5):  # the estimate is a mean over pairs, so a per-pair step is N times its gradient
    x = x - 0.5 * x.shape[0] * grad_x(x)
  est_after = float(club.club_estimate(p_dep, x, a_dep)[0])
  assert est_after < est_dep - 0.05, (est_dep, est_after)


def test_inner_update_moves_only_the_estimator(small):
  params, x, a = small
  x = jnp.asarray(x)
  x_before = np.asarray(x).copy()
  opt = club.make_estimator_optimizer()
  new_params, state, metrics = club.inner_update(params, opt.init(params), x, a, opt, 5)
  np.testing.assert_array_equal(np.asarray(x), x_before)
  assert metrics["estimator_loss"].shape == (5,)
  assert int(state[0].count) == 5
  assert any(float(jnp.abs(new_params[k] - params[k]).max()) > 0 for k in params)
  # Nothing flows back to X through the K-step update.
  gx = jax.grad(lambda xx: sum(jnp.sum(v) for v in jax.tree_util.tree_leaves(
      club.inner_update(params, opt.init(params), xx, a, opt, 3)[0])))(x)
  np.testing.assert_array_equal(gx, 0.0)
  # Same as K explicit optax steps.
  @jax.jit
  def one_step(p, s):
    u, s = opt.update(jax.grad(lambda q: club.club_estimator_loss(q, x, a)[0])(p), s, p)
    return optax.apply_updates(p, u), s

  p, s = params, opt.init(params)
  for _ in range(5):
    p, s = one_step(p, s)
  for k in params:
    np.testing.assert_allclose(new_params[k], p[k], rtol=1e-5, atol=1e-7)


def test_input_modes_and_length_label():
  hc = jnp.ones((3, 4))
  hr = jnp.arange(12.0).reshape(3, 4)
  np.testing.assert_array_equal(club.club_input(hc, hr), hc - hr)
  np.testing.assert_array_equal(club.club_input(hc, hr, "concat"), np.concatenate([hc, hr], -1))
  assert club.club_input_dim(4, "concat") == 8 and club.club_input_dim(4) == 4
  with pytest.raises(ValueError, match="concat"):
    club.club_input(hc, hr, "sum")
  np.testing.assert_array_equal(club.length_bias_label(np.array([5, 3, 4]), np.array([4, 3, 9])), [1, 0, 0])


def test_bf16_input_runs_in_float32(small):
  params, x, a = small
  est, _ = club.club_estimate(params, jnp.asarray(x, jnp.bfloat16), a)
  assert est.dtype == jnp.float32
  np.testing.assert_allclose(est, numpy_club(params, np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), a),
                             rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ properties

_Q3 = club.init_club_estimator(jax.random.PRNGKey(7), 3, n_classes=3, hidden=8)
_club_vg = jax.jit(jax.value_and_grad(lambda x, a, w: club.club_estimate(_Q3, x, a, w)[0]))
_club_q_loss = jax.jit(lambda x, a, w: club.club_estimator_loss(_Q3, x, a, w)[0])


def _log_q_size(x):
  """max |logit| of q(. | X) in float64: the float32 rounding of log q is a few ulps of it."""
  p = {k: np.asarray(v, np.float64) for k, v in _Q3.items()}
  return float(np.abs(np.maximum(np.asarray(x, np.float64) @ p["w1"] + p["b1"], 0.0) @ p["w2"] + p["b2"]).max())


@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e2, 1e4]),
       a=st.lists(st.integers(0, 2), min_size=6, max_size=6),
       weights=st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=6, max_size=6))
def test_property_estimate_matches_numpy_with_padding_pairs(seed, scale, a, weights):
  """I_club and the estimator loss (float32, 3 classes) equal the float64 double sum for |X| up to 1e4 and any
  zero-weight (padding) pairs: those get exactly zero gradient; all pairs padding: estimate 0, gradient 0."""
  x = (np.random.default_rng(seed).normal(size=(6, 3)) * scale).astype(np.float32)
  a, w = np.array(a, np.int32), np.array(weights, np.float32)
  (est, gx), q_loss = jax.device_get((_club_vg(x, a, w), _club_q_loss(x, a, w)))
  assert np.all(np.isfinite(gx))
  np.testing.assert_array_equal(gx[w == 0], 0.0)
  if w.sum() == 0:
    assert float(est) == 0.0 and float(q_loss) == 0.0
    np.testing.assert_array_equal(gx, 0.0)
    return
  tol = 1e-5 * (1.0 + _log_q_size(x))
  np.testing.assert_allclose(est, numpy_club(_Q3, x, a, w), rtol=1e-5, atol=tol)
  lq = numpy_log_q(_Q3, x)[np.arange(6), a]
  np.testing.assert_allclose(q_loss, -(w * lq).sum() / w.sum(), rtol=1e-5, atol=tol)


@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e2, 1e4]), label=st.integers(0, 2),
       weights=st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=6, max_size=6))
def test_property_one_label_gives_zero_estimate_and_gradient(seed, scale, label, weights):
  """Degenerate labels (every a_i equal: A carries no information) give I_club = 0 and d I_club / d X = 0 for any
  X up to 1e4: the positive and negative terms are the same mean (p_hat is one-hot)."""
  x = (np.random.default_rng(seed).normal(size=(6, 3)) * scale).astype(np.float32)
  a, w = np.full(6, label, np.int32), np.array(weights, np.float32)
  est, gx = jax.device_get(_club_vg(x, a, w))
  size = 1.0 + _log_q_size(x)
  assert abs(float(est)) <= 1e-6 * size, (float(est), size)
  np.testing.assert_allclose(gx, 0.0, atol=1e-6 * size / max(w.sum(), 1.0))
