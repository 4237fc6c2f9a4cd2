"""CISPO, GPPO, TOPR (jaxpt.losses.policy) and BNPO (jaxpt.losses.advantages) against float64 NumPy statements of
their papers' equations: values, gradients by central finite differences, the clip bounds hit exactly, empty rows,
equal rewards, and hypothesis properties (the `ci` profile: 1000 examples per property, each property drawing the
loss among the three, so >= 1000 examples per loss over the file).

A stop-gradient sg[x] in an equation is a constant of the point where the gradient is taken: each NumPy statement
takes `at` (the log-probs of that point) for everything under sg[.], and the finite differences move only the
other argument, so they measure exactly the gradient the paper prescribes (not the derivative of the value, which
for CISPO / TOPR / GPPO's clipped tokens is not what they train with).
"""

from math import lgamma

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from jaxpt.losses import get_loss, known_losses
from jaxpt.losses import grpo as G
from jaxpt.losses import policy as P
from jaxpt.losses.advantages import bnpo_advantages
from tests.finite_differences import finite_diff
from tests.test_losses_grpo import (B, MODES, S, _advantages, _grad_fn, check_against_statement, gapped_batch,
                                    np_agg, np_bnpo, np_kl, np_weights, random_batch)

NAMES = ("cispo", "gppo", "topr")
DEFAULTS = {"cispo": dict(eps_lo=1.0, eps_hi=0.28), "gppo": dict(eps_lo=0.2, eps_hi=0.28, beta1=1.0, beta2=1.0,
                                                                   c=None), "topr": {}}


# ------------------------------------------------------------------ numpy statements (float64)

def np_ratio(lp, old):
  return np.exp(np.clip(np.asarray(lp, np.float64) - old, -20, 20))


def np_cispo_tokens(lp, at, old, adv, m, eps_lo=1.0, eps_hi=0.28):
  """MiniMax-M1: l_t = -sg(clip(r_t, 1 - eps_lo, 1 + eps_hi)) A log pi_t."""
  w = np.clip(np_ratio(at, old), 1 - eps_lo, 1 + eps_hi)
  return -w * np.asarray(adv, np.float64)[:, None] * lp


def np_gppo_tokens(lp, at, old, adv, m, eps_lo=0.2, eps_hi=0.28, beta1=1.0, beta2=1.0, c=None):
  """Klear-Reasoner as its official compute_gppo_loss_general_beta computes it (Kwai-Klear/KlearReasoner,
  verl/trainer/ppo/core_algos.py): three cases by the detached ratio, -b1 (1-eps_l) r / sg(r) A where A < 0 and
  r < 1-eps_l, -b2 (1+eps_h) r / sg(r) A where A > 0 and r > 1+eps_h, else -r A; then min with -A c where A < 0."""
  a = np.asarray(adv, np.float64)[:, None] * np.ones_like(np.asarray(lp, np.float64))
  r, r_at = np_ratio(lp, old), np_ratio(at, old)
  s = np.exp(np.asarray(lp, np.float64) - at)                       # r / sg(r)
  above, below = (a > 0) & (r_at > 1 + eps_hi), (a < 0) & (r_at < 1 - eps_lo)
  scaled = lambda ratio, s: -a * np.where(above, beta2 * (1 + eps_hi) * s, np.where(below, beta1 * (1 - eps_lo) * s,
                                                                                      ratio))
  l = scaled(r, s)
  if c is not None:   # which tokens are dual-clipped is decided at `at` (a constant of the point)
    l = np.where((a < 0) & (scaled(r_at, 1.0) > -a * c), -a * c, l)
  return l


def np_topr_tokens(lp, at, old, adv, m):
  """TOPR: -A log pi(tau) for A >= 0; -sg(min(pi(tau)/mu(tau), 1)) A log pi(tau) for A < 0 (sequence ratio)."""
  a = np.asarray(adv, np.float64)[:, None]
  seq_ratio = np.exp(np.minimum(((np.asarray(at, np.float64) - old) * m).sum(-1, keepdims=True), 0.0))
  return -np.where(a < 0, seq_ratio, 1.0) * a * lp


