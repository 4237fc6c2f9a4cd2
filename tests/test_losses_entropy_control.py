"""Clip-Cov and KL-Cov (jaxpt.losses.entropy_control) against float64 NumPy statements of the paper's equations
with the official code's conventions: the covariance, the token selections (Clip-Cov's random draw reproduced
from the same key), values, gradients by central finite differences, zero covariance, empty rows, the clip and
covariance bounds hit exactly, and hypothesis properties (the `ci` profile: 1000 examples per property, one
property per loss).

The properties take the selection the JAX code made (`clip_cov_selection`, `kl_cov_selection`), check it against
the float64 covariance (with a tolerance: two covariances a float32 rounding apart may order either way), and state
the loss with it; the deterministic tests compare the selections with NumPy's exactly.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.config import ConfigError
from jaxpt.losses import entropy_control as EC
from jaxpt.losses import get_loss
from jaxpt.losses import grpo as G
from jaxpt.trainers.grpo import GRPOConfig
from tests.finite_differences import finite_diff
from tests.host_copy import on_host
from tests.test_losses_grpo import B, MODES, S, gapped_batch, np_agg, np_kl, np_weights, random_batch

NAMES = ("clip_cov", "kl_cov")


# ------------------------------------------------------------------ numpy statements (float64)

def np_cov(lp, adv, m):
  """cov_t = (logp_t - mean logp)(A_t - mean A), both means over the valid tokens; 0 off the mask."""
  m = np.asarray(m, np.float64)
  lp = np.where(m != 0, np.asarray(lp, np.float64), 0.0)
  a = np.asarray(adv, np.float64)[:, None] * np.ones_like(lp)
  n = max(m.sum(), 1.0)
  cov = (lp - (lp * m).sum() / n) * (a - (a * m).sum() / n)
  return np.where(m != 0, cov, 0.0)


def np_count(n, ratio):
  """The official max(int(ratio N), 1); none when there is no valid token or the ratio is 0."""
  return 0 if n == 0 or ratio == 0 else max(int(ratio * n), 1)


def np_ppo(lp, old, adv, eps_lo, eps_hi):
  rho = np.exp(np.clip(np.asarray(lp, np.float64) - old, -20, 20))
  a = np.asarray(adv, np.float64)[:, None]
  return -a * rho, -a * np.clip(rho, 1 - eps_lo, 1 + eps_hi)


def np_first(order_key, eligible, n):
  """The n eligible positions of smallest order_key (stable: lower row-major index first)."""
  idx = np.flatnonzero(eligible.ravel())
  chosen = idx[np.argsort(order_key.ravel()[idx], kind="stable")][:n]
  out = np.zeros(eligible.size, bool)
  out[chosen] = True
  return out.reshape(eligible.shape)


def np_clip_cov_selection(lp, old, adv, m, key, ratio=0.25, lb=0.0, ub=5.0, eps_lo=0.2, eps_hi=0.2):
  """Candidates: valid, not clipped by PPO (l2 <= l1), lb < cov < ub; drawn: n of them, those of smallest u."""
  l1, l2 = np_ppo(lp, old, adv, eps_lo, eps_hi)
  cov = np_cov(lp, adv, m)
  candidates = (m != 0) & ~(l2 > l1) & (cov > lb) & (cov < ub)
  u = np.asarray(jax.random.uniform(key, np.shape(lp)))   # the draw's randomness: the same key's uniforms
  return np_first(u, candidates, np_count(int(m.sum()), ratio)), candidates


def np_kl_cov_selection(lp, adv, m, ratio=0.25):
  return np_first(-np_cov(lp, adv, m), m != 0, np_count(int(m.sum()), ratio))


def np_clip_cov_tokens(lp, old, adv, drawn, eps_lo=0.2, eps_hi=0.2):
  """l_t = max(-A rho, -A clip(rho, 1 - eps_lo, 1 + eps_hi)), 0 on the drawn tokens."""
  l1, l2 = np_ppo(lp, old, adv, eps_lo, eps_hi)
  return np.where(drawn, 0.0, np.maximum(l1, l2))


def np_kl_cov_tokens(lp, old, adv, top, coef=1.0):
  """l_t = -A rho + coef |logp - old_logp| on the top tokens."""
  d = np.asarray(lp, np.float64) - old
  return -np.asarray(adv, np.float64)[:, None] * np.exp(np.clip(d, -20, 20)) + np.where(top, coef * np.abs(d), 0.0)


def np_loss(tokens, lp, m, mode, ref=None, kl_coef=0.0, kl_kind="k3", ent=None, ent_coef=0.0):
  loss = np_agg(tokens, m, mode)
  if ref is not None:
    loss += kl_coef * np_agg(np_kl(lp, ref, kl_kind), m, mode)
  if ent is not None:
    loss -= ent_coef * np_agg(ent, m, mode)
  return loss


def np_tokens(name, lp, old, adv, sel, **kw):
  return (np_clip_cov_tokens if name == "clip_cov" else np_kl_cov_tokens)(lp, old, adv, sel, **kw)


CLIP_KW = dict(clip_cov_ratio=0.25, clip_cov_lb=0.0, clip_cov_ub=5.0, eps_lo=0.2, eps_hi=0.2)


# ------------------------------------------------------------------ covariance and selections

def test_covariance_hand_computed():
  """Two tokens logp (1, -1), advantages (a, -a): both means 0, cov = a on both; token-weighted means."""
  cov = EC.token_covariance(np.array([[1.0], [-1.0]], np.float32), np.array([3.0, -3.0], np.float32),
                            np.ones((2, 1), np.float32))
  np.testing.assert_array_equal(cov, [[3.0], [3.0]])
  logp, _, _, adv, mask = random_batch(3)
  np.testing.assert_allclose(EC.token_covariance(logp, adv, mask), np_cov(logp, adv, mask), rtol=1e-5, atol=1e-6)
  # the mean of A weighs a row once per valid token: a long row pulls the mean towards its advantage
  cov = EC.token_covariance(np.zeros((2, 3), np.float32) + np.array([[0.0], [3.0]], np.float32),
                            np.array([1.0, 0.0], np.float32), np.array([[1, 1, 1], [1, 0, 0]], np.float32))
  np.testing.assert_allclose(cov, [[-0.75 * 0.25] * 3, [2.25 * -0.75, 0, 0]], rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selections_match_numpy(seed):
  logp, old, _, adv, mask = random_batch(seed, 6, 8, scale=0.3)
  key = jax.random.key(seed)
  drawn, cand = EC.clip_cov_selection(logp, old, adv, mask, key, 0.125, 0.0, 5.0, 0.2, 0.2)
  want_drawn, want_cand = np_clip_cov_selection(logp, old, adv, mask, key, ratio=0.125)
  np.testing.assert_array_equal(cand, want_cand)
  np.testing.assert_array_equal(drawn, want_drawn)
  assert 0 < drawn.sum() < cand.sum()
  np.testing.assert_array_equal(EC.kl_cov_selection(logp, adv, mask, 0.25), np_kl_cov_selection(logp, adv, mask))
  # another key draws another subset of the same candidates, of the same size
  other, _ = EC.clip_cov_selection(logp, old, adv, mask, jax.random.key(seed + 100), 0.125, 0.0, 5.0, 0.2, 0.2)
  assert other.sum() == drawn.sum() and np.all(cand[np.asarray(other)])


def test_selected_counts_follow_the_official_rounding():
  """n = max(int(ratio N), 1): N = 24 valid tokens, ratio 2e-4 -> 1; 0.25 -> 6; 0.3 -> 7; 1 -> all."""
  logp, _, _, adv, _ = random_batch(5, 4, 6)
  mask = np.ones_like(logp)
  for ratio, n in ((2e-4, 1), (0.25, 6), (0.3, 7), (1.0, 24)):
    assert int(EC.kl_cov_selection(logp, adv, mask, ratio).sum()) == n
    drawn, _ = EC.clip_cov_selection(logp, logp, adv, mask, jax.random.key(0), ratio, -1e9, 1e9, 0.2, 0.2)
    assert int(drawn.sum()) == n   # on-policy: every token a candidate


# ------------------------------------------------------------------ values and gradients

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_value_and_gradient_match_the_numpy_statement(name, mode):
  """Value (with KL and entropy terms) against the float64 statement, gradient against its central differences,
  the selection (a constant of the point: decided by the covariance at it) reproduced in NumPy."""
  logp, old, ref, adv, mask = random_batch(17, 4, 6, scale=0.3)
  mask[2] = 0.0
  ent = np.abs(np.random.default_rng(2).normal(size=logp.shape)).astype(np.float32)
  key = jax.random.key(4)
  kw = dict(ref_logp=ref, kl_coef=0.05, kl_kind="k3", entropy=ent, entropy_coef=0.01, agg=mode)
  if name == "clip_cov":
    own, sel = dict(rng=key, **CLIP_KW), np_clip_cov_selection(logp, old, adv, mask, key)[0]
  else:
    own, sel = dict(kl_cov_ratio=0.25, kl_cov_coef=0.5), np_kl_cov_selection(logp, adv, mask)
  assert sel.any()
  fn = lambda lp: get_loss("policy", name)(lp, old, adv, mask, **kw, **own)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
  x = logp.astype(np.float64)
  tok_kw = {} if name == "clip_cov" else dict(coef=0.5)
  statement = lambda z: np_loss(np_tokens(name, np.where(mask != 0, z, 0.0), old, adv, sel, **tok_kw), z, mask,
                                mode, ref=ref, kl_coef=0.05, ent=ent, ent_coef=0.01)
  np.testing.assert_allclose(loss, statement(x), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, finite_diff(statement, x), rtol=1e-4, atol=1e-7)
  assert np.all(np.asarray(grad)[mask == 0] == 0.0)
  np.testing.assert_allclose(metrics["pg_loss"], np_agg(np_tokens(name, x, old, adv, sel, **tok_kw), mask, mode),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["cov_frac"], sel.sum() / mask.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["cov"], np_agg(np_cov(x, adv, mask), mask, "token-mean"), rtol=1e-5, atol=1e-7)
  if name == "clip_cov":   # a drawn token has no policy gradient (its KL term's remains), whatever its covariance
    pg = jax.grad(lambda lp: EC.clip_cov_loss(lp, old, adv, mask, agg=mode, **own)[0])(jnp.asarray(logp))
    l1, l2 = np_ppo(x, old, adv, 0.2, 0.2)
    assert np.all(np.asarray(pg)[sel] == 0.0) and np.all(np.asarray(pg)[(mask != 0) & ~sel & ~(l2 > l1)] != 0.0)


def test_clip_cov_without_a_draw_is_ppo_clip():
  """No token drawn (ratio 0, or a band no covariance reaches): the value and gradient of ppo_clip without dual
  clip, exactly; ratio 0 needs no key."""
  logp, old, _, adv, mask = random_batch(8, scale=1.0)
  ppo = jax.value_and_grad(lambda lp: G.ppo_clip_loss(lp, old, adv, mask, dual_clip_c=None)[0])(logp)
  for kw in (dict(clip_cov_ratio=0.0), dict(rng=jax.random.key(1), clip_cov_lb=100.0, clip_cov_ub=200.0)):
    got = jax.value_and_grad(lambda lp: EC.clip_cov_loss(lp, old, adv, mask, **kw)[0])(logp)
    np.testing.assert_array_equal(got[0], ppo[0])
    np.testing.assert_array_equal(got[1], ppo[1])


def test_argument_errors():
  logp, old, _, adv, mask = random_batch(1)
  with pytest.raises(ValueError, match="rng"):
    EC.clip_cov_loss(logp, old, adv, mask)
  with pytest.raises(ValueError, match="clip_cov_lb"):
    EC.clip_cov_loss(logp, old, adv, mask, rng=jax.random.key(0), clip_cov_lb=2.0, clip_cov_ub=1.0)
  for name, kw in (("clip_cov", dict(clip_cov_ratio=1.5, rng=jax.random.key(0))), ("kl_cov", dict(kl_cov_ratio=-0.1))):
    with pytest.raises(ValueError, match="must be in"):
      get_loss("policy", name)(logp, old, adv, mask, **kw)


# ------------------------------------------------------------------ edge cases

@pytest.mark.parametrize("value", [0.0, 0.7])
def test_equal_advantages_zero_covariance(value):
  """All advantages equal: cov = 0 on every token. Clip-Cov's band (1, 5) holds none: ppo_clip's value; a band
  around 0 makes every unclipped token a candidate. KL-Cov still penalises n tokens, the ties broken by index:
  the first n valid tokens in row-major order (with A = 0 the loss is the penalty alone)."""
  logp, old, _, _, mask = random_batch(6, scale=0.3)
  adv = np.full(B, value, np.float32)
  np.testing.assert_array_equal(EC.token_covariance(logp, adv, mask), 0.0)
  key = jax.random.key(2)
  (loss, metrics) = EC.clip_cov_loss(logp, old, adv, mask, rng=key)
  assert float(metrics["cov_frac"]) == 0.0 and float(metrics["cov_candidates"]) == 0.0
  np.testing.assert_array_equal(loss, G.ppo_clip_loss(logp, old, adv, mask, dual_clip_c=None)[0])
  drawn, cand = EC.clip_cov_selection(logp, old, adv, mask, key, 0.25, -1.0, 1.0, 0.2, 0.2)
  l1, l2 = np_ppo(logp, old, adv, 0.2, 0.2)
  np.testing.assert_array_equal(cand, (mask != 0) & ~(l2 > l1))
  assert int(drawn.sum()) == min(int(0.25 * mask.sum()), int(cand.sum()))
  top = EC.kl_cov_selection(logp, adv, mask, 0.25)
  first = np.zeros(mask.size, bool)
  first[np.flatnonzero(mask.ravel())[:int(0.25 * mask.sum())]] = True
  np.testing.assert_array_equal(top, first.reshape(mask.shape))
  loss, _ = EC.kl_cov_loss(logp, old, adv, mask, kl_cov_ratio=0.25)
  want = np_agg(np_kl_cov_tokens(logp, old, adv, first.reshape(mask.shape)), mask, "token-mean")
  np.testing.assert_allclose(loss, want, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_empty_rows_and_an_empty_batch(name):
  """Fully masked rows (holding -inf / nan, any advantage) change neither the covariance, the selection, the loss
  nor the other rows' gradients; an all-masked batch: loss 0, gradient 0, nothing selected, finite metrics."""
  logp, old, _, adv, mask = random_batch(11, scale=0.3)
  kw = dict(rng=jax.random.key(5), **CLIP_KW) if name == "clip_cov" else dict(kl_cov_ratio=0.25)
  fn = jax.value_and_grad(lambda lp, old, adv, m: get_loss("policy", name)(lp, old, adv, m, **kw), has_aux=True)
  empty = mask.copy()
  empty[1] = 0.0
  (clean, _), g_clean = fn(logp, old, adv, empty)
  dirty_lp, dirty_old, dirty_adv = logp.copy(), old.copy(), adv.copy()
  dirty_lp[1], dirty_old[1], dirty_adv[1] = -np.inf, np.nan, 1e6
  (dirty, _), g_dirty = fn(dirty_lp, dirty_old, dirty_adv, empty)
  np.testing.assert_array_equal(dirty, clean)
  np.testing.assert_array_equal(g_dirty, g_clean)
  assert np.all(np.asarray(g_dirty)[1] == 0.0)
  (loss, metrics), grad = fn(logp, old, adv, np.zeros_like(mask))
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
  assert float(metrics["cov_frac"]) == 0.0 and all(np.isfinite(float(v)) for v in metrics.values())


