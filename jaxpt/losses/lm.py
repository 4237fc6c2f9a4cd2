"""Language-model token cross-entropy with optional z-loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpt.losses.registry import register_loss


@register_loss("lm", "lm_cross_entropy")
def lm_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                     z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Weighted mean token NLL plus a z-loss, in float32.

  logits [B, S, V], targets int [B, S], weights [B, S] (0 = ignored token).
    lse_t  = logsumexp_v logits[t, v]
    nll_t  = lse_t - logits[t, targets_t]
    loss   = sum_t w_t nll_t / N  +  z_loss * sum_t w_t lse_t^2 / N,   N = sum_t w_t
  With N = 0 the loss is 0. Both terms are weighted means over the same tokens, so a loss over a batch equals the
  N-weighted mean of the losses over its micro-batches (gradient accumulation relies on this).
  Metrics: `loss`, `nll`, `z_loss` (the added term), `accuracy` (argmax == target), `num_tokens` (N).
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  nll = lse - target_logits
  num_tokens = jnp.sum(weights)
  denom = jnp.where(num_tokens > 0, num_tokens, 1.0)
  mean_nll = jnp.sum(weights * nll) / denom
  z_term = z_loss * jnp.sum(weights * jnp.square(lse)) / denom
  loss = mean_nll + z_term
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  metrics = {
      "loss": loss,
      "nll": mean_nll,
      "z_loss": z_term,
      "accuracy": jnp.sum(weights * correct) / denom,
      "num_tokens": num_tokens,
  }
  return loss, metrics
