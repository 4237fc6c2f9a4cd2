"""CLIPO contrastive loss: sets exactly per spec, values and gradients against a numpy re-statement, properties."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxpt.losses import clipo as C
from jaxpt.losses import get_loss
from tests.finite_differences import finite_diff

TAU = 0.05

# Constructed groups (rollout index: label):
#   g0 mixed {0: 1, 1: 1, 2: 0, 3: 0}, g1 all correct {4, 5}, g2 all incorrect {6, 7}, g3 singleton correct {8},
#   g4 one correct + one incorrect {9: 1, 10: 0} (the correct one has no positive).
LABELS = np.array([1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0])
GROUPS = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
CORRECT, INCORRECT = {0, 1, 4, 5, 8, 9}, {2, 3, 6, 7, 10}
ALL = set(range(11))
EXPECTED = {
    "group": dict(
        positives=[{1}, {0}, {3}, {2}, {5}, {4}, {7}, {6}, set(), set(), set()],
        candidates=[{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}, {5}, {4}, {7}, {6}, set(), {10}, {9}],
        anchors={0, 1}),
    "batch": dict(
        positives=[{1}, {0}, {3}, {2}, {5}, {4}, {7}, {6}, set(), set(), set()],
        candidates=[ALL - {i} for i in range(11)],
        anchors={0, 1, 4, 5}),
    "cross": dict(
        positives=[(CORRECT if i in CORRECT else INCORRECT) - {i} for i in range(11)],
        candidates=[ALL - {i} for i in range(11)],
        anchors={0, 1, 4, 5, 8, 9}),
}


def as_sets(mask):
  return [set(np.flatnonzero(row).tolist()) for row in np.asarray(mask)]


@pytest.mark.parametrize("level", C.LEVELS)
@pytest.mark.parametrize("label_kind", ["int", "bool", "reward"])
def test_sets_exactly_per_spec(level, label_kind):
  labels = {"int": LABELS, "bool": LABELS.astype(bool), "reward": np.where(LABELS > 0, 1.0, 0.0)}[label_kind]
  anchors, positives, candidates = C.contrastive_sets(labels, GROUPS, level)
  want = EXPECTED[level]
  assert as_sets(positives) == want["positives"]
  assert as_sets(candidates) == want["candidates"]
  assert set(np.flatnonzero(np.asarray(anchors)).tolist()) == want["anchors"]
  assert anchors.dtype == jnp.float32 and positives.dtype == bool and candidates.dtype == bool


def test_sets_follow_a_permutation_of_the_rollouts():
  perm = np.random.default_rng(3).permutation(len(LABELS))
  a, p, c = C.contrastive_sets(LABELS, GROUPS)
  a2, p2, c2 = C.contrastive_sets(LABELS[perm], GROUPS[perm] * 7 + 100)  # any int ids, any order
  np.testing.assert_array_equal(a2, np.asarray(a)[perm])
  np.testing.assert_array_equal(p2, np.asarray(p)[perm][:, perm])
  np.testing.assert_array_equal(c2, np.asarray(c)[perm][:, perm])


# ------------------------------------------------------------------ numpy re-statement of the spec's equations

def np_sets(labels, groups, level):
  """The spec's sets by loops: (anchors a [N], P(i) lists, A(i) lists)."""
  n = len(labels)
  y = [int(v > 0) for v in labels]
  cand = [[j for j in range(n) if j != i and (level != "group" or groups[j] == groups[i])] for i in range(n)]
  pos = [[j for j in range(n) if j != i and y[j] == y[i] and (level == "cross" or groups[j] == groups[i])]
         for i in range(n)]
  a = np.array([float(y[i] == 1 and len(pos[i]) > 0 and any(y[j] == 0 for j in cand[i])) for i in range(n)])
  return a, pos, cand


def np_loss(z, labels, groups, objective, level, distance, pos_idx=None, tau=TAU):
  """s_ij = zn_i . zn_j or -||zn_i - zn_j||^2 for every pair, then loops over anchors i and their sets: l_ij, L_i
  and the mean over anchors, in float64."""
  z = np.asarray(z, np.float64)
  zn = z / np.linalg.norm(z, axis=1, keepdims=True)
  n = len(labels)
  s = zn @ zn.T if distance == "cosine" else -np.sum((zn[:, None, :] - zn[None, :, :]) ** 2, axis=-1)
  a, positives, candidates = np_sets(labels, groups, level)
  per = np.zeros(n)
  for i in np.flatnonzero(a):
    l = s[i] / tau - max(s[i] / tau)
    log_den = np.log(sum(np.exp(l[j]) for j in candidates[i]) + 1e-8)
    if objective == "infonce":
      per[i] = -l[pos_idx[i]] + log_den
    elif objective == "supcon_out":
      per[i] = -np.mean([l[p] for p in positives[i]]) + log_den
    else:
      per[i] = -np.log(sum(np.exp(l[p]) for p in positives[i]) + 1e-8) + log_den
  return per.sum() / (a.sum() + 1e-8), per


