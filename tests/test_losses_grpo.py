"""GRPO-family losses against plain numpy re-statements of /work/shared/specs/grpo_clipo.md, plus properties."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import get_loss, known_losses
from jaxpt.losses import grpo as G
from tests.host_copy import on_host

MODES = G.AGG_MODES
EPS = 1e-6


# ------------------------------------------------------------------ numpy re-statements of the spec

def np_bnpo(r, gs, r_min=0.0, r_max=1.0, max_weight=1e6):
  """BNPO (jaxpt.losses.advantages): A = clip(1 / Beta(p; alpha, beta) density, 0, max_weight) (s - p), s the
  rewards mapped to [0, 1], p the group mean (0 for G = 1), alpha / beta = max(1 + a/3, 1) / max(1 + b/3, 1) with
  (a, b) the method-of-moments Beta fit of the p's (mean, unbiased var; one group: 0, 1; all p equal: 1, 1)."""
  s = (np.asarray(r, np.float64).reshape(-1, gs) - r_min) / (r_max - r_min)
  p = s.mean(1) if gs > 1 else np.zeros(s.shape[0])
  m, v = (p.mean(), p.var(ddof=1)) if p.size > 1 else (0.0, 1.0)
  k = m * (1 - m) / v - 1 if p.max() > p.min() else 0.0
  alpha, beta = max(1 + k * m / 3, 1.0), max(1 + k * (1 - m) / 3, 1.0)
  log_b = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
  out = np.zeros_like(s)
  for g, pg in enumerate(np.clip(p, 0.0, 1.0)):
    density = pg ** (alpha - 1) * (1 - pg) ** (beta - 1) / math.exp(log_b)   # 0 ** 0 = 1
    out[g] = min(1 / density if density > 0 else np.inf, max_weight) * (s[g] - p[g])
  return out.reshape(-1)


def np_advantages(r, gs, kind):
  if kind == "bnpo":
    return np_bnpo(r, gs)
  r = np.asarray(r, np.float64).reshape(-1, gs)
  out = np.zeros_like(r)
  for g in range(r.shape[0]):
    mean = r[g].mean() if gs > 1 else 0.0
    if kind == "grpo":
      std = r[g].std(ddof=1) if gs > 1 else 1.0
      out[g] = (r[g] - mean) / (std + EPS)
    elif kind in ("drgrpo", "reinforce_pp_baseline"):
      out[g] = r[g] - mean
    elif kind == "rloo":
      out[g] = gs / (gs - 1) * (r[g] - mean) if gs > 1 else r[g]
  out = out.reshape(-1)
  if kind == "reinforce_pp_baseline":
    std = out.std(ddof=1) if out.size > 1 else 1.0
    out = (out - out.mean()) / (std + EPS)
  return out


def np_weights(m, mode, t_max=None):
  """d agg(v) / d v for the four aggregation modes (agg is linear in v)."""
  m = np.asarray(m, np.float64)
  lengths = m.sum(-1)
  n_rows = max((lengths > 0).sum(), 1)
  if mode == "token-mean":
    return m / max(m.sum(), 1)
  if mode == "seq-mean-token-sum":
    return m / n_rows
  if mode == "seq-mean-token-mean":
    return m / np.maximum(lengths, 1)[:, None] / n_rows
  if mode == "seq-mean-token-sum-norm":  # every row counts, empty ones too: B T_max
    return m / (t_max or m.shape[-1]) / m.shape[0]
  raise ValueError(mode)


def np_agg(v, m, mode, t_max=None):
  return float((np.where(m != 0, v, 0.0) * np_weights(m, mode, t_max)).sum())


def np_kl(logp, ref, kind):
  d = np.asarray(logp, np.float64) - ref
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * d**2
  return np.clip(np.exp(-np.clip(d, -20, 20)) + np.clip(d, -20, 20) - 1, -10, 10)


def np_ppo_tokens(logp, old, adv, eps_lo, eps_hi, c):
  delta = np.clip(np.asarray(logp, np.float64) - old, -20, 20)
  rho = np.exp(delta)
  a = np.asarray(adv, np.float64)[:, None]
  l1 = -a * rho
  l2 = -a * np.clip(rho, 1 - eps_lo, 1 + eps_hi)
  l = np.maximum(l1, l2)
  if c is not None:
    l = np.where(a < 0, np.minimum(l, -a * c), l)
  return l, rho


