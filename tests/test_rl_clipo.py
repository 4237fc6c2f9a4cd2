"""CLIPO trainer pieces: config validation, rollout representation, projection head, warm-up, head step, in-loss
term; the official conventions (github Qwen-Applications/CLIPO @ 13c5fd6; rt:LINE = verl/trainer/ppo/ray_trainer.py)
re-stated in plain NumPy."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import scipy.stats

from jaxpt.config import ConfigError, from_section
from jaxpt.losses import clipo as clipo_loss
from jaxpt.models.heads import ProjectionHead
from jaxpt.rl import clipo
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.state import TrainState

D_MODEL, OUT = 32, 16
LABELS = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0])
GROUPS = np.repeat(np.arange(3), 4)


# ------------------------------------------------------------------ config

def test_config_defaults_and_from_section():
  assert from_section(clipo.CLIPOConfig, None, "config.clipo") == clipo.CLIPOConfig()
  assert from_section(clipo.CLIPOConfig, ml_collections.ConfigDict(), "config.clipo") == clipo.CLIPOConfig()
  section = {"enabled": True, "head": "mlp", "out_dim": 64, "level": "batch_level", "in_loss_coef": 0.1,
             "objective": "supcon_in", "masked_label": -1, "critic_warmup": 3}
  c = from_section(clipo.CLIPOConfig, ml_collections.ConfigDict(section), "config.clipo")
  assert (c.enabled, c.head, c.out_dim, c.level, c.in_loss_coef, c.temperature) == (True, "mlp", 64, "batch_level",
                                                                                      0.1, 0.05)
  assert (c.objective, c.masked_label, c.critic_warmup) == ("supcon_in", -1, 3)
  assert c.loss_kwargs()["masked_label"] == -1
  d = clipo.CLIPOConfig()   # the official defaults (verl/trainer/config/model/hf_model.yaml:40-73)
  assert (d.head, d.out_dim, d.objective, d.distance, d.masked_label, d.level) == ("linear", 512, "infonce", "cosine",
                                                                                   0, "group_level")
  assert (d.reward_coef, d.reward_floor, d.learning_rate, d.weight_decay) == (0.2, -0.5, 1e-3, 0.01)
  hash(c)  # a static jit argument


@pytest.mark.parametrize("field,value", [
    ("enabled", 1), ("head", "conv"), ("out_dim", 0), ("out_dim", 2.5), ("temperature", 0.0),
    ("objective", "triplet"), ("level", "global"), ("distance", "l1"), ("reward_coef", -0.1),
    ("reward_floor", 0.5), ("reward_floor", float("-inf")), ("learning_rate", 0.0), ("weight_decay", -1.0),
    ("in_loss_coef", -0.5), ("in_loss_coef", "x"), ("critic_warmup", -1), ("critic_warmup", True),
    ("masked_label", 2), ("masked_label", True), ("bogus", 1)])
def test_config_errors_name_the_field(field, value):
  with pytest.raises(ConfigError, match=rf"^config\.clipo\.{field}"):
    from_section(clipo.CLIPOConfig, ml_collections.ConfigDict({field: value}), "config.clipo")


@pytest.mark.parametrize("field,value,message", [
    ("level", "group", "config.clipo.level='group': renamed to the official names: group -> group_level, "
     "batch -> cross_level, cross -> batch_level"),
    ("level", "batch", "config.clipo.level='batch': renamed"),
    ("level", "cross", "config.clipo.level='cross': renamed"),
    ("freeze_policy_steps", 1, "config.clipo.freeze_policy_steps=1: renamed: use critic_warmup = "
     "freeze_policy_steps + 1")])
def test_renamed_values_say_the_new_names(field, value, message):
  with pytest.raises(ConfigError, match=re.escape(message)) as e:
    from_section(clipo.CLIPOConfig, ml_collections.ConfigDict({field: value}), "config.clipo")
  assert "\n" not in str(e.value)


def test_warmup_boundary_is_the_official_critic_warmup():
  """rt:1516 `if critic_warmup <= global_steps: update_actor`, global_steps = 1 at the first step (rt:1244, 1267);
  jaxpt's trainer updates at its 0-based step s iff s >= frozen_steps (jaxpt/trainers/grpo.py)."""
  for warmup in range(6):
    c = clipo.CLIPOConfig(critic_warmup=warmup)
    official = [warmup <= global_step for global_step in range(1, 9)]
    assert [step >= c.frozen_steps for step in range(8)] == official, warmup
  assert clipo.CLIPOConfig(critic_warmup=14).frozen_steps == 13   # scripts/train_gsm8k.sh:43