def first_positive(labels, groups, level):
  """A fixed positive choice: the first j in P(i) (0 where P(i) is empty)."""
  _, positives, _ = C.contrastive_sets(labels, groups, level)
  p = np.asarray(positives)
  return np.where(p.any(1), p.argmax(1), 0).astype(np.int32)


@pytest.fixture(scope="module")
def z_small():
  return np.random.default_rng(0).normal(size=(len(LABELS), 4)).astype(np.float32)


@pytest.mark.parametrize("objective,level,distance,tau", [
    ("infonce", "group", "cosine", TAU), ("infonce", "batch", "l2", TAU), ("infonce", "cross", "cosine", TAU),
    ("infonce", "group", "cosine", 0.5), ("supcon_out", "group", "cosine", TAU), ("supcon_out", "cross", "l2", TAU),
    ("soft_nn", "group", "l2", TAU), ("soft_nn", "batch", "cosine", 0.5)])
def test_loss_value_and_grad_match_numpy(z_small, objective, level, distance, tau):
  pos_idx = first_positive(LABELS, GROUPS, level)
  kw = dict(objective=objective, level=level, distance=distance, temperature=tau, positive_index=pos_idx)
  fn = lambda z: C.contrastive_loss(z, LABELS, GROUPS, **kw)
  (loss, m), g = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(z_small))
  want, want_per = np_loss(z_small, LABELS, GROUPS, objective, level, distance, pos_idx, tau)
  np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-5)
  np.testing.assert_allclose(m["per_rollout_loss"], want_per, rtol=2e-5, atol=1e-5)
  assert float(m["num_anchors"]) == len(EXPECTED[level]["anchors"])
  want_g = finite_diff(lambda z: np_loss(z, LABELS, GROUPS, objective, level, distance, pos_idx, tau)[0], z_small)
  np.testing.assert_allclose(g, want_g, rtol=1e-3, atol=1e-4)


def test_similarity_metrics(z_small):
  _, m = C.contrastive_loss(z_small, LABELS, GROUPS, positive_index=first_positive(LABELS, GROUPS, "group"))
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
  _, positives, _ = C.contrastive_sets(LABELS, GROUPS, "cross")
  drawn = C.sample_positives(positives, key)
  a = C.contrastive_loss(z_small, LABELS, GROUPS, key, level="cross")[0]
  b = C.contrastive_loss(z_small, LABELS, GROUPS, level="cross", positive_index=drawn)[0]
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
    loss, _ = get_loss("contrastive", f"clipo_{objective}")(z_small, LABELS, GROUPS, key, level="batch")
    np.testing.assert_allclose(loss, C.contrastive_loss(z_small, LABELS, GROUPS, key, objective=objective,
                                                        level="batch")[0], rtol=1e-6)


def test_bad_options_name_themselves(z_small):
  for kw, word in [({"objective": "x"}, "objective"), ({"level": "x"}, "level"), ({"distance": "x"}, "distance"),
                   ({"temperature": 0.0}, "temperature")]:
    with pytest.raises(ValueError, match=word):
      C.contrastive_loss(z_small, LABELS, GROUPS, jax.random.PRNGKey(0), **kw)


# ------------------------------------------------------------------ degenerate cases, properties, transformations

N = 8
COMBOS = [(o, lv, d) for o in C.OBJECTIVES for lv in C.LEVELS for d in C.DISTANCES]


@jax.jit
def every_option(z, labels, groups, key):
  """(loss, grad wrt z, metrics, reward) for every objective x level x distance, in one compiled function."""
  out = {}
  for objective, level, distance in COMBOS:
    fn = lambda zz: C.contrastive_loss(zz, labels, groups, key, objective=objective, level=level, distance=distance)
    (loss, m), g = jax.value_and_grad(fn, has_aux=True)(z)
    out[objective, level, distance] = (loss, g, m, C.contrastive_reward(m["per_rollout_loss"], labels))
  return out