def np_gspo_tokens(logp, old, adv, m, eps_lo, eps_hi):
  delta = np.asarray(logp, np.float64) - old
  s = np.exp(np.clip((delta * m).sum(-1) / np.maximum(m.sum(-1), 1), -20, 20))[:, None] * np.ones_like(delta)
  a = np.asarray(adv, np.float64)[:, None]
  return np.maximum(-a * s, -a * np.clip(s, 1 - eps_lo, 1 + eps_hi)), s


def gapped_batch(seed, gap, masked):
  """random_batch [B, S] with old_logp and ref_logp at gaps ~ N(0, gap^2) from logp and the rows `masked` empty."""
  rng = np.random.default_rng(seed)
  logp, _, _, adv, mask = random_batch(seed, B, S)
  old = (logp + rng.normal(size=logp.shape) * gap).astype(np.float32)
  ref = (logp + rng.normal(size=logp.shape) * gap).astype(np.float32)
  mask[np.array(masked)] = 0.0
  return logp, old, ref, adv, mask


def check_against_statement(loss, metrics, pg, logp, ref, mask, mode, kl_kind, kl_coef=0.1, pg_size=None):
  """loss, metrics["pg_loss"] (and ["kl_ref"]) equal agg of the float64 per-token statements pg and np_kl within
  2e-5 of agg(size), size = the operands' magnitude (|pg|, or `pg_size`; |k1|, k2, exp(-d) + |d| + 1 for k3, whose
  float32 value at d ~ 1e-3 is all cancellation): the float32 rounding of sums of terms of either sign."""
  pg_size = np.abs(pg) if pg_size is None else pg_size
  kl = np.zeros_like(pg) if kl_kind is None else np_kl(logp, ref, kl_kind)
  d = np.clip(np.asarray(logp, np.float64) - ref, -20, 20)
  kl_size = np.abs(kl) if kl_kind != "k3" else np.exp(-d) + np.abs(d) + 1

  def close(got, terms, size):
    want, scale = np_agg(terms, mask, mode), np_agg(size, mask, mode)
    assert abs(float(got) - want) <= 2e-5 * scale + 1e-7, (float(got), want, scale)

  close(metrics["pg_loss"], pg, pg_size)
  close(loss, pg + kl_coef * kl, pg_size + kl_coef * kl_size)
  if kl_kind is not None:
    close(metrics["kl_ref"], kl, kl_size)


def random_batch(seed, b=4, s=6, scale=0.5):
  rng = np.random.default_rng(seed)
  logp = -np.abs(rng.normal(size=(b, s))).astype(np.float32) * 2
  old = (logp + rng.normal(size=(b, s)) * scale).astype(np.float32)
  ref = (logp + rng.normal(size=(b, s)) * scale).astype(np.float32)
  adv = rng.normal(size=(b,)).astype(np.float32)
  mask = (rng.random((b, s)) > 0.3).astype(np.float32)
  mask[:, 0] = 1.0
  return logp, old, ref, adv, mask


# ------------------------------------------------------------------ advantages

def test_advantages_hand_computed():
  r = np.array([1.0, 0, 0, 0, 2, 2, 2, 2], np.float32)
  # group 1: mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5
  np.testing.assert_allclose(G.grpo_advantages(r, 4), [1.5, -.5, -.5, -.5, 0, 0, 0, 0], rtol=1e-5)
  np.testing.assert_allclose(G.drgrpo_advantages(r, 4), [.75, -.25, -.25, -.25, 0, 0, 0, 0], rtol=1e-6)
  # RLOO: R_i - mean of the others: 1 - 0 = 1, 0 - 1/3
  np.testing.assert_allclose(G.rloo_advantages(r, 4), [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0], rtol=1e-6)
  # REINFORCE++-baseline: a = [.75, -.25, -.25, -.25, 0, 0, 0, 0], mean 0, whitened with the unbiased std
  a = np.array([.75, -.25, -.25, -.25, 0, 0, 0, 0])
  np.testing.assert_allclose(G.reinforce_pp_baseline_advantages(r, 4), a / (a.std(ddof=1) + EPS), rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(G.ADVANTAGES))
@pytest.mark.parametrize("gs", [1, 2, 4])
def test_advantages_match_numpy(kind, gs):
  r = np.random.default_rng(gs).normal(size=(8,)).astype(np.float32)
  np.testing.assert_allclose(G.group_advantages(r, gs, kind), np_advantages(r, gs, kind), rtol=1e-5, atol=1e-6)