NP_TOKENS = {"cispo": np_cispo_tokens, "gppo": np_gppo_tokens, "topr": np_topr_tokens}


def np_loss(name, lp, at, old, adv, m, mode, ref=None, kl_coef=0.0, kl_kind="k3", ent=None, ent_coef=0.0, **kw):
  lp = np.where(m != 0, lp, 0.0)
  loss = np_agg(NP_TOKENS[name](lp, at, old, adv, m, **kw), m, mode)
  if ref is not None:
    loss += kl_coef * np_agg(np_kl(lp, ref, kl_kind), m, mode)
  if ent is not None:
    loss -= ent_coef * np_agg(ent, m, mode)
  return loss


def jax_kwargs(name, **kw):
  """DEFAULTS' knobs under the loss's own names (c -> dual_clip_c)."""
  kw = {**DEFAULTS[name], **kw}
  if "c" in kw:
    kw["dual_clip_c"] = kw.pop("c")
  return kw


# ------------------------------------------------------------------ values and gradients

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_value_and_gradient_match_the_numpy_statement(name, mode):
  """Value (with KL and entropy terms) against the float64 statement, gradient against its central differences."""
  logp, old, ref, adv, mask = random_batch(17, scale=0.4)
  mask[2] = 0.0
  ent = np.abs(np.random.default_rng(2).normal(size=logp.shape)).astype(np.float32)
  kw = dict(ref_logp=ref, kl_coef=0.05, kl_kind="k3", entropy=ent, entropy_coef=0.01, agg=mode)
  fn = lambda lp: get_loss("policy", name)(lp, old, adv, mask, **kw, **jax_kwargs(name))
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
  x = logp.astype(np.float64)
  ref_kw = dict(ref=ref, kl_coef=0.05, ent=ent, ent_coef=0.01, **DEFAULTS[name])
  want = np_loss(name, x, x, old, adv, mask, mode, **ref_kw)
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  fd = finite_diff(lambda z: np_loss(name, z, x, old, adv, mask, mode, **ref_kw), x)
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-7)
  assert np.all(np.asarray(grad)[mask == 0] == 0.0)
  np.testing.assert_allclose(metrics["pg_loss"], np_loss(name, x, x, old, adv, mask, mode, **DEFAULTS[name]),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c", [None, 2.0])
@pytest.mark.parametrize("beta1,beta2", [(1.0, 1.0), (0.25, 1.0)])
def test_gppo_general_form_and_dual_clip(c, beta1, beta2):
  logp, old, _, adv, mask = random_batch(5, scale=1.0)
  fn = lambda lp: P.gppo_loss(lp, old, adv, mask, eps_lo=0.2, eps_hi=0.28, beta1=beta1, beta2=beta2, dual_clip_c=c)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
  x = logp.astype(np.float64)
  kw = dict(eps_lo=0.2, eps_hi=0.28, beta1=beta1, beta2=beta2, c=c)
  np.testing.assert_allclose(loss, np_loss("gppo", x, x, old, adv, mask, "token-mean", **kw), rtol=1e-5, atol=1e-6)
  fd = finite_diff(lambda z: np_loss("gppo", z, x, old, adv, mask, "token-mean", **kw), x)
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-7)
  assert 0 < float(metrics["clip_frac"]) < 1
  with pytest.raises(ValueError, match="dual_clip_c"):
    P.gppo_loss(logp, old, adv, mask, dual_clip_c=1.0)