# ------------------------------------------------------------------ representation and head

def np_official_pooling(hidden, mask):
  """The patched SGLang decode loop (modified/scheduler_output_processor_mixin.py:271-278, the prefill branch :113
  disabled), in float64: decode step k = 1..L-1 feeds response token k-1, whose hidden state (jaxpt's column k, the
  state that sampled token k) is added; when the request finishes the sum is divided by len(output_ids) = L. A
  request that ends at prefill (L = 1) never adds anything (0 here)."""
  out = np.zeros((hidden.shape[0], hidden.shape[2]))
  for i in range(hidden.shape[0]):
    length = int(mask[i].sum())
    acc = []
    for k in range(1, length):           # one decode step per token after the first
      acc = hidden[i, k].astype(np.float64).copy() if len(acc) == 0 else acc + hidden[i, k]
    if len(acc):
      out[i] = acc / length
  return out


def test_rollout_representation_is_the_official_pooling():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(5, 6, 5)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0] * 6],
                  np.float32)
  hidden[mask == 0] = np.nan  # padding may hold anything
  want = np_official_pooling(np.nan_to_num(hidden), mask)
  np.testing.assert_allclose(want[0], (hidden[0, 1] + hidden[0, 2]) / 3, rtol=1e-6)   # 1..L-1 over L
  got = clipo.rollout_representation(jnp.asarray(hidden, jnp.bfloat16).astype(jnp.float32), mask)
  np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
  np.testing.assert_allclose(clipo.rollout_representation(hidden, mask), want, rtol=1e-6, atol=1e-6)
  g = jax.grad(lambda h: clipo.rollout_representation(h, mask).sum())(jnp.asarray(np.nan_to_num(hidden)))
  weights = mask / np.maximum(mask.sum(1, keepdims=True), 1)
  weights[:, 0] = 0.0   # the last prompt token's state never counts
  np.testing.assert_allclose(g, np.broadcast_to(weights[..., None], g.shape), rtol=1e-6)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_projection_head_matches_numpy(kind):
  x = np.random.default_rng(1).normal(size=(5, D_MODEL)).astype(np.float32)
  head = ProjectionHead(out_dim=OUT, kind=kind)
  variables = head.init(jax.random.PRNGKey(0), jnp.asarray(x, jnp.bfloat16))
  names = {"/".join(k.key for k in path): leaf.names for path, leaf in
           jax.tree_util.tree_leaves_with_path(variables["params"], is_leaf=lambda v: isinstance(v, nn.Partitioned))}
  p = nn.meta.unbox(variables["params"])
  assert all(v.dtype == jnp.float32 for v in jax.tree_util.tree_leaves(p))
  z = head.apply({"params": p}, jnp.asarray(x, jnp.bfloat16))
  assert z.shape == (5, OUT) and z.dtype == jnp.float32
  xb = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), np.float64)
  if kind == "linear":
    assert names == {"proj/kernel": ("embed", "clipo_proj")}
    want = xb @ np.asarray(p["proj"]["kernel"])
  else:  # rt:91-95 with bias=False (the default of rt:80, not overridden at rt:1013-1017): no bias anywhere
    assert names == {"fc1/kernel": ("embed", "clipo_hidden"), "fc2/kernel": ("clipo_hidden", "clipo_proj")}
    assert p["fc1"]["kernel"].shape == (D_MODEL, D_MODEL)   # hidden = llm_hidden_size (rt:92)
    want = np.maximum(xb @ np.asarray(p["fc1"]["kernel"]), 0.0) @ np.asarray(p["fc2"]["kernel"])
  np.testing.assert_allclose(z, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_projection_head_init_is_torch_linear_default(kind):
  """torch.nn.Linear.reset_parameters: kaiming_uniform_(W, a=sqrt(5)) -> U(-b, b), b = gain sqrt(3 / fan_in) with
  gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), i.e. b = 1/sqrt(fan_in), std b / sqrt(3) (jaxpt's Dense: 1/sqrt(fan_in))."""
  fan_in, out = 256, 384
  p = nn.meta.unbox(ProjectionHead(out_dim=out, kind=kind).init(jax.random.PRNGKey(3), jnp.zeros((1, fan_in)))[
      "params"])
  for w in jax.tree_util.tree_leaves(p):
    w = np.asarray(w, np.float64)
    bound = np.sqrt(2.0 / (1.0 + 5.0)) * np.sqrt(3.0 / w.shape[0])   # gain(a = sqrt(5)) * sqrt(3 / fan_in)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.999 * bound
    assert abs(w.std() / (bound / np.sqrt(3.0)) - 1.0) < 0.01   # n >= 98304 draws: the std's own error ~ 0.3%
    assert abs(w.mean()) < 0.01 * bound
    assert scipy.stats.kstest(w.ravel(), "uniform", args=(-bound, 2 * bound)).pvalue > 1e-3


# ------------------------------------------------------------------ head step

def synthetic_reps(seed=0, noise=0.3):
  """Correct rollouts near +mu, incorrect near -mu, plus noise: separable by label."""
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=D_MODEL)
  sign = np.where(LABELS > 0, 1.0, -1.0)[:, None]
  return (sign * mu + noise * rng.normal(size=(len(LABELS), D_MODEL)) + rng.normal(size=D_MODEL)).astype(np.float32)


