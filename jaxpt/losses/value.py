"""PPO with a learned critic, on arrays: the KL-shaped per-token reward, GAE, advantage whitening, the clipped value
loss (a `value` loss, the kind of its own critics' losses have) and the token-level advantage estimators
(`TOKEN_ADVANTAGES`: `gae`; GRPO's `ADVANTAGES` map one reward per rollout to one advantage per rollout, GAE maps
per-token rewards and values to per-token advantages and returns).

Conventions (as `jaxpt.losses.grpo`): per-token tensors are `[batch, seq]` over the RESPONSE positions; `mask[b, t]`
is 1 on real response tokens (the sampler's, EOS included) and 0 on padding; `values[b, t]` is the critic's V(s_t),
the value of the state response token t is sampled from (the prefix up to token t - 1: the hidden state at the
column whose logits predict token t, as trl's `values[:, context_length - 1 : -1]` and OpenRLHF's critic).
Everything is float32; advantages and returns are data (no gradient flows through them). Where the issue is silent
the conventions are OpenRLHF's (`openrlhf/models/utils.py` compute_reward, `openrlhf/trainer/ppo_utils/
experience_maker.py` get_advantages_and_returns, `openrlhf/models/loss.py` ValueLoss) and trl's (`trl/trainer/
ppo_trainer.py`, `masked_whiten`); each function says which.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses.grpo import aggregate, masked_mean, reward_kl
from jaxpt.losses.registry import register_loss
from jaxpt.registry import Registry

WHITEN_EPS = 1e-8   # (A - mean) / sqrt(var + eps), trl's masked_whiten

# name -> f(rewards [B, T], values [B, T], mask [B, T], **kw) -> (advantages [B, T], returns [B, T])
TOKEN_ADVANTAGES: Registry = Registry("token advantage estimator")


def last_token_index(mask: jax.Array) -> jax.Array:
  """int32 [batch]: the column of each row's last unmasked position (0 for a row with none)."""
  m = jnp.asarray(mask) != 0
  columns = jnp.arange(m.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(m, columns, 0), axis=-1).astype(jnp.int32)


def kl_shaped_rewards(scores: jax.Array, logp: Optional[jax.Array], ref_logp: Optional[jax.Array], mask: jax.Array,
                      kl_coef: float = 0.0, kind: str = "k1") -> jax.Array:
  """PPO's per-token reward: the sequence score at the response's last token minus the per-token KL to the
  reference (InstructGPT; OpenRLHF's compute_reward):

    r_bt = [t = last_b] score_b - kl_coef * m_bt kl_bt,    kl = `grpo.reward_kl(logp, ref_logp, mask, kind)`

  scores [batch] (the assembled reward of each rollout); logp, ref_logp, mask [batch, seq] -> float32 [batch, seq],
  0 on masked positions; last_b the last unmasked column (`last_token_index`; a row with no token gets nothing).
  kind k1 | k2 | k3 (OpenRLHF's and trl's default is k1). With ref_logp None (or kl_coef 0) the KL term is off.
  The row sum is GRPO's KL-in-the-reward sequence reward (`grpo.kl_penalized_rewards`): one mechanism.
  """
  m = jnp.asarray(mask, jnp.float32)
  last = last_token_index(m)
  has_token = jnp.sum(m, axis=-1) > 0
  columns = jnp.arange(m.shape[-1], dtype=jnp.int32)[None, :]
  at_last = (columns == last[:, None]) & has_token[:, None]
  rewards = jnp.where(at_last, jnp.asarray(scores, jnp.float32)[:, None], 0.0)
  if ref_logp is not None and kl_coef != 0:
    rewards = rewards - kl_coef * reward_kl(logp, ref_logp, m, kind)
  return jax.lax.stop_gradient(rewards)