def test_gppo_value_is_ppo_clip_and_clipped_tokens_keep_a_bounded_gradient():
  """beta1 = beta2 = 1: the value is ppo_clip's (clip-higher, same dual clip); where ppo_clip's gradient is 0 on
  a clipped token, GPPO's is -A (1 + eps_hi) above and -A (1 - eps_lo) below (times agg's weight)."""
  logp, old, _, adv, mask = random_batch(9, scale=1.0)
  for c in (None, 3.0):
    kw = dict(eps_lo=0.2, eps_hi=0.28, dual_clip_c=c)
    (gl, gm), gg = jax.value_and_grad(lambda lp: P.gppo_loss(lp, old, adv, mask, **kw), has_aux=True)(logp)
    (pl, pm), pg = jax.value_and_grad(lambda lp: G.ppo_clip_loss(lp, old, adv, mask, **kw), has_aux=True)(logp)
    np.testing.assert_allclose(gl, pl, rtol=1e-6)
    np.testing.assert_allclose(gm["clip_frac"], pm["clip_frac"])
    rho, a = np_ratio(logp, old), adv[:, None] * np.ones_like(logp)
    above, below = (a > 0) & (rho > 1.28), (a < 0) & (rho < 0.8)
    w = np_weights(mask, "token-mean")
    np.testing.assert_allclose(np.asarray(gg)[above], (-a * 1.28 * w)[above], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gg)[below], (-a * 0.8 * w)[below], rtol=1e-5)
    assert np.all(np.asarray(pg)[(above | below) & (mask > 0)] == 0.0) and np.any((above | below) & (mask > 0))


# ------------------------------------------------------------------ clip bounds exactly

def _at_bound(d):
  """(log-ratio d as float32, the ratio exp(d) as float32 computes it, as a Python float)."""
  d = np.float32(d)
  return d, float(jnp.exp(jnp.float32(d)))


def test_ratio_exactly_at_the_clip_bounds():
  """One token per row, the ratio equal to 1 + eps_hi or 1 - eps_lo to the bit: CISPO's weight is the ratio
  (not clipped), GPPO's token counts as unclipped with the full gradient -A rho (both sides of the bound agree:
  no 0.5 / 0.5 split of a tie), and GPPO's dual clip at rho = c exactly keeps the gradient -A c."""
  (d_hi, r_hi), (d_lo, r_lo), (d_c, r_c) = _at_bound(0.25), _at_bound(-0.3), _at_bound(1.1)
  eps_hi, eps_lo, c = r_hi - 1.0, 1.0 - r_lo, r_c
  logp = np.array([[d_hi], [d_lo], [d_hi], [d_lo], [d_c]], np.float32)
  old, mask = np.zeros_like(logp), np.ones_like(logp)
  adv = np.array([1.5, -2.0, -1.0, 1.0, -0.5], np.float32)
  rho = np.array([r_hi, r_lo, r_hi, r_lo, r_c])
  for name, kw in (("cispo", dict(eps_lo=eps_lo, eps_hi=eps_hi)), ("gppo", dict(eps_lo=eps_lo, eps_hi=eps_hi,
                                                                                 dual_clip_c=c))):
    fn = lambda lp: get_loss("policy", name)(lp, old, adv, mask, **kw)
    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
    w = np.minimum(rho, r_hi) if name == "cispo" else rho   # CISPO caps row 4's ratio c > 1 + eps_hi
    np.testing.assert_allclose(grad[:, 0], -adv * w / 5, rtol=1e-6, err_msg=name)
    assert float(metrics["clip_frac"]) == (np.float32(0.2) if name == "cispo" else 0.0), name
    want = (-adv * w * logp[:, 0]) if name == "cispo" else (-adv * rho)
    np.testing.assert_allclose(loss, want.mean(), rtol=1e-6, err_msg=name)
  assert float(P.gppo_loss(logp, old, adv, mask, eps_lo=eps_lo, eps_hi=eps_hi, dual_clip_c=c)[1]["clip_frac_dual"]
               ) == 0.0
  # Just past the bounds: CISPO caps the weight, GPPO's gradient is the bound's, both still nonzero
  past = logp + np.array([[1e-3], [-1e-3], [0], [0], [0]], np.float32)
  g_cispo = jax.grad(lambda lp: P.cispo_loss(lp, old, adv, mask, eps_lo=eps_lo, eps_hi=eps_hi)[0])(past)
  g_gppo = jax.grad(lambda lp: P.gppo_loss(lp, old, adv, mask, eps_lo=eps_lo, eps_hi=eps_hi)[0])(past)
  for g in (g_cispo, g_gppo):
    np.testing.assert_allclose(g[:2, 0], -adv[:2] * np.array([r_hi, r_lo]) / 5, rtol=1e-6)


