"""PPO's critic pieces (jaxpt.losses.value): KL-shaped per-token rewards, GAE, whitening and the clipped value loss
against float64 NumPy loops, plus properties."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import get_loss, known_losses, loss_kind
from jaxpt.losses import grpo as G
from jaxpt.losses import value as V
from tests.finite_differences import finite_diff


# ------------------------------------------------------------------ NumPy statements (float64, plain loops)

def np_kl(logp, ref, kind):
  d = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * d ** 2
  d = np.clip(d, -20, 20)
  return np.clip(np.exp(-d) + d - 1, -10, 10)


def np_shaped_rewards(scores, logp, ref, mask, coef, kind):
  b, t = mask.shape
  out = np.zeros((b, t))
  kl = np_kl(logp, ref, kind)
  for i in range(b):
    live = [j for j in range(t) if mask[i, j]]
    for j in live:
      out[i, j] -= coef * kl[i, j]
    if live:
      out[i, live[-1]] += scores[i]
  return out


def np_gae(rewards, values, mask, gamma, lam):
  """The textbook loop over each row's unmasked tokens, in order; V after the last token is 0."""
  b, t = mask.shape
  adv, ret = np.zeros((b, t)), np.zeros((b, t))
  for i in range(b):
    live = [j for j in range(t) if mask[i, j]]
    last = 0.0
    for k in reversed(range(len(live))):
      j = live[k]
      next_value = values[i, live[k + 1]] if k + 1 < len(live) else 0.0
      delta = rewards[i, j] + gamma * next_value - values[i, j]
      last = delta + gamma * lam * last
      adv[i, j] = last
      ret[i, j] = last + values[i, j]
  return adv, ret


def np_whiten(x, mask, shift_mean=True, eps=1e-8):
  vals = [x[i, j] for i, j in zip(*np.nonzero(mask))]
  n = len(vals)
  mean = sum(vals) / n if n else 0.0
  var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
  out = np.zeros(x.shape)
  for i, j in zip(*np.nonzero(mask)):
    out[i, j] = (x[i, j] - mean) / np.sqrt(var + eps) + (0.0 if shift_mean else mean)
  return out


def np_value_loss(values, old, returns, mask, clip, agg="token-mean"):
  b, t = mask.shape
  per = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      if mask[i, j]:
        unclipped = (values[i, j] - returns[i, j]) ** 2
        v_clip = old[i, j] + min(max(values[i, j] - old[i, j], -clip), clip)
        per[i, j] = max(unclipped, (v_clip - returns[i, j]) ** 2)
  if agg == "token-mean":
    return 0.5 * per.sum() / max(mask.sum(), 1)
  rows = [i for i in range(b) if mask[i].sum() > 0]
  if agg == "seq-mean-token-mean":
    return 0.5 * sum(per[i].sum() / mask[i].sum() for i in rows) / max(len(rows), 1)
  return 0.5 * sum(per[i].sum() for i in rows) / max(len(rows), 1)


def np_value_loss_grad(values, old, returns, mask, clip):
  """The analytic gradient of the token-mean loss: (V - R) / N where the unclipped branch is the max (or V is
  inside the clip range), else 0."""
  grad = np.zeros(values.shape)
  n = max(mask.sum(), 1)
  for i, j in zip(*np.nonzero(mask)):
    unclipped = (values[i, j] - returns[i, j]) ** 2
    v_clip = old[i, j] + np.clip(values[i, j] - old[i, j], -clip, clip)
    inside = abs(values[i, j] - old[i, j]) < clip
    if unclipped >= (v_clip - returns[i, j]) ** 2 or inside:
      grad[i, j] = (values[i, j] - returns[i, j]) / n
  return grad


def batch(seed, b=4, t=7, ragged=True):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, t + 1, size=b) if ragged else np.full(b, t)
  lengths[0] = max(lengths[0], 1)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  f = lambda *shape: rng.normal(size=shape).astype(np.float32)
  return {"rewards": f(b, t), "values": f(b, t), "old": f(b, t), "returns": f(b, t), "scores": f(b),
          "logp": -np.abs(f(b, t)), "ref": -np.abs(f(b, t)), "mask": mask}


# ------------------------------------------------------------------ against the statements