def test_singleton_group_convention():
  r = np.array([3.0, -1.0], np.float32)
  np.testing.assert_allclose(G.grpo_advantages(r, 1), r / (1 + EPS), rtol=1e-7)
  np.testing.assert_allclose(G.drgrpo_advantages(r, 1), r)
  np.testing.assert_allclose(G.rloo_advantages(r, 1), r)


def test_advantage_errors():
  with pytest.raises(ValueError, match="multiple of group_size"):
    G.grpo_advantages(np.zeros(6), 4)
  with pytest.raises(ValueError, match="flat"):
    G.grpo_advantages(np.zeros((2, 4)), 4)
  with pytest.raises(KeyError, match="rloo"):
    G.group_advantages(np.zeros(4), 2, "nope")


# ------------------------------------------------------------------ aggregation, KL

def test_aggregation_hand_computed():
  v = np.array([[1.0, 2, 3], [4, 0, 0], [9, 9, 9]], np.float32)
  m = np.array([[1.0, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)   # last row all masked: ignored, but counted
  want = {"token-mean": 7 / 3, "seq-mean-token-sum": 3.5, "seq-mean-token-mean": 2.75,  # in B by the -norm mode
          "seq-mean-token-sum-norm": (3 + 4) / (3 * 3)}
  for mode, w in want.items():
    np.testing.assert_allclose(G.aggregate(v, m, mode), w, rtol=1e-6, err_msg=mode)
  np.testing.assert_allclose(G.aggregate(v, m, "seq-mean-token-sum-norm", max_tokens=10), 7 / 30, rtol=1e-6)
  bad = np.where(m > 0, v, np.array([[np.nan], [-np.inf], [np.inf]], np.float32))   # garbage under the mask
  for mode in MODES:
    assert float(G.aggregate(v, np.zeros_like(m), mode)) == 0.0
    np.testing.assert_allclose(G.aggregate(bad, m, mode), want[mode], rtol=1e-6)
  with pytest.raises(ValueError, match="token-mean"):
    G.aggregate(v, m, "sum")


@given(st.data())
def test_micro_batch_aggregates_weighted_by_aggregate_weight_give_the_whole_batchs(data):
  """Gradient accumulation's invariant, with empty rows (overlong filtering zeroes a row's mask): the micro-batches'
  aggregates weighted by `aggregate_weight` average to the whole batch's aggregate, in every mode (the seq-mean modes
  weighted by a micro-batch's shape rows instead over-weight the rows sharing it with an empty one)."""
  mode = data.draw(st.sampled_from(MODES))
  rows, seq, parts = data.draw(st.sampled_from([(4, 3, 2), (6, 2, 3), (8, 4, 4)]))
  values = np.asarray(data.draw(st.lists(st.floats(-10, 10, width=32), min_size=rows * seq, max_size=rows * seq)),
                      np.float32).reshape(rows, seq)
  mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=rows * seq, max_size=rows * seq)),
                    np.float32).reshape(rows, seq)
  whole = float(G.aggregate(values, mask, mode))
  size = rows // parts
  weights = [float(G.aggregate_weight(mask[i:i + size], mode)) for i in range(0, rows, size)]
  pieces = [float(G.aggregate(values[i:i + size], mask[i:i + size], mode)) for i in range(0, rows, size)]
  combined = sum(w * p for w, p in zip(weights, pieces)) / (sum(weights) or 1.0)
  np.testing.assert_allclose(combined, whole, rtol=1e-5, atol=1e-5)


def test_aggregate_weight_counts_tokens_non_empty_rows_or_shape_rows():
  m = np.array([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]], np.float32)
  assert [float(G.aggregate_weight(m, mode)) for mode in MODES] == [
      {"token-mean": 3.0, "seq-mean-token-sum": 2.0, "seq-mean-token-mean": 2.0, "seq-mean-token-sum-norm": 3.0}[mode]
      for mode in MODES]
  with pytest.raises(ValueError, match="token-mean"):
    G.aggregate_weight(m, "sum")