@pytest.fixture(scope="module", params=["linear", "mlp"])
def head_setup(request):
  config = clipo.CLIPOConfig(enabled=True, head=request.param, out_dim=OUT)
  return config, clipo.init_head_state(config, D_MODEL, jax.random.PRNGKey(0))


def test_head_step_rewards_come_from_the_pre_update_head(head_setup):
  config, state = head_setup
  reps, key = synthetic_reps(), jax.random.PRNGKey(7)
  new_state, rewards, metrics = clipo.head_step(config, state, reps, LABELS, GROUPS, key)

  @jax.jit
  def rewards_with(params):
    z = config.head_module().apply({"params": params}, reps)
    _, m = clipo_loss.contrastive_loss(z, LABELS, GROUPS, key)
    return clipo_loss.contrastive_reward(m["per_rollout_loss"], LABELS), m

  before, m_before = rewards_with(state.params)
  after, _ = rewards_with(new_state.params)
  before, after = np.asarray(before), np.asarray(after)
  np.testing.assert_allclose(rewards, before, rtol=1e-5, atol=1e-6)
  assert np.abs(after - before).max() > 1e-4  # the update changed the head, so the post-update rewards differ
  np.testing.assert_allclose(metrics["loss"], m_before["loss"], rtol=1e-5)
  assert float(metrics["num_anchors"]) == float(m_before["num_anchors"]) > 0
  assert np.all(rewards <= 0) and np.all(rewards >= -0.5) and np.all(rewards[LABELS == 0] == 0)