@pytest.mark.parametrize("kind", G.KL_KINDS)
def test_kl_shaped_rewards_match_numpy_and_share_grpo_mechanism(kind):
  d = batch(0)
  got = np.asarray(V.kl_shaped_rewards(d["scores"], d["logp"], d["ref"], d["mask"], 0.05, kind))
  np.testing.assert_allclose(got, np_shaped_rewards(d["scores"], d["logp"], d["ref"], d["mask"], 0.05, kind),
                             rtol=1e-5, atol=1e-6)
  # the row sum is GRPO's KL-in-the-reward sequence reward, for rows with a token
  rows = d["mask"].sum(-1) > 0
  seq = np.asarray(G.kl_penalized_rewards(d["scores"], d["logp"], d["ref"], d["mask"], 0.05, kind))
  np.testing.assert_allclose(got.sum(-1)[rows], seq[rows], rtol=1e-5, atol=1e-6)
  g = jax.grad(lambda lp: V.kl_shaped_rewards(d["scores"], lp, d["ref"], d["mask"], 0.05, kind).sum())(d["logp"])
  assert np.all(np.asarray(g) == 0.0)  # a reward is data
  no_kl = np.asarray(V.kl_shaped_rewards(d["scores"], None, None, d["mask"]))
  np.testing.assert_allclose(no_kl, np_shaped_rewards(d["scores"], d["logp"], d["ref"], d["mask"], 0.0, kind))


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0), (1.0, 1.0)])
def test_gae_matches_numpy_loop(gamma, lam):
  for seed in range(3):
    d = batch(seed)
    adv, ret = V.gae(d["rewards"], d["values"], d["mask"], gamma=gamma, lam=lam)
    want_adv, want_ret = np_gae(d["rewards"].astype(np.float64), d["values"].astype(np.float64), d["mask"], gamma,
                                lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    assert V.token_advantages(d["rewards"], d["values"], d["mask"], "gae", gamma=gamma, lam=lam)[0].shape == adv.shape


def test_gae_is_openrlhf_on_prefix_masks():
  """OpenRLHF's get_advantages_and_returns (masked rewards and values zeroed, a loop over every column) on the
  sampler's prefix masks."""
  d = batch(5)
  r, v, m = d["rewards"] * d["mask"], d["values"] * d["mask"], d["mask"]
  gamma, lam = 0.99, 0.95
  last = np.zeros(m.shape[0])
  adv = np.zeros(m.shape)
  for t in reversed(range(m.shape[1])):
    next_value = v[:, t + 1] if t < m.shape[1] - 1 else 0.0
    last = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * last
    adv[:, t] = last
  got_adv, got_ret = V.gae(d["rewards"], d["values"], m, gamma=gamma, lam=lam)
  np.testing.assert_allclose(got_adv, adv * m, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_ret, (adv + v) * m, rtol=1e-5, atol=1e-5)


def test_whiten_matches_numpy():
  d = batch(1)
  for shift in (True, False):
    np.testing.assert_allclose(V.whiten(d["values"], d["mask"], shift), np_whiten(d["values"], d["mask"], shift),
                               rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(V.whiten(d["values"], np.zeros_like(d["mask"])), 0.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("clip", [0.2, 0.5])
def test_value_loss_matches_numpy_and_its_gradient(agg, clip):
  d = batch(2)
  loss_fn = get_loss("value", "clipped_value")
  loss, metrics = loss_fn(d["values"], d["old"], d["returns"], d["mask"], clip=clip, agg=agg)
  f64 = lambda x: np.asarray(x, np.float64)
  np.testing.assert_allclose(loss, np_value_loss(f64(d["values"]), f64(d["old"]), f64(d["returns"]), d["mask"], clip,
                                                 agg), rtol=1e-5)
  assert metrics["loss"] == loss and metrics["value_loss"] == loss
  grad = jax.grad(lambda v: loss_fn(v, d["old"], d["returns"], d["mask"], clip=clip, agg=agg)[0])(d["values"])
  numeric = finite_diff(lambda v: np_value_loss(v, f64(d["old"]), f64(d["returns"]), d["mask"], clip, agg),
                        d["values"])
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-5)
  if agg == "token-mean":
    analytic = np_value_loss_grad(f64(d["values"]), f64(d["old"]), f64(d["returns"]), d["mask"], clip)
    np.testing.assert_allclose(grad, analytic, rtol=1e-4, atol=1e-7)


def test_value_loss_is_the_value_kind_and_masked_positions_get_no_gradient():
  assert loss_kind("clipped_value") == "value" and "clipped_value" in known_losses("value")
  with pytest.raises(KeyError, match="'clipped_value' is a value loss, not a policy loss"):
    get_loss("policy", "clipped_value")
  d = batch(3)
  values = np.where(d["mask"] > 0, d["values"], np.nan).astype(np.float32)
  old = np.where(d["mask"] > 0, d["old"], np.inf).astype(np.float32)
  loss, _ = V.clipped_value_loss(values, old, d["returns"], d["mask"])
  grad = jax.grad(lambda v: V.clipped_value_loss(v, old, d["returns"], d["mask"])[0])(values)
  assert np.isfinite(loss) and np.all(np.asarray(grad)[d["mask"] == 0] == 0.0)


def test_ppo_clip_takes_per_token_advantages():
  """[B] advantages and the same broadcast to [B, T] give the same loss; per-token ones weigh each token."""
  d = batch(4)
  loss_fn = get_loss("policy", "ppo_clip")
  logp = d["logp"] + 0.1 * d["rewards"]
  adv_row = d["scores"]
  a, _ = loss_fn(logp, d["logp"], adv_row, d["mask"], dual_clip_c=None)
  b, metrics = loss_fn(logp, d["logp"], np.repeat(adv_row[:, None], d["mask"].shape[1], 1), d["mask"],
                       dual_clip_c=None)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  live = d["mask"] > 0
  np.testing.assert_allclose(metrics["adv_mean"], np.repeat(adv_row[:, None], 7, 1)[live].mean(), rtol=1e-5)


# ------------------------------------------------------------------ properties
# Fixed shapes [4, 8] (ragged masks, empty rows included) and jitted functions: 1000 examples compile once.

ROWS, COLS = 4, 8
gae_jit = jax.jit(V.gae)
value_loss_jit = jax.jit(lambda v, o, r, m, clip: V.clipped_value_loss(v, o, r, m, clip=clip))
plain_value_loss_jit = jax.jit(lambda v, o, r, m: V.clipped_value_loss(v, o, r, m, clip=None))
whiten_jit = jax.jit(V.whiten, static_argnums=2)


@st.composite
def gae_inputs(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
  lengths = rng.integers(0, COLS + 1, size=ROWS)
  mask = (np.arange(COLS)[None, :] < lengths[:, None]).astype(np.float32)
  return rng.normal(size=(ROWS, COLS)).astype(np.float32), rng.normal(size=(ROWS, COLS)).astype(np.float32), mask


@given(gae_inputs())
def test_gamma_lambda_one_gives_suffix_sums(inputs):
  rewards, values, mask = inputs
  adv, ret = gae_jit(rewards, values, mask, 1.0, 1.0)
  suffix = np.cumsum((rewards * mask)[:, ::-1], axis=1)[:, ::-1] * mask
  np.testing.assert_allclose(ret, suffix, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(adv, (suffix - values) * mask, rtol=1e-4, atol=1e-4)


@given(gae_inputs(), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, COLS - 1), st.integers(0, 2 ** 16))
def test_gae_ignores_masked_positions_and_padding_columns(inputs, gamma, lam, at, seed):
  """Whatever masked positions hold, and a masked column inserted anywhere, change nothing on the real tokens."""
  rewards, values, mask = inputs
  adv, ret = gae_jit(rewards, values, mask, gamma, lam)
  rng = np.random.default_rng(seed)
  noise = lambda x: np.where(mask > 0, x, rng.normal(size=x.shape) * 1e3).astype(np.float32)
  adv2, ret2 = gae_jit(noise(rewards), noise(values), mask, gamma, lam)
  np.testing.assert_array_equal(adv, adv2)
  np.testing.assert_array_equal(ret, ret2)
  # column `at` of a [4, 9] batch is masked padding; the other columns are the [4, 8] batch's
  insert = lambda x, fill: np.insert(x, at, fill, axis=1)[:, :COLS + 1]
  adv3, ret3 = (np.asarray(x) for x in gae_jit(insert(rewards, 7.0), insert(values, -3.0), insert(mask, 0.0),
                                                gamma, lam))
  np.testing.assert_allclose(np.delete(adv3, at, axis=1), adv, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.delete(ret3, at, axis=1), ret, rtol=1e-6, atol=1e-6)
  assert np.all(adv3[:, at] == 0) and np.all(ret3[:, at] == 0)


@given(st.floats(-3, 3), st.floats(-3, 3), st.floats(-3, 3), st.floats(0.01, 1.0))
def test_value_clip_behaviour(value, old, ret, clip):
  """One token: the loss is 0.5 max of the two squared errors; inside the clip range it is the plain squared
  error and nothing is clipped; without a clip range it is always the plain squared error."""
  v, o, r, m = (np.array([[x]], np.float32) for x in (value, old, ret, 1.0))
  loss, metrics = value_loss_jit(v, o, r, m, clip)
  v_clip = old + np.clip(value - old, -clip, clip)
  np.testing.assert_allclose(loss, 0.5 * max((value - ret) ** 2, (v_clip - ret) ** 2), rtol=1e-4, atol=1e-5)
  if abs(value - old) < clip * (1 - 1e-3):
    np.testing.assert_allclose(loss, 0.5 * (value - ret) ** 2, rtol=1e-4, atol=1e-5)
    assert metrics["vf_clip_frac"] == 0.0
  unclipped, _ = plain_value_loss_jit(v, o, r, m)
  np.testing.assert_allclose(unclipped, 0.5 * (value - ret) ** 2, rtol=1e-4, atol=1e-5)


@given(gae_inputs(), st.floats(-5, 5), st.floats(0.1, 10))
def test_whitened_advantages_have_zero_mean_and_unit_variance_over_the_tokens(inputs, shift, scale):
  """Over the unmasked tokens: mean 0 and unbiased variance 1 (when they vary); 0 on masked positions; invariant to
  an affine change of the advantages (a shift and a positive scale)."""
  x, _, mask = inputs
  live = mask > 0
  out = np.asarray(whiten_jit(x, mask, True))
  assert np.all(out[~live] == 0)
  if live.sum() > 1:
    np.testing.assert_allclose(out[live].mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(out[live].var(ddof=1), 1.0, rtol=1e-4)
    moved = np.asarray(whiten_jit((x * scale + shift).astype(np.float32), mask, True))
    np.testing.assert_allclose(moved, out, rtol=1e-3, atol=1e-3)
