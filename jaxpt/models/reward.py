"""Reward model: any jaxpt transformer backbone + a bias-free linear score head on the last non-pad token.

    hidden_all = TransformerLM(tokens, return_hidden=True)[1]      final-norm hidden states [batch, seq, d_model]
    hidden     = hidden_all[b, last_index[b]]                      [batch, d_model]
    scores     = float32(hidden) W,  W [d_model, num_scores]       [batch] (num_scores = 1) or [batch, num_scores]

The backbone is a submodule named `backbone`, so its parameter tree is exactly a `TransformerLM`'s (a pretrain /
SFT run's params initialise it: `jaxpt.trainers.rm.load_backbone_params`). The LM logits the backbone also returns
are never used: under jit XLA removes the [tokens, d] x [d, vocab] head matmul (tests/test_models_reward.py checks
the compiled FLOP count). ODIN uses num_scores = 2: column 0 is the quality head r_Q, column 1 the length head r_L.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn.dense import Dense
from jaxpt.nn.lora import LoRA


def gather_last(hidden: jax.Array, last_index: jax.Array) -> jax.Array:
  """`hidden [batch, seq, d], last_index int [batch] -> hidden[b, last_index[b]] [batch, d]`."""
  index = jnp.asarray(last_index, jnp.int32)[:, None, None]
  return jnp.take_along_axis(hidden, index, axis=1)[:, 0]


class RewardModel(nn.Module):
  """`__call__(tokens [B, S], last_index [B]) -> (scores [B] or [B, num_scores], hidden [B, d_model])`.

  `features` and `score` are the two halves (backbone + gather; head), for trainers that differentiate them
  separately. Scores and the head are float32 whatever the backbone's compute dtype. `lora`: the backbone's
  adapters (`jaxpt.nn.lora`; the head is never adapted).
  """

  config: ModelConfig
  num_scores: int = 1
  lora: LoRA | None = None

  def setup(self):
    self.backbone = TransformerLM(self.config, lora=self.lora)
    self.head = Dense((self.num_scores,), ("embed", None), dtype=jnp.float32, param_dtype=jnp.float32)

  def features(self, tokens: jax.Array, last_index: jax.Array, deterministic: bool = True) -> jax.Array:
    """Final-norm hidden state of token `last_index[b]` of each row: [B, d_model] (compute dtype)."""
    _, hidden = self.backbone(tokens, deterministic=deterministic, return_hidden=True)
    return gather_last(hidden, last_index)

  def score(self, hidden: jax.Array) -> jax.Array:
    """[B, d_model] -> float32 scores [B] (num_scores = 1) or [B, num_scores]."""
    scores = self.head(hidden.astype(jnp.float32))
    return scores[:, 0] if self.num_scores == 1 else scores

  def __call__(self, tokens: jax.Array, last_index: jax.Array,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    hidden = self.features(tokens, last_index, deterministic)
    return self.score(hidden), hidden