def test_head_step_is_one_adamw_step_on_the_head_loss(head_setup):
  config, state = head_setup
  reps, key = synthetic_reps(), jax.random.PRNGKey(3)

  def loss_of(params):
    z = config.head_module().apply({"params": params}, reps)
    return clipo_loss.contrastive_loss(z, LABELS, GROUPS, key)[0]

  grads = jax.jit(jax.grad(loss_of))(state.params)
  # AdamW's first step from zero moments: p - lr * (g / (|g| + eps) + wd * p)   (bias-corrected m / sqrt(v))
  want = jax.tree_util.tree_map(lambda p, g: p - 1e-3 * (g / (np.abs(g) + 1e-8) + 0.01 * p), state.params, grads)
  new_state, _, _ = clipo.head_step(config, state, reps, LABELS, GROUPS, key)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), new_state.params, want)
  assert int(new_state.opt_state[0].count) == 1
  # only the head moves: no gradient reaches the representations through the rewards or the new head
  def through(r):
    s, rew, _ = clipo.head_step(config, state, r, LABELS, GROUPS, key)
    return jnp.sum(rew) + sum(jnp.sum(v) for v in jax.tree_util.tree_leaves(s.params))
  np.testing.assert_array_equal(jax.jit(jax.grad(through))(jnp.asarray(reps)), 0.0)


def test_head_loss_decreases_on_separable_reps(head_setup):
  config, state = head_setup
  reps = synthetic_reps(seed=1, noise=1.0)
  losses = []
  for _ in range(20):  # one key: the same positive draws every step, so the objective is one fixed function
    state, _, metrics = clipo.head_step(config, state, reps, LABELS, GROUPS, jax.random.PRNGKey(0))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.3 * losses[0] and losses[-1] < losses[-2] < losses[-3], losses
  assert float(metrics["pos_sim"]) > float(metrics["neg_sim"])


def test_head_step_without_anchors_leaves_rewards_zero(head_setup):
  config, state = head_setup
  labels = np.ones_like(LABELS)  # all correct: no anchor anywhere
  new_state, rewards, metrics = clipo.head_step(config, state, synthetic_reps(), labels, GROUPS, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(rewards, 0.0)
  assert float(metrics["loss"]) == 0.0 and float(metrics["head_grad_norm"]) == 0.0
  assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(new_state.params))


# ------------------------------------------------------------------ in-loss variant

def test_in_loss_term_gradient_reaches_hidden_not_the_head(head_setup):
  config, state = head_setup
  rng = np.random.default_rng(2)
  t = 5
  hidden = rng.normal(size=(len(LABELS), t, D_MODEL)).astype(np.float32)
  mask = (rng.random((len(LABELS), t)) < 0.7).astype(np.float32)
  mask[:, 0] = 1
  key = jax.random.PRNGKey(9)
  fn = lambda p, h: clipo.in_loss_term(config, p, h, mask, LABELS, GROUPS, key)
  (loss, metrics), (g_head, g_hidden) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
      state.params, hidden)
  z = config.head_module().apply({"params": state.params}, np.asarray(clipo.rollout_representation(hidden, mask)))
  np.testing.assert_allclose(loss, jax.jit(clipo_loss.contrastive_loss)(z, LABELS, GROUPS, key)[0], rtol=1e-5)
  assert float(metrics["in_num_anchors"]) > 0
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree_util.tree_leaves(g_head))
  g_hidden = np.asarray(g_hidden)
  assert np.abs(g_hidden[mask > 0]).max() > 0
  np.testing.assert_array_equal(g_hidden[mask == 0], 0.0)


def test_head_state_round_trips_through_a_checkpoint_in_train_state_aux(tmp_path):
  config = clipo.CLIPOConfig(enabled=True, head="mlp", out_dim=OUT)
  head = clipo.init_head_state(config, D_MODEL, jax.random.PRNGKey(0))
  head, _, _ = clipo.head_step(config, head, synthetic_reps(), LABELS, GROUPS, jax.random.PRNGKey(1))
  policy = {"w": jnp.ones((3,))}
  state = TrainState.create(policy, optax.sgd(0.1), jax.random.PRNGKey(2), aux={"clipo": head})
  ckpt = Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(state)
  template = TrainState.create(policy, optax.sgd(0.1), jax.random.PRNGKey(2),
                               aux={"clipo": clipo.init_head_state(config, D_MODEL, jax.random.PRNGKey(5))})
  restored = ckpt.restore_latest(template)
  ckpt.close()
  assert isinstance(restored.aux["clipo"], clipo.CLIPOHeadState)
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored.aux["clipo"], head)
