"""PPO's update gradient (`jaxpt.trainers.ppo.sequenced_grad_fn`): the critic's gradient, then the policy's under a
`lax.cond`, equal to the gradient of the summed loss, and compiled with one model's activations live at a time (the
d512 benchmark's update was OOM-killed when jax.grad of the sum held both)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.models.config import ModelConfig
from jaxpt.parallel import compiled_memory
from jaxpt.trainers.ppo import PolicyAndCritic, loss_parts, sequenced_grad_fn
from jaxpt.trainers.ppo_config import PPOConfig

# activations (rows x (P + T) x mlp_dim per layer) dominate the params here, as at the benchmark's d512 point
MODEL = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=2, num_kv_heads=2, mlp_dim=128, max_seq_len=64)
ROWS, P, T = 16, 16, 48


def minibatch(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  prompt_mask = np.ones((ROWS, P), np.int32)
  prompt_mask[:, :3] = 0  # left padding
  mask = (np.arange(T)[None] < rng.integers(T // 2, T + 1, ROWS)[:, None]).astype(np.float32)
  f = lambda scale: (scale * rng.standard_normal((ROWS, T))).astype(np.float32) * mask
  return {"prompt_tokens": rng.integers(1, MODEL.vocab_size, (ROWS, P)).astype(np.int32) * prompt_mask,
          "prompt_mask": prompt_mask, "tokens": rng.integers(1, MODEL.vocab_size, (ROWS, T)).astype(np.int32),
          "mask": mask, "old_logp": f(0.3) - 4.2, "old_values": f(0.5), "advantages": f(1.0), "returns": f(1.0)}


@pytest.fixture(scope="module")
def compiled():
  """(params, minibatch, {name: compiled fn}): the sequenced gradient and the summed loss's jax.grad, each compiled
  once for the module; random params of PolicyAndCritic's shapes (norm scales near 1)."""
  shapes = jax.eval_shape(PolicyAndCritic(MODEL, MODEL).init, jax.random.PRNGKey(0), jnp.zeros((1, P), jnp.int32))
  rng = np.random.default_rng(1)
  params = jax.tree_util.tree_map_with_path(
      lambda path, s: (float("scale" in jax.tree_util.keystr(path)) + 0.05 * rng.standard_normal(s.shape)).astype(
          s.dtype), nn.meta.unbox(shapes["params"]))
  batch = minibatch()
  policy_part, value_part = loss_parts(MODEL, MODEL, PPOConfig(value_clip=0.2), temperature=1.0)
  sequenced = sequenced_grad_fn(policy_part, value_part)

  def summed(params, batch):
    (pg, _), (vl, _) = policy_part(params["policy"], batch), value_part(params["critic"], batch)
    return pg + vl

  fns = {"sequenced": (lambda p, b: sequenced(p, None, b, jax.random.PRNGKey(1)), params),
         "summed": (jax.grad(summed), params)}
  return params, batch, {k: jax.jit(fn).lower(p, batch).compile() for k, (fn, p) in fns.items()}


def test_gradient_is_the_summed_losses(compiled):
  params, batch, fns = compiled
  grads, aux, metrics = fns["sequenced"](params, batch)
  want = fns["summed"](params, batch)
  assert aux is None and np.isfinite(metrics["loss"])
  np.testing.assert_allclose(metrics["loss"], metrics["pg_loss"] + metrics["value_loss"], rtol=1e-6)
  flat_got, flat_want = jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree_util.tree_flatten_with_path(want)[0]
  assert [k for k, _ in flat_got] == [k for k, _ in flat_want]
  for (path, g), (_, w) in zip(flat_got, flat_want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads["policy"]["decoder"]))


def test_one_models_activations_at_a_time(compiled):
  """The compiled temporaries of the sequenced gradient are about one model's (policy and critic are the same size
  here), where jax.grad of the sum holds both models' activations at once."""
  temp = {k: compiled_memory(fn)["temp_mib"] for k, fn in compiled[2].items()}
  assert temp["sequenced"] < 0.65 * temp["summed"], temp


def test_a_nonfinite_critic_gradient_makes_the_step_nonfinite(compiled):
  params, batch, fns = compiled
  bad = jax.tree.map(np.copy, params)
  bad["critic"]["head"]["kernel"][0, 0] = np.nan
  grads, _, _ = fns["sequenced"](bad, batch)
  assert all(np.all(np.isnan(np.asarray(g))) for g in jax.tree.leaves(grads["policy"]))


def test_lora_gradient_is_the_summed_losses_on_the_trainable_part():
  """With LoRA on a QLoRA int8 base (int codes: `allow_int`) the sequenced gradient's trainable part (both models'
  adapters, the critic's value head) is the summed loss's, and its frozen policy leaves are zeros."""
  from jaxpt.engine.builder import lora_trainable
  from jaxpt.engine.state import trainable_part
  from jaxpt.nn.lora import LoRAConfig
  from jaxpt.trainers.ppo import CRITIC_HEAD

  lora = LoRAConfig(rank=4, alpha=8.0, base_quant="int8", base_quant_block=16).spec()
  shapes = jax.eval_shape(PolicyAndCritic(MODEL, MODEL, lora).init, jax.random.PRNGKey(0), jnp.zeros((1, P), jnp.int32))
  rng = np.random.default_rng(2)

  def leaf(path, s):
    if jnp.issubdtype(s.dtype, jnp.integer):
      return rng.integers(-127, 128, s.shape).astype(s.dtype)
    if "kernel_scale" in jax.tree_util.keystr(path):  # dequantized kernels of about 0.05 a weight
      return np.full(s.shape, 0.05 / 127, s.dtype)
    return (float("['scale']" in jax.tree_util.keystr(path)) + 0.05 * rng.standard_normal(s.shape)).astype(s.dtype)

  params = jax.tree_util.tree_map_with_path(leaf, nn.meta.unbox(shapes["params"]))
  batch = minibatch(3)
  policy_part, value_part = loss_parts(MODEL, MODEL, PPOConfig(value_clip=0.2), 1.0, lora)
  sequenced = sequenced_grad_fn(policy_part, value_part, lora=True)

  def summed(params, batch):
    (pg, _), (vl, _) = policy_part(params["policy"], batch), value_part(params["critic"], batch)
    return pg + vl

  grads, _, metrics = jax.jit(lambda p, b: sequenced(p, None, b, jax.random.PRNGKey(1)))(params, batch)
  want = jax.jit(jax.grad(summed, allow_int=True))(params, batch)
  trainable = lora_trainable(params, (CRITIC_HEAD,))
  got_part, want_part = trainable_part(grads, trainable), trainable_part(want, trainable)
  flat_got, flat_want = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (got_part, want_part))
  assert [k for k, _ in flat_got] == [k for k, _ in flat_want] and np.isfinite(metrics["loss"])
  assert {"lora_a", "lora_b", "kernel"} == {path[-1].key for path, _ in flat_got}  # adapters + the value head
  for (path, g), (_, w) in zip(flat_got, flat_want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  assert all(np.any(np.asarray(g) != 0) for _, g in flat_got)
  frozen = [g for g, train in zip(jax.tree.leaves(grads["policy"]), jax.tree.leaves(trainable["policy"])) if not train]
  assert frozen and all(not np.any(np.asarray(g)) for g in frozen)