def test_topr_sequence_ratio_at_one_and_either_side():
  """TOPR's taper is on the SEQUENCE ratio: at pi/mu = 1 (on-policy) and above it every weight is 1 (REINFORCE);
  below it, negative sequences are weighted by the ratio, positive ones are not."""
  logp = np.array([[-1.0, -2.0, 0.0], [-1.0, -2.0, 0.0], [-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5]], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]], np.float32)
  adv = np.array([-1.0, 2.0, -1.0, 2.0], np.float32)
  for shift, want_w in ((0.0, 1.0), (0.3, 1.0), (-0.3, np.exp(-0.3))):   # old = logp - shift per token ...
    old = logp - np.float32(shift / 2)   # ... over 2 tokens: sequence log-ratio `shift` on rows 0 and 1
    old[2:] = logp[2:]
    fn = lambda lp: P.topr_loss(lp, old, adv, mask, agg="seq-mean-token-sum")
    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
    w = np.array([want_w, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(grad, -(w * adv)[:, None] * mask / 4, rtol=1e-5)
    np.testing.assert_allclose(loss, -(w * adv * (logp * mask).sum(-1)).mean(), rtol=1e-5)
    assert float(metrics["clip_frac"]) == (pytest.approx(2 / 10) if shift < 0 else 0.0)


# ------------------------------------------------------------------ registry, BNPO

def test_registry_and_trainer_names():
  assert {"ppo_clip", "gspo", "cispo", "gppo", "topr"} <= set(known_losses("policy"))
  assert get_loss("policy", "cispo") is P.cispo_loss and get_loss("policy", "topr") is P.topr_loss
  assert G.ADVANTAGES.get("bnpo") is bnpo_advantages


def test_bnpo_hand_computed():
  """Groups p = 1/4, 3/4, 0: m = 1/3, v = 7/48, a + b = m (1 - m) / v - 1 = 11/21, alpha = 1 + 11/189,
  beta = 1 + 22/189; the all-0 group gets 0."""
  r = np.array([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0], np.float32)
  alpha, beta = 1 + 11 / 189, 1 + 22 / 189
  density = lambda p: np.exp((alpha - 1) * np.log(p) + (beta - 1) * np.log1p(-p) - lgamma(alpha) - lgamma(beta)
                             + lgamma(alpha + beta))
  want = np.r_[(r[:4] - 0.25) / density(0.25), (r[4:8] - 0.75) / density(0.75), np.zeros(4)]
  np.testing.assert_allclose(bnpo_advantages(r, 4), want, rtol=1e-5)
  np.testing.assert_allclose(bnpo_advantages(r, 4), np_bnpo(r, 4), rtol=1e-5)
  # r_min / r_max map rewards to [0, 1] first: {-1, 1} rewards give the same as {0, 1}, times 1
  np.testing.assert_allclose(bnpo_advantages(2 * r - 1, 4, r_min=-1.0, r_max=1.0), want, rtol=1e-5)


def test_bnpo_conventions():
  """One group: alpha = beta = 1 (the official code's m = 0, v = 1), A = R - p; every group the same p (v = 0):
  alpha = beta = 1 too; singleton groups: p = 0, A = R; all-equal rewards: 0."""
  r = np.array([1, 0, 1, 1], np.float32)
  np.testing.assert_allclose(bnpo_advantages(r, 4), r - 0.75, rtol=1e-6)
  same_p = np.array([1, 0, 0, 1, 0, 1, 1, 0], np.float32)
  np.testing.assert_allclose(bnpo_advantages(same_p, 2), same_p - 0.5, rtol=1e-6)
  np.testing.assert_allclose(bnpo_advantages(r, 1), r, rtol=1e-6)
  for value in (0.0, 1.0, 0.5):
    np.testing.assert_array_equal(bnpo_advantages(np.full(8, value, np.float32), 4), 0.0)


# ------------------------------------------------------------------ properties

@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(NAMES), mode=st.sampled_from(MODES),
       kl_kind=st.sampled_from([None, "k1", "k2", "k3"]), gap=st.sampled_from([1e-3, 0.3, 3.0, 30.0, 1e3]),
       masked=st.lists(st.booleans(), min_size=B, max_size=B))
def test_property_matches_numpy_statement(seed, name, mode, kl_kind, gap, masked):
  """Loss and pg_loss (float32) equal the float64 statements at log-prob gaps up to 1e3 (past the +-20 clip) with
  any set of empty rows (all of them: loss 0); the gradient equals the statement's analytic one per token (the
  finite-difference test above checks those), finite, exactly 0 off the mask."""
  event(f"loss={name}")   # --hypothesis-show-statistics: the examples per loss
  logp, old, ref, adv, mask = gapped_batch(seed, gap, masked)
  (loss, metrics), grad = _grad_fn(name, mode, kl_kind)(logp, old, adv, mask, ref)
  x = logp.astype(np.float64)
  pg = NP_TOKENS[name](np.where(mask != 0, x, 0.0), x, old, adv, mask, **DEFAULTS[name])
  check_against_statement(loss, metrics, pg, np.where(mask != 0, x, 0.0), ref, mask, mode, kl_kind)
  g = np.asarray(grad)
  assert np.all(np.isfinite(g)) and all(np.isfinite(v) for v in metrics.values())
  np.testing.assert_array_equal(g[mask == 0], 0.0)
  if not mask.any():
    assert float(loss) == 0.0
  if kl_kind is None:   # the per-token gradient weight the paper prescribes, times agg's weights
    a = adv[:, None].astype(np.float64) * np.ones_like(x)
    if name == "cispo":
      weight = np.clip(np_ratio(x, old), 0.0, 1.28)
    elif name == "topr":
      weight = np.where(a < 0, np.exp(np.minimum(((x - old) * mask).sum(-1, keepdims=True), 0.0)), 1.0)
    else:   # the unclipped branch's rho has no gradient past the +-20 log-ratio clip; the bounded branches do
      r = np_ratio(x, old)
      above, below = (a > 0) & (r > 1.28), (a < 0) & (r < 0.8)
      weight = np.where(above, 1.28, np.where(below, 0.8, np.where(np.abs(x - old) > 20, 0.0, r)))
    np.testing.assert_allclose(g, -a * weight * np_weights(mask, mode), rtol=2e-4, atol=1e-7)


@given(seed=st.integers(0, 2**31 - 1), value=st.floats(-5, 5), gs=st.sampled_from([2, 4]),
       kind=st.sampled_from(sorted(G.ADVANTAGES)), name=st.sampled_from(NAMES), mode=st.sampled_from(MODES))
def test_property_equal_rewards_zero_advantage_zero_loss(seed, value, gs, kind, name, mode):
  event(f"loss={name}")
  adv = _advantages(np.full((B,), value, np.float32), gs, kind)
  np.testing.assert_array_equal(adv, 0.0)
  logp, old, ref, _, mask = random_batch(seed, B, S, scale=3.0)
  (loss, _), grad = _grad_fn(name, mode)(logp, old, np.asarray(adv), mask, ref)
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(NAMES), mode=st.sampled_from(MODES),
       kl_kind=st.sampled_from([None, "k1", "k3"]),
       garbage=st.sampled_from([0.0, 1e4, -1e4, -np.inf, np.inf, np.nan]))