@TOKEN_ADVANTAGES.register("gae")
def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation (Schulman et al. 2016) over each row's response tokens, a reverse
  `jax.lax.scan` over the columns:

    over the unmasked columns t of a row, in order, with t' the next unmasked column after t:
      V_next_t = V_t'  (0 after the row's last token: the episode ends there, no bootstrap)
      delta_t  = r_t + gamma V_next_t - V_t
      A_t      = delta_t + gamma lam A_t'              (A after the last token: 0)
      R_t      = A_t + V_t                             (the critic's regression target, the lambda-return)
    masked columns: A = R = 0; they are skipped (the carry passes over them unchanged)

  rewards, values, mask [batch, seq] -> (advantages, returns) float32 [batch, seq], no gradient. On a mask that is a
  prefix of each row (the sampler's) this is OpenRLHF's get_advantages_and_returns (which zeroes masked rewards and
  values and runs over every column); skipping masked columns makes the result independent of where padding columns
  sit. gamma = lam = 1 gives returns = suffix sums of the rewards and A_t = R_t - V_t.
  """
  m = jnp.asarray(mask, jnp.float32)
  live = m != 0
  r = jnp.where(live, jnp.asarray(rewards, jnp.float32), 0.0)
  v = jnp.where(live, jnp.asarray(values, jnp.float32), 0.0)

  def body(carry, column):
    next_value, next_adv = carry
    r_t, v_t, live_t = column
    delta = r_t + gamma * next_value - v_t
    adv = delta + gamma * lam * next_adv
    adv = jnp.where(live_t, adv, 0.0)
    carry = (jnp.where(live_t, v_t, next_value), jnp.where(live_t, adv, next_adv))
    return carry, adv

  zeros = jnp.zeros(m.shape[:1], jnp.float32)
  _, adv = jax.lax.scan(body, (zeros, zeros), (r.T, v.T, live.T), reverse=True)
  advantages = adv.T
  returns = jnp.where(live, advantages + v, 0.0)
  return jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(returns)


def whiten(values: jax.Array, mask: jax.Array, shift_mean: bool = True, eps: float = WHITEN_EPS) -> jax.Array:
  """Advantage whitening over the masked tokens (trl's masked_whiten, then masked positions set to 0):

    mu = sum_t m x / N,   var = sum_t m (x - mu)^2 / (N - 1)   (unbiased; N = sum m; N <= 1: var 0)
    out = (x - mu) / sqrt(var + eps)  (+ mu when not shift_mean),   0 where m = 0

  values, mask [batch, seq] (or any matching shapes) -> float32, the same shape. No gradient is meant to flow.
  """
  x = jnp.asarray(values, jnp.float32)
  m = jnp.asarray(mask, jnp.float32)
  n = jnp.sum(m)
  mean = masked_mean(x, m)
  centred = jnp.where(m != 0, x - mean, 0.0)
  var = jnp.sum(m * jnp.square(centred)) / jnp.where(n > 1, n - 1, 1.0)
  out = centred * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(m != 0, out, 0.0)


@register_loss("value", "clipped_value")
def clipped_value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
                       clip: Optional[float] = 0.2, agg: str = "token-mean",
                       max_tokens: Optional[int] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO's clipped value loss (OpenRLHF ValueLoss, trl's vf_loss):

    V_clip = V_old + clip(V - V_old, -clip, clip)
    l_t    = max((V - R)^2, (V_clip - R)^2)                 (clip None: l_t = (V - R)^2)
    loss   = 0.5 agg(l)                                      (agg over `mask`: `grpo.aggregate`)

  values (the critic's, differentiable), old_values (the critic's at rollout time), returns (GAE's lambda-returns),
  mask [B, T]. Masked positions are zeroed first, so whatever they hold gets zero gradient. The gradient is
  (V - R) where the unclipped term is the max or V is inside the clip range, else 0 (the clipped branch is flat in
  V). Metrics: `value_loss`, `vf_clip_frac` (token-mean of |V - V_old| > clip with the clipped term the larger: no
  gradient), `value_mean`, `returns_mean`, `value_error` (token-mean of (V - R)^2), `loss`.
  """
  m = jnp.asarray(mask, jnp.float32)
  v, v_old, ret = (jnp.where(m != 0, jnp.asarray(x, jnp.float32), 0.0) for x in (values, old_values, returns))
  unclipped = jnp.square(v - ret)
  if clip is None:
    per_token, clipped_frac = unclipped, jnp.zeros((), jnp.float32)
  else:
    v_clip = v_old + jnp.clip(v - v_old, -clip, clip)
    clipped = jnp.square(v_clip - ret)
    per_token = jnp.maximum(unclipped, clipped)
    outside = jnp.abs(v - v_old) > clip  # inside the range V_clip is V up to rounding: never counted clipped
    clipped_frac = masked_mean((outside & (clipped > unclipped)).astype(jnp.float32), m)
  loss = 0.5 * aggregate(per_token, m, agg, max_tokens)
  sg = jax.lax.stop_gradient
  metrics = {"value_loss": loss, "vf_clip_frac": clipped_frac, "value_mean": masked_mean(sg(v), m),
             "returns_mean": masked_mean(ret, m), "value_error": masked_mean(sg(unclipped), m), "loss": loss}
  return loss, metrics


def token_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array, estimator: str = "gae",
                     **kwargs) -> tuple[jax.Array, jax.Array]:
  """Dispatch by name through `TOKEN_ADVANTAGES` (gae): (advantages, returns) [B, T]; KeyError naming the known
  estimators for an unknown name."""
  return TOKEN_ADVANTAGES.get(estimator)(rewards, values, mask, **kwargs)