def test_sum_norm_denominator_is_a_constant_of_the_batch_shape():
  """Issue 14 item 5: the weight of every unmasked token is 1 / (B T_max) whatever the number of empty rows (it was
  1 / (T_max * non-empty rows)), so equal micro-batches average to the whole batch's value."""
  v = np.arange(1.0, 13.0, dtype=np.float32).reshape(4, 3)
  grad = jax.jit(jax.grad(lambda x, m: G.aggregate(x, m, "seq-mean-token-sum-norm")))
  masks = [np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], np.float32),   # no empty row
           np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]], np.float32),   # two empty rows
           np.array([[0, 0, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0]], np.float32)]   # three
  for m in masks:
    np.testing.assert_allclose(grad(jnp.asarray(v), m), m / 12.0, rtol=1e-7)
    np.testing.assert_allclose(G.aggregate(v, m, "seq-mean-token-sum-norm"), (v * m).sum() / 12.0, rtol=1e-6)
  m = masks[1]
  halves = [G.aggregate(v[i:i + 2], m[i:i + 2], "seq-mean-token-sum-norm") for i in (0, 2)]   # 1 and 0 empty rows
  np.testing.assert_allclose(np.mean(halves), G.aggregate(v, m, "seq-mean-token-sum-norm"), rtol=1e-6)
  np.testing.assert_allclose(G.aggregate(v, m, "seq-mean-token-sum-norm", max_tokens=8), (v * m).sum() / 32.0,
                             rtol=1e-6)


# value and d / d values in one compiled call, one compile per [rows, cols] (30 shapes; op by op, each of the 1000
# examples dispatched the aggregation and its gradient eagerly)
_sum_norm_value_and_grad = jax.jit(jax.value_and_grad(lambda v, m: G.aggregate(v, m, "seq-mean-token-sum-norm")))


@given(rows=st.integers(1, 6), cols=st.integers(1, 5), empty=st.lists(st.booleans(), min_size=6, max_size=6),
       seed=st.integers(0, 2**16), log_scale=st.floats(-20, 20))
def test_property_sum_norm_weights_ignore_empty_rows(rows, cols, empty, seed, log_scale):
  """Any shape, any set of empty rows (all of them included), values up to 1e20: value and gradient are those of
  sum(v m) / (B T_max), in float64 to float32 rounding."""
  rng = np.random.default_rng(seed)
  v = (rng.normal(size=(rows, cols)) * 10.0 ** log_scale).astype(np.float32)
  m = (rng.random((rows, cols)) < 0.6).astype(np.float32) * ~np.array(empty[:rows])[:, None]
  value, g = jax.device_get(_sum_norm_value_and_grad(v, m))
  want = (v.astype(np.float64) * m).sum() / (rows * cols)
  scale = (np.abs(v.astype(np.float64)) * m).sum() / (rows * cols)
  assert abs(float(value) - want) <= 1e-6 * scale + 1e-30
  np.testing.assert_allclose(g, m / (rows * cols), rtol=1e-7)


def test_kl_estimators_hand_computed_and_numpy():
  logp = np.array([[0.0, -1.0, -2.0, -30.0, 0.0]], np.float32)
  ref = np.array([[0.0, -2.0, -1.0, 0.0, -30.0]], np.float32)      # delta = 0, 1, -1, -30, 30
  np.testing.assert_allclose(G.kl_estimate(logp, ref, "k1"), [[0, 1, -1, -30, 30]])
  np.testing.assert_allclose(G.kl_estimate(logp, ref, "k2"), [[0, .5, .5, 450, 450]])
  k3 = [0, np.exp(-1), np.e - 2, 10, 29]
  np.testing.assert_allclose(G.kl_estimate(logp, ref, "k3"), [[0, k3[1], k3[2], 10, 10]], rtol=1e-6)
  np.testing.assert_allclose(G.kl_estimate(logp, ref, "low_var_kl"), G.kl_estimate(logp, ref, "k3"))
  lp, _, rf, _, _ = random_batch(3, scale=3.0)
  for kind in G.KL_KINDS:
    np.testing.assert_allclose(G.kl_estimate(lp, rf, kind), np_kl(lp, rf, kind), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="k3"):
    G.kl_estimate(logp, ref, "k4")


def test_kl_in_reward():
  logp, _, ref, _, mask = random_batch(4)
  r = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
  for kind in G.KL_KINDS:
    want = r - 0.05 * (np_kl(logp, ref, kind) * mask).sum(-1)
    np.testing.assert_allclose(G.kl_penalized_rewards(r, logp, ref, mask, 0.05, kind), want, rtol=1e-5)
  g = jax.grad(lambda lp: G.kl_penalized_rewards(r, lp, ref, mask, 0.05, "k3").sum())(logp)
  assert np.all(np.asarray(g) == 0.0)   # a reward carries no gradient


