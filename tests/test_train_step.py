"""Generic train step: gradient accumulation equivalence; optimizer schedule and weight-decay mask."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpt.engine.optim import clip_by_global_norm, decay_mask, make_optimizer, make_schedule
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import accumulate_gradients, make_train_step
from jaxpt.losses import get_loss
from tests.test_train_fixtures import TinyLM, batch_for_step, tiny_params


def optim_config(**overrides):
  fields = dict(learning_rate=1e-2, warmup_steps=10, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
                weight_decay=0.1, grad_clip=1.0, grad_accum_steps=1)
  fields.update(overrides)
  return ml_collections.ConfigDict(fields)


@pytest.mark.parametrize("num_micro", [2, 4])
def test_accumulated_gradients_equal_full_batch(num_micro):
  params = tiny_params()
  batch = batch_for_step(3)
  batch["weights"][:4] = 0.0  # whole micro-batches of padding must not skew the mean
  batch["weights"][4, :5] = 0.0
  rng = jax.random.PRNGKey(1)
  det_loss = lambda p, b, r: _det_loss(p, b)
  full_grads, full_metrics = accumulate_gradients(det_loss, params, batch, rng, 1)
  acc_grads, acc_metrics = jax.jit(accumulate_gradients, static_argnums=(0, 4))(det_loss, params, batch, rng,
                                                                               num_micro)
  for g_full, g_acc in zip(jax.tree.leaves(full_grads), jax.tree.leaves(acc_grads)):
    np.testing.assert_allclose(g_acc, g_full, rtol=2e-5, atol=1e-7)
  for key in ("loss", "nll", "accuracy", "num_tokens"):
    np.testing.assert_allclose(acc_metrics[key], full_metrics[key], rtol=1e-5)


def _det_loss(params, batch):
  logits = TinyLM().apply({"params": params}, batch["inputs"], deterministic=True)
  return get_loss("lm", "lm_cross_entropy")(logits, batch["targets"], batch["weights"], z_loss=1e-3)


def test_train_step_with_accumulation_equals_one_step():
  """Two SGD steps with accum 4 over B=8 match two steps over the same B (dropout off)."""
  loss_fn = lambda p, b, r: _det_loss(p, b)
  opt = optax.sgd(0.5)
  schedule = lambda step: 0.5
  results = []
  for accum in (1, 4):
    step = jax.jit(make_train_step(loss_fn, opt, schedule, grad_accum_steps=accum))
    state = TrainState.create(tiny_params(), opt, jax.random.PRNGKey(0))
    for k in range(2):
      state, metrics = step(state, batch_for_step(k))
    results.append((state, metrics))
  (s1, m1), (s4, m4) = results
  assert int(s1.step) == int(s4.step) == 2
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)


def test_accumulation_rejects_indivisible_batch():
  with pytest.raises(ValueError, match="grad_accum_steps=3"):
    accumulate_gradients(lambda p, b, r: _det_loss(p, b), tiny_params(), batch_for_step(0), None, 3)


def test_schedule_warmup_then_cosine_to_end_fraction():
  schedule = make_schedule(optim_config(), total_steps=100)
  np.testing.assert_allclose([schedule(0), schedule(5), schedule(10), schedule(100)],
                             [0.0, 5e-3, 1e-2, 1e-3], rtol=1e-5, atol=1e-9)
  assert schedule(55) < schedule(20)


def test_decay_mask_skips_norms_biases_and_scanned_scales():
  boxed = {
      "scale": nn.Partitioned(jnp.ones((3, 4)), names=("layers", "embed")),
      "kernel": nn.Partitioned(jnp.ones((3, 4, 5)), names=("layers", "embed", "mlp")),
      "embedding": nn.Partitioned(jnp.ones((7, 4)), names=("vocab", "embed")),
      "bias": jnp.ones((5,)),
      "plain": jnp.ones((4, 5)),
      # mHC's per-stream norm scale [n, d_model] and the bias of its residual map's logits [n, n]
      "stream_norm_scale": nn.Partitioned(jnp.ones((3, 2, 4)), names=("layers", None, "embed")),
      "bias_res": nn.Partitioned(jnp.ones((3, 2, 2)), names=("layers", None, None)),
      "phi": nn.Partitioned(jnp.ones((3, 2, 4, 8)), names=("layers", None, "embed", None)),
  }
  assert decay_mask(boxed) == {"scale": False, "kernel": True, "embedding": True, "bias": False, "plain": True,
                               "stream_norm_scale": False, "bias_res": False, "phi": True}


def test_adamw_decays_only_masked_params_and_clips():
  params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
  opt, _ = make_optimizer(optim_config(warmup_steps=0, learning_rate=0.1, weight_decay=0.5), total_steps=10)
  state = opt.init(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = opt.update(zero, state, params)
  np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)  # decay only
  np.testing.assert_array_equal(updates["b"], 0.0)
  for clip, want_norm in ((1.0, 1.0), (0.0, 200.0)):  # 0 = no clipping; global norm of the grads is 200
    clip_opt, _ = make_optimizer(optim_config(grad_clip=clip), total_steps=10)
    _, new_state = clip_opt.update({"w": jnp.full((2, 2), 100.0), "b": jnp.zeros(2)}, clip_opt.init(params),
                                   params)
    mu = optax.tree_utils.tree_get(new_state, "mu")  # (1 - b1) * the (clipped) gradient
    np.testing.assert_allclose(optax.global_norm(mu), 0.1 * want_norm, rtol=1e-5)


def test_nonfinite_step_is_flagged_and_skipped_when_asked():
  """A batch whose loss is NaN sets `nonfinite`; with skip_nonfinite the params and optimizer state stay put."""
  def loss_fn(p, b, r):
    loss, metrics = _det_loss(p, b)
    loss = loss * jnp.where(b["poison"], jnp.nan, 1.0)  # NaN loss and NaN gradients
    return loss, dict(metrics, loss=loss)

  opt = optax.adam(1e-2)
  good, bad = dict(batch_for_step(0), poison=False), dict(batch_for_step(0), poison=True)
  for skip in (False, True):
    step = jax.jit(make_train_step(loss_fn, opt, lambda s: 1e-2, skip_nonfinite=skip))
    state = TrainState.create(tiny_params(), opt, jax.random.PRNGKey(0))
    state, metrics = step(state, good)
    assert float(metrics["nonfinite"]) == 0.0
    after, metrics = step(state, bad)
    assert float(metrics["nonfinite"]) == 1.0 and int(after.step) == 2
    leaves = jax.tree.leaves((after.params, after.opt_state))
    if skip:
      for got, want in zip(leaves, jax.tree.leaves((state.params, state.opt_state))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    else:
      assert not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(after.params))


@settings(max_examples=30, deadline=None)
@given(st.floats(0.01, 100.0), st.integers(0, 2 ** 31 - 1))
def test_clip_by_global_norm_is_the_plain_clip_and_agrees_with_optax(max_norm, seed):
  """g min(1, max_norm / ||g||) over a two-leaf tree, against float64 NumPy; below the threshold the gradients come
  back bitwise, and optax's clip agrees (its state too: the same empty state, so checkpoints load either way)."""
  rng = np.random.default_rng(seed)
  grads = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
  clipped, state = clip_by_global_norm(max_norm).update(grads, clip_by_global_norm(max_norm).init(grads))
  norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in grads.values()))
  for name, g in grads.items():
    np.testing.assert_allclose(clipped[name], g * min(1.0, max_norm / norm), rtol=2e-6, atol=1e-7)
    if norm < max_norm:
      np.testing.assert_array_equal(clipped[name], g)
  optax_clip = optax.clip_by_global_norm(max_norm)
  theirs, their_state = optax_clip.update(grads, optax_clip.init(grads))
  assert jax.tree.structure(state) == jax.tree.structure(their_state)
  for name in grads:
    np.testing.assert_allclose(clipped[name], theirs[name], rtol=2e-6, atol=1e-7)


def test_clip_by_global_norm_leaves_a_nonfinite_gradient_nonfinite_as_optax_does():
  """A NaN or inf entry stays non-finite and the rest match optax's clip (the step's non-finite guard, which reads
  the gradient norm, then skips the step)."""
  for bad in (np.nan, np.inf):
    grads = {"w": np.array([bad, 1.0], np.float32)}
    clipped, _ = clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    theirs, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    assert not np.isfinite(np.asarray(clipped["w"][0]))
    np.testing.assert_array_equal(np.isfinite(clipped["w"]), np.isfinite(theirs["w"]))
    np.testing.assert_array_equal(np.asarray(clipped["w"])[1:], np.asarray(theirs["w"])[1:])
