"""CLIPO contrastive loss against a float64 NumPy re-statement of the official `supcon_loss` (github
Qwen-Applications/CLIPO @ 13c5fd6, verl/trainer/ppo/ray_trainer.py, cited rt:LINE): sets, anchors, values, gradients,
properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import clipo as C
from jaxpt.losses import get_loss
from tests.finite_differences import finite_diff
from tests.host_copy import on_host

TAU = 0.05

# Constructed groups (rollout index: label):
#   g0 mixed {0: 1, 1: 1, 2: 0, 3: 0}, g1 all correct {4, 5}, g2 all incorrect {6, 7}, g3 singleton correct {8},
#   g4 one correct + one incorrect {9: 1, 10: 0} (the correct one has no positive).
LABELS = np.array([1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0])
GROUPS = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
CORRECT, INCORRECT = {0, 1, 4, 5, 8, 9}, {2, 3, 6, 7, 10}
ALL = set(range(11))
SAME_GROUP_POSITIVES = [{1}, {0}, {3}, {2}, {5}, {4}, {7}, {6}, set(), set(), set()]
EXPECTED = {  # official names: batch_level has no group mask, cross_level keeps it on positives only
    "group_level": dict(
        positives=SAME_GROUP_POSITIVES,
        candidates=[{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}, {5}, {4}, {7}, {6}, set(), {10}, {9}],
        anchors={0: {0, 1}, -1: {0, 1, 2, 3}, 1: {2, 3}}),   # masked_label -> anchors
    "cross_level": dict(
        positives=SAME_GROUP_POSITIVES,
        candidates=[ALL - {i} for i in range(11)],
        anchors={0: {0, 1, 4, 5}, -1: set(range(8)), 1: {2, 3, 6, 7}}),
    "batch_level": dict(
        positives=[(CORRECT if i in CORRECT else INCORRECT) - {i} for i in range(11)],
        candidates=[ALL - {i} for i in range(11)],
        anchors={0: CORRECT, -1: ALL, 1: INCORRECT}),
}


def as_sets(mask):
  return [set(np.flatnonzero(row).tolist()) for row in np.asarray(mask)]


@pytest.mark.parametrize("level", C.LEVELS)
@pytest.mark.parametrize("masked_label", C.MASKED_LABELS)
@pytest.mark.parametrize("label_kind", ["int", "bool", "reward"])
def test_sets_exactly_per_official_code(level, masked_label, label_kind):
  labels = {"int": LABELS, "bool": LABELS.astype(bool), "reward": np.where(LABELS > 0, 1.0, 0.0)}[label_kind]
  anchors, positives, candidates = C.contrastive_sets(labels, GROUPS, level, masked_label)
  want = EXPECTED[level]
  assert as_sets(positives) == want["positives"]
  assert as_sets(candidates) == want["candidates"]
  assert set(np.flatnonzero(np.asarray(anchors)).tolist()) == want["anchors"][masked_label]
  assert anchors.dtype == jnp.float32 and positives.dtype == bool and candidates.dtype == bool
  np.testing.assert_array_equal(anchors, np_official(np.eye(11, 3), labels, GROUPS, "soft_nn", level, "cosine",
                                                     masked_label)[2])


def test_anchor_rule_when_the_batch_has_no_incorrect_rollout():
  """rt:189-192: an anchor needs a positive and a candidate that is not a positive (`num_neg`), not an incorrect
  rollout: at cross_level the other prompts' correct rollouts are negatives, so an all-correct batch still has
  anchors (the rule before this change required an incorrect rollout among the candidates)."""
  labels, groups = np.ones(6, int), np.array([0, 0, 0, 1, 1, 2])
  want = {"group_level": set(), "batch_level": set(), "cross_level": {0, 1, 2, 3, 4}}   # 5: singleton, no positive
  z = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
  for level, anchors in want.items():
    a = C.contrastive_sets(labels, groups, level)[0]
    assert set(np.flatnonzero(np.asarray(a)).tolist()) == anchors
    np.testing.assert_array_equal(a, np_official(z, labels, groups, "infonce", level, "cosine", sampled=np.zeros(6,
                                                 int))[2])
    loss, m = C.contrastive_loss(z, labels, groups, jax.random.PRNGKey(0), level=level)
    assert (float(loss) > 0) == bool(anchors) and float(m["num_anchors"]) == len(anchors)
    r = C.contrastive_reward(m["per_rollout_loss"], labels)
    assert np.all(np.asarray(r)[sorted(anchors)] < 0) and np.all(np.asarray(r)[sorted(set(range(6)) - anchors)] == 0)


def test_sets_follow_a_permutation_of_the_rollouts():
  perm = np.random.default_rng(3).permutation(len(LABELS))
  for level in C.LEVELS:
    a, p, c = C.contrastive_sets(LABELS, GROUPS, level, -1)
    a2, p2, c2 = C.contrastive_sets(LABELS[perm], GROUPS[perm] * 7 + 100, level, -1)  # any int ids, any order
    np.testing.assert_array_equal(a2, np.asarray(a)[perm])
    np.testing.assert_array_equal(p2, np.asarray(p)[perm][:, perm])
    np.testing.assert_array_equal(c2, np.asarray(c)[perm][:, perm])


# ------------------------------------------------------------------ float64 re-statement of the official code

def np_official(z, labels, groups, objective, level, distance, masked_label=0, sampled=None, tau=TAU, eps=1e-8):
  """`supcon_loss` (rt:132-268) line by line in float64, called as `compute_contrastive_rewards` calls it for
  `level` (rt:1647-1658), on the head's normalised output (rt:102; F.normalize's 1e-12 norm floor left out: jaxpt
  normalises rows of any scale). `sampled` [N]: the InfoNCE draw of torch.multinomial (rt:236).
  -> (loss, individual_loss [N], anchor_mask [N])."""
  z = np.asarray(z, np.float64)
  norm = np.linalg.norm(z, axis=1, keepdims=True)
  emb = z / np.where(norm > 0, norm, 1.0)
  b = len(labels)
  lab = (np.asarray(labels, np.float64) > 0).astype(np.int64)
  groups = np.asarray(groups)
  cos_sim = emb @ emb.T
  sim = cos_sim if distance == "cosine" else 1 - np.sqrt(np.maximum(2.0 - 2.0 * cos_sim, eps))   # rt:169-174
  identity = np.eye(b)
  mask_same = (lab[:, None] == lab[None, :]).astype(np.float64)                                   # rt:182-187
  mask_all = np.ones((b, b))
  if level != "batch_level":
    group_mask = (groups[:, None] == groups[None, :]).astype(np.float64)
    mask_same = mask_same * group_mask
    if level == "group_level":
      mask_all = mask_all * group_mask
  num_pos = (mask_same - identity).sum(1)                                                         # rt:189-192
  num_neg = (mask_all - mask_same).sum(1)
  not_trivial = ((num_pos > 0) & (num_neg > 0)).astype(np.float64)
  mask_same, mask_all = mask_same - identity, mask_all - identity
  logits = sim / tau
  logits = logits - logits.max(1, keepdims=True)
  exp_logits = np.exp(logits) * mask_all
  sum_exp_pos, sum_exp_all, pos_count = (exp_logits * mask_same).sum(1), exp_logits.sum(1), mask_same.sum(1)
  log_sum_exp_all = np.log(sum_exp_all + eps)
  if objective == "soft_nn":                                                                      # rt:215-219
    individual = -(np.log(sum_exp_pos + eps) - log_sum_exp_all)
  elif objective == "supcon_in":                                                                  # rt:221-225
    individual = -(np.log(sum_exp_pos + eps) - log_sum_exp_all - np.log(pos_count + eps))
  elif objective == "supcon_out":                                                                 # rt:227-231
    individual = -(((logits - log_sum_exp_all[:, None]) * mask_same).sum(1) / (pos_count + eps))
  else:                                                                                           # rt:233-242
    mask_sampled = np.zeros((b, b))
    mask_sampled[np.arange(b), np.asarray(sampled)] = 1.0
    individual = -((logits * mask_sampled * mask_same).sum(1) - log_sum_exp_all)
  anchor = np.ones(b) if masked_label == -1 else (lab != masked_label).astype(np.float64)         # rt:247-257
  anchor = anchor * not_trivial
  if anchor.sum() == 0:                                                                           # rt:262-264
    return 0.0, np.zeros(b), anchor
  individual = individual * anchor
  return individual.sum() / (anchor.sum() + eps), individual, anchor


def first_positive(labels, groups, level, masked_label=0):
  """A fixed positive choice: the first j in P(i) (0 where P(i) is empty)."""
  _, positives, _ = C.contrastive_sets(labels, groups, level, masked_label)
  p = np.asarray(positives)
  return np.where(p.any(1), p.argmax(1), 0).astype(np.int32)


@pytest.fixture(scope="module")
def z_small():
  return np.random.default_rng(0).normal(size=(len(LABELS), 4)).astype(np.float32)


@pytest.mark.parametrize("objective,level,distance,masked_label,tau", [
    ("infonce", "group_level", "cosine", 0, TAU), ("infonce", "cross_level", "l2", 0, TAU),
    ("infonce", "batch_level", "cosine", -1, TAU), ("infonce", "group_level", "cosine", 1, 0.5),
    ("supcon_out", "group_level", "cosine", 0, TAU), ("supcon_out", "batch_level", "l2", 0, TAU),
    ("supcon_in", "group_level", "cosine", 0, TAU), ("supcon_in", "cross_level", "l2", -1, TAU),
    ("supcon_in", "batch_level", "cosine", 1, 0.5), ("soft_nn", "group_level", "l2", 0, TAU),
    ("soft_nn", "cross_level", "cosine", -1, 0.5)])
def test_loss_value_and_grad_match_official(z_small, objective, level, distance, masked_label, tau):
  pos_idx = first_positive(LABELS, GROUPS, level, masked_label)
  kw = dict(objective=objective, level=level, distance=distance, temperature=tau, masked_label=masked_label,
            positive_index=pos_idx)
  fn = lambda z: C.contrastive_loss(z, LABELS, GROUPS, **kw)
  (loss, m), g = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(z_small))
  official = lambda z: np_official(z, LABELS, GROUPS, objective, level, distance, masked_label, pos_idx, tau)
  want, want_per, _ = official(z_small)
  np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-5)
  np.testing.assert_allclose(m["per_rollout_loss"], want_per, rtol=2e-5, atol=1e-5)
  assert float(m["num_anchors"]) == len(EXPECTED[level]["anchors"][masked_label])
  want_g = finite_diff(lambda z: official(z)[0], z_small)
  np.testing.assert_allclose(g, want_g, rtol=1e-3, atol=1e-4)


def test_l2_similarity_is_one_minus_the_clamped_distance(z_small):
  """rt:174: s = 1 - sqrt(clamp(2 - 2 cos, min=1e-8)) = 1 - ||zn_i - zn_j|| off the diagonal (it was
  -||zn_i - zn_j||^2); on it exactly 1 - 1e-4 (the clamp; 1 - sqrt(2) for a zero row), with no gradient."""
  zn = C.normalize(z_small)
  s = np.asarray(C.similarities(zn, "l2"), np.float64)
  z64 = z_small.astype(np.float64) / np.linalg.norm(z_small.astype(np.float64), axis=1, keepdims=True)
  dist = np.linalg.norm(z64[:, None] - z64[None], axis=-1)
  off = ~np.eye(len(s), dtype=bool)
  np.testing.assert_allclose(s[off], 1.0 - dist[off], atol=2e-6)
  np.testing.assert_array_equal(np.diag(s), np.float32(1 - 1e-4))
  assert np.all(s <= 1.0) and np.all(s >= -1.0)
  zero_row = np.asarray(C.similarities(C.normalize(np.r_[z_small[:2], np.zeros((1, 4), np.float32)]), "l2"))
  np.testing.assert_allclose(zero_row[2], [1 - np.sqrt(2)] * 2 + [1 - np.sqrt(2)], rtol=1e-6)
  g = jax.grad(lambda x: jnp.trace(C.similarities(x, "l2")))(zn)
  np.testing.assert_array_equal(g, 0.0)


def test_similarity_metrics(z_small):
  _, m = C.contrastive_loss(z_small, LABELS, GROUPS, positive_index=first_positive(LABELS, GROUPS, "group_level"))
  zn = z_small / np.linalg.norm(z_small, axis=1, keepdims=True)
  s = zn @ zn.T
  np.testing.assert_allclose(m["pos_sim"], s[0, 1], rtol=1e-5)               # anchors 0, 1: P = each other
  np.testing.assert_allclose(m["neg_sim"], s[[0, 0, 1, 1], [2, 3, 2, 3]].mean(), rtol=1e-5)


def test_infonce_draws_positives_uniformly_from_p():
  labels, groups = np.array([1, 1, 1, 1, 0]), np.zeros(5, int)
  _, positives, _ = C.contrastive_sets(labels, groups)
  keys = jax.random.split(jax.random.PRNGKey(0), 3000)
  draws = np.asarray(jax.jit(jax.vmap(lambda k: C.sample_positives(positives, k)))(keys))
  for i in range(4):  # anchors: P(i) = the other three correct ones
    counts = np.bincount(draws[:, i], minlength=5)
    assert counts[i] == 0 and counts[4] == 0
    np.testing.assert_allclose(counts[[j for j in range(4) if j != i]] / 3000, 1 / 3, atol=0.04)


def test_infonce_with_rng_equals_fixed_choice_of_the_drawn_positive(z_small):
  key = jax.random.PRNGKey(5)
  _, positives, _ = C.contrastive_sets(LABELS, GROUPS, "batch_level")
  drawn = C.sample_positives(positives, key)
  a = C.contrastive_loss(z_small, LABELS, GROUPS, key, level="batch_level")[0]
  b = C.contrastive_loss(z_small, LABELS, GROUPS, level="batch_level", positive_index=drawn)[0]
  np.testing.assert_allclose(a, b, rtol=1e-6)
  with pytest.raises(ValueError, match="rng"):
    C.contrastive_loss(z_small, LABELS, GROUPS)


@pytest.mark.parametrize("objective", C.OBJECTIVES)
@pytest.mark.parametrize("c", [1e-3, 7.0, 1e3])
def test_loss_invariant_to_head_output_scale(z_small, objective, c):
  key = jax.random.PRNGKey(1)
  l1, m1 = C.contrastive_loss(z_small, LABELS, GROUPS, key, objective=objective)
  l2, m2 = C.contrastive_loss(c * z_small, LABELS, GROUPS, key, objective=objective)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  np.testing.assert_allclose(m2["per_rollout_loss"], m1["per_rollout_loss"], rtol=1e-5, atol=1e-6)


def test_reward_matches_numpy_and_is_stop_gradient():
  per = np.array([0.0, 1.0, 2.0, 10.0, 3.0, 0.5])
  labels = np.array([1, 1, 1, 1, 0, 1])
  want = [max(-0.2 * l * y, -0.5) for l, y in zip(per, labels)]
  np.testing.assert_allclose(C.contrastive_reward(per, labels), want, rtol=1e-6)
  np.testing.assert_allclose(C.contrastive_reward(per, labels, coef=1.0, floor=-4.0),
                             [max(-l * y, -4.0) for l, y in zip(per, labels)], rtol=1e-6)
  g = jax.grad(lambda p: C.contrastive_reward(p, labels).sum())(jnp.asarray(per, jnp.float32))
  np.testing.assert_array_equal(g, 0.0)
  with pytest.raises(ValueError, match="floor"):
    C.contrastive_reward(per, labels, floor=0.1)


def test_registered_by_name(z_small):
  key = jax.random.PRNGKey(2)
  for objective in C.OBJECTIVES:
    loss, _ = get_loss("contrastive", f"clipo_{objective}")(z_small, LABELS, GROUPS, key, level="cross_level")
    np.testing.assert_allclose(loss, C.contrastive_loss(z_small, LABELS, GROUPS, key, objective=objective,
                                                        level="cross_level")[0], rtol=1e-6)


def test_bad_options_name_themselves(z_small):
  for kw, word in [({"objective": "x"}, "objective"), ({"level": "x"}, "level"), ({"distance": "x"}, "distance"),
                   ({"temperature": 0.0}, "temperature"), ({"masked_label": 2}, "masked_label"),
                   ({"level": "cross"}, "cross -> batch_level")]:
    with pytest.raises(ValueError, match=word):
      C.contrastive_loss(z_small, LABELS, GROUPS, jax.random.PRNGKey(0), **kw)


# ------------------------------------------------------------------ degenerate cases, properties, transformations

N = 8
COMBOS = [(o, lv, d) for o in C.OBJECTIVES for lv in C.LEVELS for d in C.DISTANCES]


@jax.jit
def every_option(z, labels, groups, key, tau=TAU, masked_label=0):
  """(loss, grad wrt z, metrics, reward) for every objective x level x distance, in one compiled function (the
  temperature and masked_label traced)."""
  out = {}
  for objective, level, distance in COMBOS:
    fn = lambda zz: C.contrastive_loss(zz, labels, groups, key, objective=objective, level=level, distance=distance,
                                       temperature=tau, masked_label=masked_label)
    (loss, m), g = jax.value_and_grad(fn, has_aux=True)(z)
    out[objective, level, distance] = (loss, g, m, C.contrastive_reward(m["per_rollout_loss"], labels))
  return out


every_option_on_host = on_host(every_option)


def over_options(results):
  """every_option_on_host's {option: (loss, grad, metrics, reward)} as arrays over the options (axis 0, in the
  dict's order): loss [K], grad [K, N, 3], per_rollout_loss [K, N], reward [K, N], num_anchors [K] -- one
  vectorised check per property instead of one NumPy assertion per option."""
  loss, g, m, r = zip(*results.values())
  return (np.array(loss), np.stack(g), np.stack([x["per_rollout_loss"] for x in m]), np.stack(r),
          np.array([x["num_anchors"] for x in m]))


def _check_every_option(results, ok, what):
  """ok [K]: the verdict of check `what` per option of `results`; the failing options are named."""
  assert np.all(ok), f"{what} fails for {[option for option, good in zip(results, ok) if not good]}"


def anchors_by_level(labels, groups, masked_label=0):
  z = np.eye(len(labels), 3)
  return {level: np_official(z, labels, groups, "soft_nn", level, "cosine", masked_label)[2] for level in C.LEVELS}


@given(labels=st.lists(st.integers(0, 1), min_size=N, max_size=N),
       groups=st.lists(st.integers(0, 3), min_size=N, max_size=N),
       log_scale=st.floats(-30, 30), zero_rows=st.lists(st.booleans(), min_size=N, max_size=N),
       log_tau=st.floats(-3, 0), masked_label=st.sampled_from(C.MASKED_LABELS), seed=st.integers(0, 2**16))
def test_finite_and_bounded_for_any_groups_and_values(labels, groups, log_scale, zero_rows, log_tau, masked_label,
                                                      seed):
  """Any labels and groups (degenerate groups, no anchor), zero rows, |z| from 1e-30 to 1e30, temperatures down to
  1e-3 (logits up to 2000 apart), every masked_label: finite loss, gradient and reward, L >= 0, 0 off the anchors."""
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(N, 3)) * 10.0 ** log_scale * ~np.array(zero_rows)[:, None]).astype(np.float32)
  labels, groups = np.array(labels), np.array(groups)
  results = every_option_on_host(z, labels, groups, jax.random.PRNGKey(seed), np.float32(10.0 ** log_tau),
                                 np.int32(masked_label))   # numpy: cheap checks
  loss, g, per, r, num_anchors = over_options(results)
  anchors_of = anchors_by_level(labels, groups, masked_label)
  anchors = np.stack([anchors_of[level] for _, level, _ in results])   # [K, N]
  check = lambda ok, what: _check_every_option(results, ok, what)
  check(np.isfinite(loss) & np.isfinite(g).all((1, 2)) & np.isfinite(r).all(1), "finite loss, gradient, reward")
  check((per >= -1e-6).all(1) & (loss >= -1e-6), "L >= 0")
  # r = -0.2 max(L, 0): an L rounded below 0 (-1.5e-8, two correct rollouts close in l2) gives r = 0, not +3e-9
  check((r <= 0).all(1) & (r >= -0.5).all(1), "-0.5 <= r <= 0")
  check((r[:, labels == 0] == 0.0).all(1), "r = 0 on the incorrect rollouts")
  check(((per == 0.0) | (anchors != 0)).all(1), "L = 0 off the anchors")
  check(((r == 0.0) | (anchors != 0)).all(1), "r = 0 off the anchors")
  no_anchor = anchors.sum(1) == 0
  check(~no_anchor | ((loss == 0.0) & (num_anchors == 0.0)), "no anchor: loss 0, num_anchors 0")
  check(~no_anchor | (g == 0.0).all((1, 2)), "no anchor: gradient 0")


@pytest.mark.parametrize("labels,groups,anchored", [
    ([0] * N, [0, 0, 0, 0, 1, 1, 1, 1], ()),                                # all incorrect (masked)
    ([1] * N, [0, 0, 0, 0, 1, 1, 1, 1], ("cross_level",)),                  # all correct: other prompts negatives
    ([1, 0] * 4, list(range(N)), ("batch_level",)),                         # singleton groups
    ([1, 0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1], ("batch_level",)),  # one correct per group
])
def test_no_anchors_gives_zero_loss_reward_and_gradient(labels, groups, anchored):
  z = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
  labels, groups = np.array(labels), np.array(groups)
  results = every_option_on_host(z, labels, groups, jax.random.PRNGKey(0), np.float32(TAU), np.int32(0))  # 1 compile
  anchors_of = anchors_by_level(labels, groups)
  assert {level for level, a in anchors_of.items() if a.sum() > 0} == set(anchored)
  for (objective, level, distance), (loss, g, m, r) in results.items():
    if level in anchored:
      assert float(loss) > 0 and float(m["num_anchors"]) > 0
      continue
    assert float(loss) == 0.0 and float(m["num_anchors"]) == 0.0
    np.testing.assert_array_equal(g, 0.0)
    np.testing.assert_array_equal(r, 0.0)


def test_single_rollout():
  loss, m = jax.jit(C.contrastive_loss)(jnp.ones((1, 4)), jnp.array([1]), jnp.array([0]), jax.random.PRNGKey(0))
  assert float(loss) == 0.0 and np.asarray(m["per_rollout_loss"]).shape == (1,)
  np.testing.assert_array_equal(C.contrastive_reward(m["per_rollout_loss"], [1]), [0.0])


def test_jit_vmap_grad_compose(z_small):
  zs = jnp.stack([jnp.asarray(z_small), 2.0 * jnp.asarray(z_small[::-1])])
  keys = jax.random.split(jax.random.PRNGKey(4), 2)
  fn = lambda z, k: C.contrastive_loss(z, LABELS, GROUPS, k, level="batch_level")[0]
  values, grads = jax.jit(jax.vmap(jax.value_and_grad(fn)))(zs, keys)
  single = jax.jit(jax.value_and_grad(fn))
  for b in range(2):
    v, g = single(zs[b], keys[b])
    np.testing.assert_allclose(values[b], v, rtol=1e-5)
    np.testing.assert_allclose(grads[b], g, rtol=1e-5, atol=1e-6)


@jax.jit
def drawn_positives(labels, groups, key):
  """{level: p_i} as contrastive_loss draws them from `key` for infonce (uniform over P(i))."""
  return {level: C.sample_positives(C.contrastive_sets(labels, groups, level)[1], key) for level in C.LEVELS}


@given(labels=st.lists(st.integers(0, 1), min_size=N, max_size=N),
       groups=st.lists(st.integers(0, 3), min_size=N, max_size=N),
       log_scale=st.floats(-30, 30), log_tau=st.floats(-2, 0), masked_label=st.sampled_from(C.MASKED_LABELS),
       seed=st.integers(0, 2**16))
def test_property_every_option_matches_official_statement(labels, groups, log_scale, log_tau, masked_label, seed):
  """All 24 options (float32) against np_official (float64, the official code's masks) for any labels and groups
  (degenerate ones included: all correct, all incorrect, singletons, no anchor at all), every masked_label,
  temperatures 0.01 to 1 and |z| from 1e-30 to 1e30 (a float32 ||z||^2 would under- or overflow there; normalize
  rescales first). Tolerance: the float32 rounding of s (~1e-7) divided by tau."""
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(N, 3)) * 10.0 ** log_scale).astype(np.float32)
  labels, groups = np.array(labels), np.array(groups)
  key, tau = jax.random.PRNGKey(seed), 10.0 ** log_tau
  results = every_option_on_host(z, labels, groups, key, np.float32(tau), np.int32(masked_label))
  drawn = jax.device_get(drawn_positives(labels, groups, key))
  want = []
  for objective, level, distance in results:
    want_loss, want_per, _ = np_official(z, labels, groups, objective, level, distance, masked_label, drawn[level],
                                         np.float32(tau))
    want.append(np.r_[want_per, want_loss])
  loss, _, per, _, _ = over_options(results)
  got, want, atol = np.c_[per, loss], np.stack(want), 1e-4 + 1e-6 / tau   # [K, N + 1]: L_1..L_N, loss per option
  failing = [option for option, close in zip(results, np.isclose(got, want, rtol=1e-4, atol=atol).all(1)) if not close]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=f"rows: options, L_1..L_N, loss; {failing}")