def _at_bound(d):
  d = np.float32(d)
  return d, float(jnp.exp(jnp.float32(d)))


def test_clip_cov_bounds_exactly():
  """A ratio exactly at 1 + eps_hi (A > 0) or 1 - eps_lo (A < 0) is not clipped by PPO (strict l2 > l1, as the
  official code): the token is a candidate, and with ratio 1 it is drawn (zero gradient); just past the bound it is
  PPO-clipped, never a candidate, and keeps the clipped value -A (1 + eps_hi). The covariance band is open: a token
  of covariance exactly lb or ub is not a candidate."""
  (d_hi, r_hi), (d_lo, r_lo) = _at_bound(0.25), _at_bound(-0.3)
  eps_hi, eps_lo = r_hi - 1.0, 1.0 - r_lo
  logp = np.array([[d_hi], [d_lo], [d_hi + np.float32(1e-3)], [d_lo - np.float32(1e-3)]], np.float32)
  old, mask = np.zeros_like(logp), np.ones_like(logp)
  adv = np.array([1.5, -2.0, 1.5, -2.0], np.float32)
  kw = dict(rng=jax.random.key(0), clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9, eps_lo=eps_lo,
            eps_hi=eps_hi)
  drawn, cand = EC.clip_cov_selection(logp, old, adv, mask, kw["rng"], 1.0, -1e9, 1e9, eps_lo, eps_hi)
  np.testing.assert_array_equal(cand[:, 0], [True, True, False, False])
  np.testing.assert_array_equal(drawn, cand)
  (loss, metrics), grad = jax.value_and_grad(lambda lp: EC.clip_cov_loss(lp, old, adv, mask, **kw),
                                             has_aux=True)(logp)
  np.testing.assert_array_equal(grad, 0.0)
  np.testing.assert_allclose(loss, (-1.5 * r_hi + 2.0 * r_lo) / 4, rtol=1e-6)
  assert float(metrics["clip_frac"]) == 1.0 and float(metrics["cov_frac"]) == 0.5
  # the open band: two tokens of covariance exactly 1 and 5 (logp +-1, A +-1 or +-5, means 0)
  lp2, m2 = np.array([[1.0], [-1.0]], np.float32), np.ones((2, 1), np.float32)
  for a, lb, ub in ((1.0, 1.0, 5.0), (5.0, 1.0, 5.0), (1.0, 0.5, 5.0)):
    adv2 = np.array([a, -a], np.float32)
    _, cand = EC.clip_cov_selection(lp2, lp2, adv2, m2, jax.random.key(0), 1.0, lb, ub, 0.2, 0.2)
    assert bool(cand.all()) == (lb < a < ub), (a, lb, ub)