def test_entropy_from_logits():
  logits = np.random.default_rng(0).normal(size=(2, 3, 5)) * 2
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(G.entropy_from_logits(logits), -(p * np.log(p)).sum(-1), rtol=1e-5)


# ------------------------------------------------------------------ policy losses

def test_ppo_clip_hand_computed():
  """One token per row: delta = log(rho). Checks value, clipping, dual clip and the per-token gradient."""
  rho = np.array([1.5, 0.5, 4.0, 0.5, 2.0, 1.1], np.float32)
  adv = np.array([1.0, 1.0, -1.0, -1.0, -1.0, 2.0], np.float32)
  old = np.zeros((6, 1), np.float32)
  logp = np.log(rho)[:, None]
  mask = np.ones((6, 1), np.float32)
  # A=1,rho=1.5: max(-1.5,-1.2)=-1.2 clipped | A=1,rho=.5: max(-.5,-.8)=-.5 | A=-1,rho=4: max(4,1.2)=4 -> dual 3
  # A=-1,rho=.5: max(.5,.8)=.8 clipped | A=-1,rho=2: max(2,1.2)=2 (< 3) | A=2,rho=1.1: -2.2
  want_l = np.array([-1.2, -0.5, 3.0, 0.8, 2.0, -2.2])
  want_grad = np.array([0.0, -0.5, 0.0, 0.0, 2.0, -2.2]) / 6   # d l / d logp = -A rho where unclipped
  loss_fn = lambda lp: G.ppo_clip_loss(lp, old, adv, mask, eps_lo=0.2, eps_hi=0.2, dual_clip_c=3.0)
  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logp)
  np.testing.assert_allclose(loss, want_l.mean(), rtol=1e-5)
  np.testing.assert_allclose(grad[:, 0], want_grad, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 6)      # rows 0 and 3; the dual-clip row has l1 > l2
  np.testing.assert_allclose(metrics["clip_frac_dual"], 1 / 6)
  np.testing.assert_allclose(metrics["ratio_mean"], rho.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["approx_kl"], np.mean(rho - 1 - np.log(rho)), rtol=1e-5)
  np.testing.assert_allclose(metrics["ppo_kl"], np.mean(-np.log(rho)), rtol=1e-5)
  np.testing.assert_allclose(metrics["adv_mean"], adv.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["adv_max"], 2.0)
  # clip-higher (DAPO eps_hi 0.28) leaves rho = 1.5 clipped at 1.28; no dual clip: row 2 back to 4
  loss_hi, _ = G.ppo_clip_loss(logp, old, adv, mask, eps_hi=0.28, dual_clip_c=None)
  np.testing.assert_allclose(loss_hi, np.mean([-1.28, -0.5, 4.0, 0.8, 2.0, -2.2]), rtol=1e-5)
  with pytest.raises(ValueError, match="dual_clip_c"):
    G.ppo_clip_loss(logp, old, adv, mask, dual_clip_c=1.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c,eps_lo,eps_hi", [(3.0, 0.2, 0.2), (None, 0.2, 0.28), (2.0, 0.1, 0.3)])
def test_ppo_clip_matches_numpy(mode, c, eps_lo, eps_hi):
  logp, old, ref, adv, mask = random_batch(7)
  mask[2] = 0.0
  ent = np.abs(np.random.default_rng(1).normal(size=logp.shape)).astype(np.float32)
  loss, metrics = G.ppo_clip_loss(logp, old, adv, mask, eps_lo=eps_lo, eps_hi=eps_hi, dual_clip_c=c, agg=mode,
                                  ref_logp=ref, kl_coef=0.04, kl_kind="k3", entropy=ent, entropy_coef=0.01)
  l, rho = np_ppo_tokens(logp, old, adv, eps_lo, eps_hi, c)
  pg = np_agg(l, mask, mode)
  kl = np_agg(np_kl(logp, ref, "k3"), mask, mode)
  ent_agg = np_agg(ent, mask, mode)
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["kl_ref"], kl, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(loss, pg + 0.04 * kl - 0.01 * ent_agg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["entropy"], (ent * mask).sum() / mask.sum(), rtol=1e-5)
  l1 = -adv[:, None] * rho
  l2 = -adv[:, None] * np.clip(rho, 1 - eps_lo, 1 + eps_hi)
  np.testing.assert_allclose(metrics["clip_frac"], ((l2 > l1) * mask).sum() / mask.sum(), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_gspo_matches_numpy(mode):
  logp, old, _, adv, mask = random_batch(11, scale=0.01)
  logp_j = jnp.asarray(logp)
  loss_fn = lambda lp: G.gspo_loss(lp, old, adv, mask, agg=mode)
  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logp_j)
  l, s = np_gspo_tokens(logp, old, adv, mask, 3e-4, 4e-4)
  np.testing.assert_allclose(loss, np_agg(l, mask, mode), rtol=1e-5, atol=1e-7)
  # straight-through: d l_t / d logp_t = -A s_i where the sequence is unclipped, 0 where clipped
  a = adv[:, None]
  clipped = (-a * np.clip(s, 1 - 3e-4, 1 + 4e-4)) > (-a * s)
  want = np.where(clipped, 0.0, -a * s) * np_weights(mask, mode)
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
  assert 0 < float(metrics["seq_clip_frac"]) < 1   # the batch mixes clipped and unclipped sequences
  np.testing.assert_allclose(metrics["ratio_mean"], s[:, 0].mean(), rtol=1e-6)


def test_registry():
  assert get_loss("policy", "ppo_clip") is G.ppo_clip_loss and get_loss("policy", "gspo") is G.gspo_loss
  assert {"ppo_clip", "gspo"} <= set(known_losses("policy"))


# ------------------------------------------------------------------ properties

B, S = 4, 6


KL_OPTIONS = ("none", "k1", "k2", "k3")


@functools.lru_cache(maxsize=None)
def _every_variant(name):
  """One compiled function per loss: {(mode, kl): ((loss, metrics), d loss / d logp)} for every aggregation mode and
  KL option (kl_coef 0.1), all [B, S]. One compile instead of 16 keeps a property's examples cheap; its ~200
  outputs come back in one copy (on_host), and only the variant asked for is cut out of it."""
  def f(lp, old, adv, mask, ref):
    out = {}
    for mode in MODES:
      for kl in KL_OPTIONS:
        kw = dict(agg=mode) if kl == "none" else dict(agg=mode, ref_logp=ref, kl_coef=0.1, kl_kind=kl)
        loss = lambda x: get_loss("policy", name)(x, old, adv, mask, **kw)
        out[mode, kl] = jax.value_and_grad(loss, has_aux=True)(lp)
    return out
  return on_host(f)


def _grad_fn(name, mode, kl_kind=None):
  """(lp, old, adv, mask, ref) -> ((loss, metrics), grad) of `name` with aggregation `mode`, KL term if kl_kind,
  in NumPy."""
  return lambda *args: _every_variant(name)(*args, part=(mode, kl_kind or "none"))


@functools.partial(jax.jit, static_argnums=1)
def _every_advantage(rewards, gs):
  """{kind: group_advantages(rewards, gs, kind)} for every estimator: one compile per group size, not per (size,
  kind) (a compile costs far more than running the five estimators)."""
  return {kind: G.group_advantages(rewards, gs, kind) for kind in G.ADVANTAGES}


def _advantages(rewards, gs, kind):
  return _every_advantage(rewards, gs)[kind]


@given(seed=st.integers(0, 2**31 - 1), value=st.floats(-5, 5), gs=st.sampled_from([2, 4]),
       kind=st.sampled_from(sorted(G.ADVANTAGES)), name=st.sampled_from(["ppo_clip", "gspo"]),
       mode=st.sampled_from(MODES))
def test_property_equal_rewards_zero_advantage_finite_loss(seed, value, gs, kind, name, mode):
  adv = _advantages(np.full((B,), value, np.float32), gs, kind)
  np.testing.assert_array_equal(adv, 0.0)
  logp, old, ref, _, mask = random_batch(seed, B, S, scale=3.0)
  (loss, _), grad = _grad_fn(name, mode)(logp, old, adv, mask, ref)
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["ppo_clip", "gspo"]), mode=st.sampled_from(MODES),
       kl_kind=st.sampled_from([None, "k1", "k2", "k3"]),
       garbage=st.sampled_from([0.0, 1e4, -1e4, -np.inf, np.inf, np.nan]))