def on_host(fn):
  """fn (pytree of float32 / int32 arrays of fixed shapes) as a function returning that pytree in numpy through ONE
  device-to-host copy (the outputs packed into one vector by the compiled function): fetching every_option's 144
  small arrays one by one costs several times what computing them does."""
  @functools.cache
  def layout(*specs):
    leaves, tree = jax.tree_util.tree_flatten(jax.eval_shape(fn, *specs))
    return tree, leaves, np.cumsum([int(np.prod(leaf.shape)) for leaf in leaves])[:-1]

  packed = jax.jit(lambda *args: jnp.concatenate(
      [jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree_util.tree_leaves(fn(*args))]))

  def call(*args):
    args = [jnp.asarray(a) for a in args]
    tree, leaves, cuts = layout(*(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))
    parts = np.split(np.asarray(packed(*args)), cuts)
    return jax.tree_util.tree_unflatten(tree, [p.reshape(l.shape).astype(l.dtype) for p, l in zip(parts, leaves)])

  return call


every_option_on_host = on_host(every_option)


@given(labels=st.lists(st.integers(0, 1), min_size=N, max_size=N),
       groups=st.lists(st.integers(0, 3), min_size=N, max_size=N),
       log_scale=st.floats(-30, 30), zero_rows=st.lists(st.booleans(), min_size=N, max_size=N),
       seed=st.integers(0, 2**16))
def test_finite_and_bounded_for_any_groups_and_values(labels, groups, log_scale, zero_rows, seed):
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(N, 3)) * 10.0 ** log_scale * ~np.array(zero_rows)[:, None]).astype(np.float32)
  labels, groups = np.array(labels), np.array(groups)
  results = every_option_on_host(z, labels, groups, jax.random.PRNGKey(seed))   # numpy: cheap checks
  anchors_of = {level: np_sets(labels, groups, level)[0] for level in C.LEVELS}
  for (objective, level, distance), (loss, g, m, r) in results.items():
    assert np.isfinite(float(loss)) and np.all(np.isfinite(g)) and np.all(np.isfinite(r))
    per = np.asarray(m["per_rollout_loss"])
    assert np.all(per >= -1e-6) and float(loss) >= -1e-6
    # r = -0.2 max(L, 0): an L rounded below 0 (-1.5e-8, two correct rollouts close in l2) gives r = 0, not +3e-9
    assert np.all(r <= 0) and np.all(r >= -0.5)
    np.testing.assert_array_equal(r[labels == 0], 0.0)
    anchors = anchors_of[level]
    np.testing.assert_array_equal(per[anchors == 0], 0.0)
    np.testing.assert_array_equal(r[anchors == 0], 0.0)
    if anchors.sum() == 0:
      assert float(loss) == 0.0 and float(m["num_anchors"]) == 0.0
      np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize("labels,groups", [
    ([0] * N, [0, 0, 0, 0, 1, 1, 1, 1]),           # all incorrect
    ([1] * N, [0, 0, 0, 0, 1, 1, 1, 1]),           # all correct
    ([1, 0] * 4, list(range(N))),                  # singleton groups
    ([1, 0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]),  # one correct per group: no positives
])
def test_no_anchors_gives_zero_loss_reward_and_gradient(labels, groups):
  z = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
  results = every_option(z, np.array(labels), np.array(groups), jax.random.PRNGKey(0))
  for (objective, level, distance), (loss, g, m, r) in results.items():
    if level == "cross" and 0 < sum(labels) < N:
      continue  # positives from other groups make anchors here
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
  fn = lambda z, k: C.contrastive_loss(z, LABELS, GROUPS, k, level="cross")[0]
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
       log_scale=st.floats(-30, 30), seed=st.integers(0, 2**16))
def test_property_every_option_matches_numpy_statement(labels, groups, log_scale, seed):
  """All 18 options (float32) against np_loss (float64 loops over the spec's sets): per-rollout losses and the loss
  for any labels and groups (degenerate ones included: all correct, all incorrect, singletons, no anchor at all)
  and |z| from 1e-30 to 1e30 (a float32 ||z||^2 would under- or overflow there; normalize rescales first)."""
  rng = np.random.default_rng(seed)
  z = (rng.normal(size=(N, 3)) * 10.0 ** log_scale).astype(np.float32)
  labels, groups = np.array(labels), np.array(groups)
  key = jax.random.PRNGKey(seed)
  results, drawn = every_option_on_host(z, labels, groups, key), jax.device_get(drawn_positives(labels, groups, key))
  names, got, want = [], [], []   # per option: the N per-rollout losses, then the loss
  for (objective, level, distance), (loss, _, m, _) in results.items():
    want_loss, want_per = np_loss(z, labels, groups, objective, level, distance, drawn[level])
    names.append(f"{objective}/{level}/{distance}")
    got.append(np.r_[m["per_rollout_loss"], loss])
    want.append(np.r_[want_per, want_loss])
  for k in np.flatnonzero(~np.isclose(got, want, rtol=1e-4, atol=1e-4).all(axis=1))[:1]:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=f"{names[k]}: L_1..L_N, loss")