def test_property_empty_rows_and_masked_positions_contribute_nothing(seed, name, mode, kl_kind, garbage):
  """Fully masked rows (any advantage) and masked positions holding anything (-inf, nan) change neither the loss
  nor the other rows' gradients, and get exactly zero gradient."""
  event(f"loss={name}")   # --hypothesis-show-statistics: the examples per loss
  logp, old, ref, adv, mask = random_batch(seed, B, S)
  mask[B // 2:] = 0.0
  (loss_all, _), grad_all = _grad_fn(name, mode, kl_kind)(
      np.where(mask > 0, logp, logp + garbage), np.where(mask > 0, old, old - garbage), adv, mask,
      np.where(mask > 0, ref, ref - garbage))
  keep = slice(0, B // 2)
  pad = lambda x, fill: np.concatenate([x[keep], np.full_like(x[keep], fill)])
  (loss_half, _), grad_half = _grad_fn(name, mode, kl_kind)(
      pad(logp, -1.0), pad(old, -3.0), np.r_[adv[keep], [-7.0] * (B - B // 2)].astype(np.float32),
      pad(mask, 0.0), pad(ref, -2.0))
  assert np.isfinite(loss_all) and np.all(np.isfinite(np.asarray(grad_all)))
  np.testing.assert_allclose(loss_all, loss_half, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(grad_all)[keep], np.asarray(grad_half)[keep], rtol=1e-5, atol=1e-8)
  np.testing.assert_array_equal(np.asarray(grad_all)[B // 2:], 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(NAMES), mode=st.sampled_from(MODES))
def test_property_on_policy_is_reinforce(seed, name, mode):
  """logp == old_logp: every ratio is 1, nothing is clipped or tapered, and each loss's gradient is REINFORCE's
  -A w (w the aggregation weights; CISPO's default eps_hi = 0.28 > 0, so rho = 1 is inside its bounds)."""
  event(f"loss={name}")   # --hypothesis-show-statistics: the examples per loss
  logp, _, ref, adv, mask = random_batch(seed, B, S)
  mask[seed % B] = 0.0
  (_, metrics), grad = _grad_fn(name, mode)(logp, logp, adv, mask, ref)
  np.testing.assert_allclose(grad, -adv[:, None] * np_weights(mask, mode), rtol=1e-5, atol=1e-7)
  assert float(metrics["clip_frac"]) == 0.0
  np.testing.assert_allclose(metrics["approx_kl"], 0.0, atol=1e-7)


_bnpo = jax.jit(bnpo_advantages, static_argnums=1)


@given(ks=st.lists(st.integers(0, 8), min_size=16, max_size=16), gs=st.sampled_from([1, 2, 4, 8, 16]),
       binary=st.booleans(), constant=st.lists(st.booleans(), min_size=16, max_size=16))
def test_property_bnpo_matches_numpy(ks, gs, binary, constant):
  """Rewards in [0, 1] (binary, or k/8), groups of 1-16, some groups all equal: BNPO equals its float64 statement,
  is finite, sums to 0 within every group (one weight per group) and gives exactly 0 to the all-equal groups."""
  r = (np.array(ks) >= 4).astype(np.float64) if binary else np.array(ks) / 8.0
  r = r.reshape(-1, gs)
  degenerate = np.array(constant[:r.shape[0]])
  r[degenerate] = r[degenerate, :1]
  r = r.reshape(-1).astype(np.float32)
  got = np.asarray(_bnpo(r, gs))
  want = np_bnpo(r, gs)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, rtol=5e-4, atol=1e-5 * max(1.0, np.abs(want).max()))
  if gs > 1:
    np.testing.assert_array_equal(got[np.repeat(degenerate, gs)], 0.0)
    np.testing.assert_allclose(got.reshape(-1, gs).sum(1), 0.0, atol=1e-4 * max(1.0, np.abs(want).max()))