def test_property_all_masked_rows_contribute_nothing(seed, name, mode, kl_kind, garbage):
  """All-masked rows (any advantage) and masked positions (any log-probs, even -inf / nan) change neither the
  loss nor the other gradients, and get exactly zero gradient themselves."""
  logp, old, ref, adv, mask = random_batch(seed, B, S)
  mask[B // 2:] = 0.0
  (loss_all, _), grad_all = _grad_fn(name, mode, kl_kind)(
      np.where(mask > 0, logp, logp + garbage), old, adv, mask, np.where(mask > 0, ref, ref - garbage))
  keep = slice(0, B // 2)
  pad = lambda x, fill: np.concatenate([x[keep], np.full_like(x[keep], fill)])   # same shape, no recompile
  (loss_half, _), grad_half = _grad_fn(name, mode, kl_kind)(
      pad(logp, -1.0), pad(old, -3.0), np.r_[adv[keep], [7.0] * (B - B // 2)].astype(np.float32),
      pad(mask, 0.0), pad(ref, -2.0))
  assert np.isfinite(loss_all) and np.all(np.isfinite(np.asarray(grad_all)))
  np.testing.assert_array_equal(np.asarray(grad_all)[mask == 0], 0.0)
  np.testing.assert_allclose(loss_all, loss_half, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(grad_all)[keep], np.asarray(grad_half)[keep], rtol=1e-5, atol=1e-8)
  np.testing.assert_array_equal(np.asarray(grad_all)[B // 2:], 0.0)
  np.testing.assert_array_equal(np.asarray(grad_half)[B // 2:], 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["ppo_clip", "gspo"]), mode=st.sampled_from(MODES))
def test_property_ratio_one_is_plain_policy_gradient(seed, name, mode):
  """logp == old_logp: d loss / d logp_bt = -A_b * w_bt, w = the aggregation weights of `mode`."""
  logp, _, ref, adv, mask = random_batch(seed, B, S)
  mask[seed % B] = 0.0
  (loss, metrics), grad = _grad_fn(name, mode)(logp, logp, adv, mask, ref)
  w = np_weights(mask, mode)
  np.testing.assert_allclose(grad, -adv[:, None] * w, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(loss, (-adv[:, None] * w).sum(), rtol=1e-5, atol=1e-7)
  assert float(metrics["clip_frac"]) == 0.0
  np.testing.assert_allclose(metrics["approx_kl"], 0.0, atol=1e-7)


@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES), scale=st.sampled_from([0.1, 0.5, 2.0]))
def test_property_clipping_stops_gradient_exactly_on_the_clipped_side(seed, mode, scale):
  """PPO (eps 0.2, c 3): zero gradient for A>0, rho>1.2; A<0, rho<0.8; A<0, rho>3; else -A rho w."""
  logp, old, ref, adv, mask = random_batch(seed, B, S, scale=scale)
  (_, _), grad = _grad_fn("ppo_clip", mode)(logp, old, adv, mask, ref)
  rho = np.exp(np.clip(logp.astype(np.float64) - old, -20, 20))
  a = adv[:, None].astype(np.float64) * np.ones_like(rho)
  clipped = ((a > 0) & (rho > 1.2)) | ((a < 0) & (rho < 0.8)) | ((a < 0) & (rho > 3.0))
  near = np.min(np.abs(rho[..., None] - np.array([0.8, 1.2, 3.0])), axis=-1) < 1e-4
  want = np.where(clipped, 0.0, -a * rho) * np_weights(mask, mode)
  g = np.asarray(grad)
  np.testing.assert_array_equal(g[clipped & ~near], 0.0)
  np.testing.assert_allclose(g[~near], want[~near], rtol=1e-4, atol=1e-7)
  # The unclipped side keeps its gradient, however far the ratio moved
  assert np.all(g[(~clipped) & (~near) & (mask > 0) & (np.abs(a) > 1e-3)] != 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["ppo_clip", "gspo"]), mode=st.sampled_from(MODES),
       kl_kind=st.sampled_from(["k1", "k2", "k3"]), big=st.sampled_from([50.0, 1e3, 1e4]))
def test_property_extreme_log_prob_differences_stay_finite(seed, name, mode, kl_kind, big):
  rng = np.random.default_rng(seed)
  logp, old, ref, adv, mask = random_batch(seed, B, S)
  old = (logp + rng.choice([-big, big], size=logp.shape)).astype(np.float32)
  ref = (logp + rng.choice([-big, big], size=logp.shape)).astype(np.float32)
  adv = (adv * big).astype(np.float32)
  (loss, metrics), grad = _grad_fn(name, mode, kl_kind)(logp, old, adv, mask, ref)
  assert np.isfinite(loss) and np.all(np.isfinite(np.asarray(grad)))
  assert all(np.isfinite(v) for v in metrics.values())


@given(ks=st.lists(st.integers(-8, 8), min_size=8, max_size=8), exponent=st.integers(-12, 13),
       constant=st.lists(st.booleans(), min_size=8, max_size=8), gs=st.sampled_from([1, 2, 4, 8]),
       kind=st.sampled_from(sorted(G.ADVANTAGES)))
def test_property_advantages_match_numpy_and_degenerate_groups_get_zero(ks, exponent, constant, gs, kind):
  """Rewards R = k 2^e (k in -8..8, |R| from 2^-12 to 6.6e4; groups of 1-8, some with all-equal rewards): the
  float32 advantages equal the float64 statement, and a degenerate group (all rewards equal, G > 1) gets exactly
  zero advantage from every estimator (k 2^e sums and means over G = 2^j are exact in float32)."""
  r = np.ldexp(np.array(ks, np.float64), exponent).reshape(-1, gs)
  degenerate = np.array(constant[:r.shape[0]])
  r[degenerate] = r[degenerate, :1]
  r = r.reshape(-1).astype(np.float32)
  got = np.asarray(_advantages(r, gs, kind))
  assert np.all(np.isfinite(got))
  if kind != "bnpo":  # rewards far outside [0, 1] are outside BNPO's domain: tests/test_losses_policy.py checks it
    want = np_advantages(r, gs, kind)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  if gs > 1:
    np.testing.assert_array_equal(got[np.repeat(degenerate, gs)], 0.0)


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["ppo_clip", "gspo"]), mode=st.sampled_from(MODES),
       kl_kind=st.sampled_from([None, "k1", "k2", "k3"]), gap=st.sampled_from([1e-3, 0.3, 3.0, 30.0, 1e3, 1e4]),
       masked=st.lists(st.booleans(), min_size=B, max_size=B))
def test_property_matches_numpy_statement_at_any_log_prob_gap(seed, name, mode, kl_kind, gap, masked):
  """Loss, pg_loss and kl_ref (float32) equal the float64 statements (np_ppo_tokens / np_gspo_tokens, np_kl,
  np_agg) for log-prob gaps |logp - old|, |logp - ref| up to 1e4 (far past the +-20 log-ratio clip) and any set
  of fully masked rows (all of them: loss 0); the gradient is finite and exactly 0 off the mask. Tolerance: 2e-5
  of agg(size), size = the per-token operands' magnitude (|l|; |k1|, k2, exp(-d) + |d| + 1 for k3, whose float32
  value at d ~ 1e-3 is all cancellation): the float32 rounding of sums of terms of either sign."""
  logp, old, ref, adv, mask = gapped_batch(seed, gap, masked)
  (loss, metrics), grad = _grad_fn(name, mode, kl_kind)(logp, old, adv, mask, ref)
  pg_size = None
  if name == "ppo_clip":
    pg = np_ppo_tokens(logp, old, adv, 0.2, 0.2, 3.0)[0]
  else:
    pg = np_gspo_tokens(logp, old, adv, mask, 3e-4, 4e-4)[0]
    # GSPO exponentiates the row's mean log-ratio: float32 rounds that mean of terms of size |logp - old| (each
    # difference and each of the S + 1 sums) by up to (S + 1) 2^-24 mean|logp - old|, an error exp turns relative
    gaps = np.abs(np.asarray(logp, np.float64) - old) * mask
    row_gap = gaps.sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True), 1)
    pg_size = np.abs(pg) * (1 + (S + 1) * 2.0 ** -24 * row_gap / 2e-5)
  check_against_statement(loss, metrics, pg, logp, ref, mask, mode, kl_kind, pg_size=pg_size)
  g = np.asarray(grad)
  assert np.all(np.isfinite(g))
  np.testing.assert_array_equal(g[mask == 0], 0.0)
  if not mask.any():
    assert float(loss) == 0.0
