"""A tiny Flax LM and step-indexed random token batches for the generic train-loop tests."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.losses import get_loss

VOCAB, SEQ = 32, 8


class TinyLM(nn.Module):
  """Embedding -> dropout -> dense -> logits [B, S, VOCAB]."""

  @nn.compact
  def __call__(self, tokens, deterministic=True):
    x = nn.Embed(VOCAB, 16)(tokens)
    x = nn.Dropout(0.1)(x, deterministic=deterministic)
    x = nn.gelu(nn.Dense(16)(x))
    return nn.Dense(VOCAB)(x)


def tiny_loss_fn(params, batch, rng):
  """Dropout on iff rng is given."""
  logits = TinyLM().apply({"params": params}, batch["inputs"], deterministic=rng is None,
                          rngs=None if rng is None else {"dropout": rng})
  return get_loss("lm", "lm_cross_entropy")(logits, batch["targets"], batch["weights"], z_loss=1e-3)


def tiny_params(seed=0):
  return TinyLM().init(jax.random.PRNGKey(seed), jnp.zeros((1, SEQ), jnp.int32))["params"]


def batch_for_step(step, batch_size=8, seed=0):
  """The batch for `step` depends only on (seed, step), like jaxpt.data's train_batches; some tokens padded."""
  rng = np.random.default_rng([seed, step])
  tokens = rng.integers(0, VOCAB, size=(batch_size, SEQ + 1)).astype(np.int32)
  tokens[:, 1::2] = (tokens[:, :-1:2] + 1) % VOCAB  # a learnable pattern
  weights = (rng.random((batch_size, SEQ)) > 0.2).astype(np.float32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}


def batches_from(start, batch_size=8):
  step = start
  while True:
    yield batch_for_step(step, batch_size)
    step += 1