def test_kl_cov_penalty_gradient_is_the_sign_of_the_log_ratio():
  """On-policy (d = 0): the penalty adds nothing, its gradient sign(0) = 0 (torch's abs); off-policy the selected
  tokens' gradient gains coef sign(logp - old_logp) times agg's weight."""
  logp, _, _, adv, mask = random_batch(12, scale=0.3)
  w = np_weights(mask, "token-mean")
  on = jax.grad(lambda lp: EC.kl_cov_loss(lp, logp, adv, mask, kl_cov_ratio=0.25, kl_cov_coef=2.0)[0])(logp)
  np.testing.assert_allclose(on, -adv[:, None] * w, rtol=1e-5, atol=1e-8)
  old = logp + np.where(np.arange(S) % 2 == 0, 0.1, -0.1).astype(np.float32)
  off = jax.grad(lambda lp: EC.kl_cov_loss(lp, old, adv, mask, kl_cov_ratio=0.25, kl_cov_coef=2.0)[0])(logp)
  top = np.asarray(EC.kl_cov_selection(logp, adv, mask, 0.25))
  rho = np.exp(logp.astype(np.float64) - old)
  want = (-adv[:, None] * rho + np.where(top, 2.0 * np.sign(logp - old), 0.0)) * w
  np.testing.assert_allclose(off, want, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------ registry and the trainer's fields

def test_registry_and_trainer_fields():
  assert get_loss("policy", "clip_cov") is EC.clip_cov_loss and get_loss("policy", "kl_cov") is EC.kl_cov_loss
  clip = GRPOConfig(policy_loss="clip_cov", clip_cov_ratio=0.01, clip_cov_lb=0.5).loss_kwargs()
  assert clip["clip_cov_ratio"] == 0.01 and clip["clip_cov_lb"] == 0.5 and clip["eps_hi"] == 0.2
  assert "dual_clip_c" not in clip and "kl_cov_ratio" not in clip and "rng" not in clip
  kl = GRPOConfig(policy_loss="kl_cov", kl_cov_ratio=0.01, kl_cov_coef=0.5).loss_kwargs()
  assert kl["kl_cov_ratio"] == 0.01 and kl["kl_cov_coef"] == 0.5
  assert not {"eps_lo", "eps_hi", "dual_clip_c", "clip_cov_ratio"} & set(kl)
  for bad in (dict(clip_cov_lb=5.0), dict(clip_cov_ratio=2.0), dict(kl_cov_ratio=-1.0), dict(kl_cov_coef=-1.0)):
    with pytest.raises(ConfigError):
      GRPOConfig(policy_loss="clip_cov", **bad).check()


# ------------------------------------------------------------------ properties

RATIOS = (2e-4, 0.125, 0.5)   # dyadic (or tiny): floor(ratio N) the same in float32 and float64 for N <= 24


KL_OPTIONS = (None, "k3")


@functools.lru_cache(maxsize=None)
def _compiled(name, ratio):
  """One compiled function per (loss, ratio): {KL option ("none", "k3"): every aggregation mode's ((loss,
  metrics), grad)} and the selection, all [B, S], in NumPy through one copy (on_host). The key is made inside from
  the seed (op by op it cost as much as the loss); both KL options in one program compile in less time than two."""
  def f(lp, old, adv, mask, ref, seed):
    key = jax.random.key(seed)
    own = dict(rng=key, clip_cov_ratio=ratio, clip_cov_lb=0.0, clip_cov_ub=1.0) if name == "clip_cov" else dict(
        kl_cov_ratio=ratio)
    out = {}
    for kl in KL_OPTIONS:
      for mode in MODES:
        kw = dict(agg=mode) if kl is None else dict(agg=mode, ref_logp=ref, kl_coef=0.1, kl_kind=kl)
        out[kl or "none", mode] = jax.value_and_grad(
            lambda x: get_loss("policy", name)(x, old, adv, mask, **kw, **own), has_aux=True)(lp)
    if name == "clip_cov":
      sel = EC.clip_cov_selection(lp, old, adv, mask, key, ratio, 0.0, 1.0, 0.2, 0.2)
    else:
      sel = (EC.kl_cov_selection(lp, adv, mask, ratio), mask != 0)
    return out, sel
  return on_host(f)


def _check_property(name, seed, ratio, kl, gap, masked, garbage):
  logp, old, ref, adv, mask = gapped_batch(seed, gap, masked)
  adv = (adv * 2).astype(np.float32)   # covariances of order 1: some inside Clip-Cov's band (0, 1), some not
  dirty = lambda x, fill: np.where(mask != 0, x, fill).astype(np.float32)
  out, (sel, cand) = _compiled(name, ratio)(dirty(logp, garbage), dirty(old, -garbage), adv, mask,
                                            dirty(ref, garbage), np.uint32(seed))
  out = {mode: out[kl or "none", mode] for mode in MODES}
  x = np.where(mask != 0, logp.astype(np.float64), 0.0)
  old64 = np.where(mask != 0, old.astype(np.float64), 0.0)
  n_valid = int(mask.sum())
  cov = np_cov(x, adv, mask)
  tol = 1e-5 * max(1.0, np.abs(cov).max())
  # the selection: inside the valid tokens (and the candidates), of the official size, its fraction bounded
  assert not sel[mask == 0].any() and not cand[mask == 0].any()
  assert not (sel & ~cand).any()
  assert sel.sum() == min(np_count(n_valid, ratio), cand.sum())
  assert sel.sum() <= max(1.0, ratio * n_valid)
  if name == "clip_cov":   # candidates: not PPO-clipped, cov in (0, 1) (up to float32 rounding at the edges)
    l1, l2 = np_ppo(x, old64, adv, 0.2, 0.2)
    rho = np.exp(np.clip(x - old64, -20, 20))
    clear = ((np.minimum(np.abs(cov), np.abs(cov - 1.0)) > tol)
             & (np.minimum(np.abs(rho - 1.2), np.abs(rho - 0.8)) > 1e-5))   # rounding can't flip the comparisons
    want = (mask != 0) & ~(l2 > l1) & (cov > 0.0) & (cov < 1.0)
    np.testing.assert_array_equal(cand[clear], want[clear])
  elif sel.any() and (~sel & (mask != 0)).any():   # the top of the covariance order
    assert cov[sel].min() >= cov[~sel & (mask != 0)].max() - tol
  tokens = np_tokens(name, x, old64, adv, sel)
  for mode in MODES:
    (loss, metrics), grad = out[mode]
    g = np.asarray(grad)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(g)) and all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_array_equal(g[mask == 0], 0.0)
    scale = np_agg(np.abs(tokens), mask, mode) + (0.0 if kl is None else 0.1 * np_agg(
        np.abs(np_kl(x, ref, kl)) + 1.0, mask, mode))
    want = np_loss(tokens, x, mask, mode, ref=None if kl is None else ref, kl_coef=0.1, kl_kind=kl or "k3")
    assert abs(float(loss) - want) <= 2e-5 * scale + 1e-7, (mode, float(loss), want)
    assert float(metrics["cov_frac"]) == pytest.approx(sel.sum() / max(n_valid, 1), abs=1e-7)
    if kl is None:   # the analytic per-token gradient, times agg's weights
      a = adv[:, None].astype(np.float64)
      d = x - old64
      rho = np.where(np.abs(d) > 20, 0.0, np.exp(np.clip(d, -20, 20)))   # past the +-20 clip: no gradient
      if name == "clip_cov":
        l1, l2 = np_ppo(x, old64, adv, 0.2, 0.2)
        weight = np.where(sel | (l2 > l1), 0.0, -a * rho)
      else:
        weight = -a * rho + np.where(sel, np.sign(d), 0.0)
      np.testing.assert_allclose(g, weight * np_weights(mask, mode), rtol=2e-4, atol=1e-7)
  if n_valid == 0:
    assert float(out["token-mean"][0][0]) == 0.0


