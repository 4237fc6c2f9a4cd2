"""bf16 mixed precision (`--config.model.dtype=bfloat16`, `param_dtype` float32): the model computes in bf16 while
the parameters, their gradients and AdamW's moments stay float32 (no loss scaling: bf16 has float32's exponent),
and a short training run follows the float32 one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.engine.optim import OptimConfig, make_optimizer
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import make_train_step

TINY = ModelConfig(vocab_size=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=128,
                   max_seq_len=32)
OPTIM = OptimConfig(learning_rate=3e-3, warmup_steps=5, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
                    weight_decay=0.0, grad_clip=1.0)
STEPS, BATCH, SEQ = 40, 8, 32


def batch_for_step(step: int) -> dict:
  """A learnable stream: token t+1 = (3 * token t + 1) mod V, from a random first token per row."""
  first = np.random.default_rng(step).integers(0, TINY.vocab_size, (BATCH, 1))
  tokens = [first]
  for _ in range(SEQ):
    tokens.append((3 * tokens[-1] + 1) % TINY.vocab_size)
  tokens = np.concatenate(tokens, axis=1).astype(np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": np.ones((BATCH, SEQ), np.float32)}


def train(cfg: ModelConfig) -> tuple[list[float], TrainState]:
  optimizer, schedule = make_optimizer(OPTIM, total_steps=STEPS)
  state = TrainState.create(init_params(cfg, jax.random.PRNGKey(0)), optimizer, jax.random.PRNGKey(1))
  step = jax.jit(make_train_step(make_lm_loss_fn(TransformerLM(cfg)), optimizer, schedule))
  losses = []
  for i in range(STEPS):
    state, metrics = step(state, batch_for_step(i))
    losses.append(float(metrics["loss"]))
  return losses, state


@pytest.fixture(scope="module", params=["pre", "siamese_post_pre"])
def runs(request):
  cfg = dataclasses.replace(TINY, norm_scheme=request.param)
  return train(cfg), train(dataclasses.replace(cfg, dtype="bfloat16"))


def test_bf16_compute_keeps_float32_master_weights_and_optimizer_state(runs):
  _, (_, state16) = runs
  leaves = jax.tree_util.tree_leaves((state16.params, state16.opt_state))
  floats = [leaf for leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating)]
  assert floats and all(leaf.dtype == jnp.float32 for leaf in floats)


def test_bf16_loss_tracks_float32(runs):
  (losses32, _), (losses16, _) = runs
  assert losses32[-1] < 0.5 * losses32[0] and losses16[-1] < 0.5 * losses16[0]  # both learn the stream
  assert losses16 != losses32  # the compute is bf16: rounding shows
  np.testing.assert_allclose(losses16, losses32, rtol=0.01)  # measured: within 0.04% at every step
