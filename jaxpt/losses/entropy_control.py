"""Entropy control by covariance: Clip-Cov and KL-Cov, registered as `policy` losses.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models": the policy
entropy falls in proportion to the covariance of a token's log-prob and its advantage, and a small fraction of
tokens of very high covariance drives the collapse. Both losses are PPO-style surrogates that single those tokens
out by their centred covariance over the batch's valid tokens,

  cov_t = sg[(logp_t - mean_V logp) (A_t - mean_V A)],   V = {(b, t): m_bt != 0}, both means token-weighted over V,

and either take their gradient away (Clip-Cov) or pull them back to the rollout policy with a KL-like penalty
(KL-Cov). Conventions (shapes, masks, float32, aggregation, KL and entropy terms, shared metrics) as
`jaxpt.losses.policy`; rho_t = exp(clip(logp_t - old_logp_t, -20, 20)). Where the paper leaves a choice open,
this module follows the official code (github.com/PRIME-RL/Entropy-Mechanism-of-RL,
verl/trainer/ppo/core_algos.py `compute_policy_loss_clip_cov` / `compute_policy_loss_kl_cov`, defaults from
verl/trainer/config/ppo_trainer.yaml and recipe/dapo/7b_{clip,kl}_cov.sh); each docstring says which.

The covariance is that of the batch the loss is called on: in the GRPO trainer one update's minibatch (one
micro-batch with `optim.grad_accum_steps` > 1), as verl computes it per micro-batch; the selections are made on
the whole (global, SPMD) array, so a sharded run selects what a one-device run does.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses.grpo import (LOG_RATIO_CLIP, advantage_metrics, aggregate, masked_mean, regularise,
                               zero_masked)
from jaxpt.losses.registry import register_loss

sg = jax.lax.stop_gradient


def token_covariance(logp: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
  """cov_t = (logp_t - mean logp) (A_b - mean A) on the valid tokens, 0 off the mask; no gradient.

  logp, mask [B, S], advantages [B] (broadcast over the row's tokens); both means are over the valid tokens
  (token-weighted: a row's advantage counts once per valid token of the row, as verl's token-level advantages).
  Each factor is centred after shifting by its largest valid value, c = x - max x, c - mean c (the same in exact
  arithmetic): values all equal give exactly 0, not float32 rounding noise (e.g. all-equal advantages: cov = 0).
  """
  m = jnp.asarray(mask, jnp.float32)
  lp = sg(zero_masked(logp, m))
  adv = jnp.broadcast_to(jnp.asarray(advantages, jnp.float32)[:, None], m.shape)
  cov = _centred(lp, m) * _centred(adv, m)
  return sg(jnp.where(m != 0, cov, 0.0))


def _centred(x: jax.Array, m: jax.Array) -> jax.Array:
  shift = jnp.max(jnp.where(m != 0, x, -jnp.inf))
  c = x - jnp.where(jnp.isfinite(shift), shift, 0.0)
  return c - masked_mean(c, m)


def _first_k(score: jax.Array, eligible: jax.Array, k: jax.Array) -> jax.Array:
  """Boolean [B, S]: the k eligible positions of highest score (ties: the lower row-major index first); all the
  eligible ones when fewer than k. `k` may be traced (it depends on the mask)."""
  flat = jnp.where(eligible, score, -jnp.inf).reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return eligible & (rank.reshape(score.shape) < k)


def _count(n_valid: jax.Array, ratio: float) -> jax.Array:
  """max(1, floor(ratio * n_valid)) as the official code's max(1, int(...)), computed in float32; 0 when
  n_valid is 0."""
  k = jnp.maximum(jnp.floor(jnp.float32(ratio) * n_valid), 1.0)
  return jnp.where(n_valid > 0, k, 0.0).astype(jnp.int32)


def _check_ratio(name: str, value: float) -> None:
  if not 0.0 <= value <= 1.0:
    raise ValueError(f"{name} must be in [0, 1] (a fraction of the valid tokens), got {value}")


def clip_cov_selection(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
                       rng: Optional[jax.Array], ratio: float, lb: float, ub: float, eps_lo: float,
                       eps_hi: float) -> tuple[jax.Array, jax.Array]:
  """Clip-Cov's tokens: (drawn, candidates), boolean [B, S] (see `clip_cov_loss`; no gradient)."""
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp = sg(zero_masked(logp, m)), zero_masked(old_logp, m)
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  rho = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
  ppo_clipped = -adv * jnp.clip(rho, 1.0 - eps_lo, 1.0 + eps_hi) > -adv * rho
  cov = token_covariance(logp, advantages, m)
  candidates = (m != 0) & ~ppo_clipped & (cov > lb) & (cov < ub)
  if ratio == 0:
    return jnp.zeros_like(candidates), candidates
  u = jax.random.uniform(rng, m.shape)
  return _first_k(-u, candidates, _count(jnp.sum(m), ratio)), candidates


def kl_cov_selection(logp: jax.Array, advantages: jax.Array, mask: jax.Array, ratio: float) -> jax.Array:
  """KL-Cov's tokens K, boolean [B, S]: the max(1, floor(ratio N)) valid tokens of largest covariance (see
  `kl_cov_loss`; no gradient)."""
  m = jnp.asarray(mask, jnp.float32)
  if ratio == 0:
    return jnp.zeros(m.shape, bool)
  return _first_k(token_covariance(logp, advantages, m), m != 0, _count(jnp.sum(m), ratio))


@register_loss("policy", "clip_cov")
def clip_cov_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                  rng: Optional[jax.Array] = None, clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0,
                  clip_cov_ub: float = 5.0, eps_lo: float = 0.2, eps_hi: float = 0.2, agg: str = "token-mean",
                  max_tokens: Optional[int] = None, ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0,
                  kl_kind: str = "k3", entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
                  teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
                  kd_weight: Optional[jax.Array] = None,
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clip-Cov: PPO-clip with a small random set of high-covariance tokens taken out of the gradient.

  The paper: among the tokens whose covariance lies in [omega_low, omega_high], r N of them (N valid tokens, r
  the clip ratio) are drawn uniformly at random and detached from the gradient. Implemented per token (rng the
  PRNG key of the draw; the trainer passes one per update):
    l1 = -A rho,  l2 = -A clip(rho, 1 - eps_lo, 1 + eps_hi)                         (PPO-clip, no dual clip)
    C  = {t valid : l2_t <= l1_t (not clipped by PPO), lb < cov_t < ub}             (candidates)
    n  = min(max(1, floor(clip_cov_ratio N)), |C|);  D = n tokens of C drawn uniformly without replacement
    l_t = max(l1, l2) (1 - [t in D]),   loss = agg(l) + KL / entropy terms as `ppo_clip_loss`
  so a drawn token contributes nothing, value and gradient (it still counts in agg's denominators).
  Conventions of the official code (verl/trainer/ppo/core_algos.py `compute_policy_loss_clip_cov`): tokens that
  PPO already clips are not candidates; the band is open (lb < cov < ub); n = max(int(r N), 1); the drawn token's
  loss is multiplied by 0 (the value drops too, not only the gradient); no dual clip. The draw: each token gets
  u_t ~ U[0, 1) from jax.random.uniform(rng, logp.shape), and D is the n candidates of smallest u (a uniform
  subset, as the official `randperm`). Defaults: clip_cov_ratio = 2e-4, [lb, ub] = [1, 5] (the paper, config and
  recipe scripts); eps_lo = eps_hi = 0.2 as verl's config (the recipe runs set both to 1, i.e. the ratio clipped
  to [0, 2] only). rng is required when clip_cov_ratio > 0 (ValueError otherwise).
  Metrics: `clip_frac` = token-mean of tokens without gradient (PPO-clipped or drawn), `cov_frac` = token-mean of
  the drawn tokens (the official `pg_clipfrac`), `cov_candidates` = token-mean of C, `cov` = token-mean of cov_t
  (the batch covariance), and the shared ones (`jaxpt.losses.policy`).
  """
  _check_ratio("clip_cov_ratio", clip_cov_ratio)
  if not clip_cov_lb < clip_cov_ub:
    raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got [{clip_cov_lb}, {clip_cov_ub}]")
  if rng is None and clip_cov_ratio > 0:
    raise ValueError("clip_cov draws its tokens at random: pass rng (a PRNG key)")
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp, ref_logp, entropy = (zero_masked(x, m) for x in (logp, old_logp, ref_logp, entropy))
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  delta = jnp.clip(logp - old_logp, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
  rho = jnp.exp(delta)
  l1, l2 = -adv * rho, -adv * jnp.clip(rho, 1.0 - eps_lo, 1.0 + eps_hi)
  drawn, candidates = clip_cov_selection(logp, old_logp, advantages, m, rng, clip_cov_ratio, clip_cov_lb,
                                         clip_cov_ub, eps_lo, eps_hi)
  ppo_clipped = (l2 > l1) & (m != 0)
  cov = token_covariance(logp, advantages, m)
  l = jnp.where(drawn, 0.0, jnp.maximum(l1, l2))
  pg_loss = aggregate(l, m, agg, max_tokens)
  rho_sg, delta_sg = sg(rho), sg(delta)
  metrics = {"pg_loss": pg_loss, "clip_frac": masked_mean((ppo_clipped | drawn).astype(jnp.float32), m),
             "cov_frac": masked_mean(drawn.astype(jnp.float32), m),
             "cov_candidates": masked_mean(candidates.astype(jnp.float32), m), "cov": masked_mean(cov, m),
             "ratio_mean": masked_mean(rho_sg, m), "approx_kl": masked_mean(rho_sg - 1.0 - delta_sg, m),
             "ppo_kl": masked_mean(-delta_sg, m), **advantage_metrics(advantages)}
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)


@register_loss("policy", "kl_cov")
def kl_cov_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                kl_cov_ratio: float = 2e-3, kl_cov_coef: float = 1.0, agg: str = "token-mean",
                max_tokens: Optional[int] = None, ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0,
                kl_kind: str = "k3", entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
                teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
                kd_weight: Optional[jax.Array] = None,
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """KL-Cov: the (unclipped) policy-gradient surrogate with a KL penalty on the top-k tokens by covariance.

  The paper: the k N tokens of largest covariance (N valid tokens) get the penalty beta |log pi - log pi_old|
  added to -A rho. Implemented per token (d_t = logp_t - old_logp_t, unclipped in the penalty):
    n  = max(1, floor(kl_cov_ratio N)) (0 when N = 0);  K = the n valid tokens of largest cov_t
    l_t = -A rho_t + kl_cov_coef [t in K] |d_t|,   loss = agg(l) + KL / entropy terms as `ppo_clip_loss`
  The gradient of |d_t| is sign(d_t) with sign(0) = 0 (torch's abs): on the first, on-policy update of a step
  (d = 0) the penalty neither adds value nor gradient; it pulls the selected tokens back towards pi_old on the
  later epochs / minibatches. Conventions of the official code (verl/trainer/ppo/core_algos.py
  `compute_policy_loss_kl_cov`): no ratio clipping at all (neither eps nor dual clip; this loss takes none);
  top-k by covariance over the valid tokens of the whole batch, n = max(1, int(N k_percent / 100)) with the
  config's k_percent in percent (kl_cov_ratio here is the fraction: k_percent / 100); the covariance uses the
  current (detached) log-probs. Ties in cov are broken by the lower row-major index (torch.topk leaves them
  unspecified). Defaults: kl_cov_ratio = 2e-3 and kl_cov_coef = 1 (the paper and recipe/dapo/7b_kl_cov.sh:
  k_percent = 0.2, ppo_kl_coef = 1; the 32B recipe uses k_percent = 0.02, i.e. 2e-4).
  Metrics: `clip_frac` = 0 (nothing is clipped; kept for the shared metrics), `cov_frac` = token-mean of K,
  `cov` = token-mean of cov_t, `ppo_kl_abs` = token-mean of |d| (the official code's reported ppo_kl), and the
  shared ones.
  """
  _check_ratio("kl_cov_ratio", kl_cov_ratio)
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp, ref_logp, entropy = (zero_masked(x, m) for x in (logp, old_logp, ref_logp, entropy))
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  d = logp - old_logp
  delta = jnp.clip(d, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
  rho = jnp.exp(delta)
  cov = token_covariance(logp, advantages, m)
  top = kl_cov_selection(logp, advantages, m, kl_cov_ratio)
  abs_d = d * sg(jnp.sign(d))   # value |d|, gradient sign(d) (0 at d = 0)
  l = -adv * rho + jnp.where(top, kl_cov_coef * abs_d, 0.0)
  pg_loss = aggregate(l, m, agg, max_tokens)
  rho_sg, delta_sg = sg(rho), sg(delta)
  metrics = {"pg_loss": pg_loss, "clip_frac": jnp.zeros((), jnp.float32),
             "cov_frac": masked_mean(top.astype(jnp.float32), m), "cov": masked_mean(cov, m),
             "ppo_kl_abs": masked_mean(sg(jnp.abs(d)), m), "ratio_mean": masked_mean(rho_sg, m),
             "approx_kl": masked_mean(rho_sg - 1.0 - delta_sg, m), "ppo_kl": masked_mean(-delta_sg, m),
             **advantage_metrics(advantages)}
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)