PROPERTY_ARGS = dict(seed=st.integers(0, 2**31 - 1), ratio=st.sampled_from(RATIOS),
                     kl=st.sampled_from(KL_OPTIONS), gap=st.sampled_from([1e-3, 0.3, 3.0, 30.0]),
                     masked=st.lists(st.booleans(), min_size=B, max_size=B),
                     garbage=st.sampled_from([0.0, 1e4, -np.inf, np.nan]))


@given(**PROPERTY_ARGS)
def test_property_clip_cov(seed, ratio, kl, gap, masked, garbage):
  """Clip-Cov at log-prob gaps up to 30 (past the +-20 clip), any set of empty rows, garbage off the mask: the
  drawn tokens are candidates of the official count, the value is the statement's, every drawn or PPO-clipped
  token has zero gradient, the others -A rho, masked positions exactly 0."""
  _check_property("clip_cov", seed, ratio, kl, gap, masked, garbage)


@given(**PROPERTY_ARGS)
def test_property_kl_cov(seed, ratio, kl, gap, masked, garbage):
  """KL-Cov likewise: exactly max(1, floor(ratio N)) tokens, those of the largest covariance, penalised by
  |logp - old_logp|; gradient -A rho + sign(d) on them, -A rho elsewhere, masked positions exactly 0."""
  _check_property("kl_cov", seed, ratio, kl, gap, masked, garbage)
