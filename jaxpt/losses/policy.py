"""Policy losses beyond PPO-clip and GSPO: CISPO, GPPO and TOPR, registered as `policy` losses.

Conventions as `jaxpt.losses.grpo` (shapes, masks, float32, aggregation, KL and entropy terms): logp, old_logp
[B, S] over the response positions, advantages [B] broadcast over the tokens, mask [B, S]; every loss takes the
same keyword arguments as `ppo_clip_loss` where they apply (agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy,
entropy_coef, and KDRL's teacher_logp, kd_coef, kd_kind, kd_weight) and returns `(loss, metrics)` with the shared
metrics (`pg_loss`, `clip_frac`, `ratio_mean`, `approx_kl`, `ppo_kl`, `adv_*`, `kl_ref`, `entropy`, `kd`,
`loss`). Masked positions are zeroed in every per-token input first, so whatever they hold they get exactly zero
gradient. sg[.] is `jax.lax.stop_gradient`; rho_t =
exp(clip(logp_t - old_logp_t, -20, 20)) the token importance ratio. The three losses differ in what each token's
gradient is weighted by (d l_t / d logp_t, with agg's weights on top):

  loss    A > 0                                          A < 0
  CISPO   -A clip(rho, 1-eps_lo, 1+eps_hi)               the same
  GPPO    -A rho; -A beta2 (1+eps_hi) if rho > 1+eps_hi  -A rho; -A beta1 (1-eps_lo) if rho < 1-eps_lo; 0 past dual c
  TOPR    -A                                             -A min(pi(y)/mu(y), 1), pi/mu the SEQUENCE ratio
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses.grpo import (LOG_RATIO_CLIP, advantage_metrics, aggregate, masked_mean, regularise,
                               zero_masked)
from jaxpt.losses.registry import register_loss

sg = jax.lax.stop_gradient


def _inputs(logp, old_logp, advantages, mask, ref_logp, entropy):
  """Float32 mask, the per-token inputs zeroed off the mask, advantages [B, 1], delta = logp - old_logp (raw)."""
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp, ref_logp, entropy = (zero_masked(x, m) for x in (logp, old_logp, ref_logp, entropy))
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  return m, logp, ref_logp, entropy, adv, logp - old_logp


def _ratio_metrics(delta, m):
  """ratio_mean, approx_kl (k3 of old vs new: mean(rho - 1 - delta)), ppo_kl (mean(-delta)), token-means."""
  d = sg(jnp.clip(delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
  rho = jnp.exp(d)
  return {"ratio_mean": masked_mean(rho, m), "approx_kl": masked_mean(rho - 1.0 - d, m),
          "ppo_kl": masked_mean(-d, m)}


@register_loss("policy", "cispo")
def cispo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
               eps_lo: float = 1.0, eps_hi: float = 0.28, agg: str = "token-mean",
               max_tokens: Optional[int] = None, ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0,
               kl_kind: str = "k3", entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
               teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
               kd_weight: Optional[jax.Array] = None,
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """CISPO (MiniMax-M1, "Scaling Test-Time Compute Efficiently with Lightning Attention", 2025): REINFORCE on every
  token with the clipped, stop-gradient importance weight.

  The paper's objective (its eq. for J_CISPO, token-level normalisation over the batch = agg `token-mean`):
    J = E[ 1 / sum_i |o_i| * sum_i sum_t sg(r^_it) A_it log pi(o_it | q, o_i<t) ],
    r^_it = clip(r_it, 1 - eps_low^IS, 1 + eps_high^IS),  r_it = pi(o_it) / pi_old(o_it).
  Implemented per token (loss = -J; rho = exp(clip(logp - old_logp, -20, 20))):
    w_t = sg(clip(rho_t, 1 - eps_lo, 1 + eps_hi)),   l_t = -w_t A logp_t,
    loss = agg(l) + kl_coef * agg(k(logp, ref_logp)) - entropy_coef * agg(H)        (see `ppo_clip_loss`)
  so d l_t / d logp_t = -A w_t: no token ever loses its gradient (PPO's clipped tokens get none), only its weight
  is capped. The VALUE is the REINFORCE surrogate (-A w logp), not a ratio, so it is not comparable to ppo_clip's.
  Knobs: the paper imposes no lower bound ("we did not impose a lower bound on the IS weight by setting
  eps_low^IS to a large value") and tunes eps_high^IS only, without publishing the value: defaults here are
  eps_lo = 1.0 (lower bound 0, i.e. none: rho > 0) and eps_hi = 0.28 (our choice: DAPO's clip-higher value). The
  paper's unified form with a token mask M_it is CISPO with M = 1, the only form here.
  Metrics: `clip_frac` = token-mean of (w_t != rho_t) (weight capped; the token still has a gradient),
  `weight_mean` = token-mean of w, and the shared ones (module doc).
  """
  m, logp, ref_logp, entropy, adv, delta = _inputs(logp, old_logp, advantages, mask, ref_logp, entropy)
  rho = sg(jnp.exp(jnp.clip(delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)))
  lo, hi = 1.0 - eps_lo, 1.0 + eps_hi
  w = jnp.clip(rho, lo, hi)
  pg_loss = aggregate(-w * adv * logp, m, agg, max_tokens)
  metrics = {"pg_loss": pg_loss, "clip_frac": masked_mean(((rho > hi) | (rho < lo)).astype(jnp.float32), m),
             "weight_mean": masked_mean(w, m), **_ratio_metrics(delta, m), **advantage_metrics(advantages)}
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)


@register_loss("policy", "gppo")
def gppo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              eps_lo: float = 0.2, eps_hi: float = 0.28, beta1: float = 1.0, beta2: float = 1.0,
              dual_clip_c: Optional[float] = None, agg: str = "token-mean", max_tokens: Optional[int] = None,
              ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0, kl_kind: str = "k3",
              entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
              teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
              kd_weight: Optional[jax.Array] = None,
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GPPO (Klear-Reasoner, "Advancing Reasoning Capability via Gradient-Preserving Clipping Policy Optimization",
  Su et al. 2025): PPO-clip whose clipped tokens keep a bounded gradient instead of none.

  The paper's objective, delta = r_t = pi / pi_old, in its general form with beta1, beta2:
    J = E[ 1 / sum_j T_j * sum_j sum_t min( delta A, clip(delta, beta1 (1-eps_l) delta / sg(delta),
                                                             beta2 (1+eps_h) delta / sg(delta)) A ) ]
  With beta != 1 this is computed as the official code does (compute_gppo_loss_general_beta): a token is clipped
  where the ratio leaves [1 - eps_l, 1 + eps_h] and beta scales its clipped value; read literally, the equation
  would move the bounds to beta (1 +- eps) instead.
  Implemented per token (loss = -J; rho = exp(clip(logp - old_logp, -20, 20)), s = exp(d - sg(d)) with d the raw
  logp - old_logp: value exactly 1, d s = d logp):
    l_t = -A beta2 (1 + eps_hi) s    if A > 0 and rho > 1 + eps_hi     (clipped above: d l/d logp = -A beta2 (1+eps_hi))
    l_t = -A beta1 (1 - eps_lo) s    if A < 0 and rho < 1 - eps_lo     (clipped below: d l/d logp = -A beta1 (1-eps_lo))
    l_t = -A rho                     otherwise                          (d l/d logp = -A rho)
    dual clip (dual_clip_c = c, None disables): l_t = -A c where A < 0 and -A rho > -A c (d l/d logp = 0)
    loss = agg(l) + KL / entropy terms as `ppo_clip_loss`
  With beta1 = beta2 = 1 the value is PPO-clip's (clip-higher) exactly and only the backward pass differs; the
  gradient is continuous at the bounds (at rho = 1 + eps_hi both branches give -A (1 + eps_hi)), and a ratio
  exactly on a bound counts as unclipped (strict inequalities, no 0.5/0.5 split of a tie). Defaults follow the
  paper and its official code (Kwai-Klear/KlearReasoner compute_gppo_loss, recipe/dapo scripts): eps_l = 0.2,
  eps_h = 0.28, beta1 = beta2 = 1 ("Empirically we set beta1 = beta2 = 1"); the official code also applies
  dual-clip (clip_ratio_c = 10 in its scripts), which the paper's equation does not show: off by default here.
  Through the GRPO trainer the `grpo` section's eps_lo, eps_hi and dual_clip_c reach it (defaults 0.2, 0.2, 3).
  Metrics: `clip_frac` = token-mean of the two clipped cases (tokens on the bounded gradient), `clip_frac_dual`,
  and the shared ones (module doc).
  """
  if dual_clip_c is not None and dual_clip_c <= 1.0:
    raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
  m, logp, ref_logp, entropy, adv, delta = _inputs(logp, old_logp, advantages, mask, ref_logp, entropy)
  rho = jnp.exp(jnp.clip(delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
  s = jnp.exp(delta - sg(delta))
  hi, lo = 1.0 + eps_hi, 1.0 - eps_lo
  above, below = (adv > 0) & (sg(rho) > hi), (adv < 0) & (sg(rho) < lo)
  l = -adv * jnp.where(above, beta2 * hi * s, jnp.where(below, beta1 * lo * s, rho))
  dual = jnp.zeros_like(above)
  if dual_clip_c is not None:
    dual = (adv < 0) & (l > -adv * dual_clip_c)
    l = jnp.where(dual, -adv * dual_clip_c, l)
  pg_loss = aggregate(l, m, agg, max_tokens)
  metrics = {"pg_loss": pg_loss, "clip_frac": masked_mean((above | below).astype(jnp.float32), m),
             "clip_frac_dual": masked_mean(dual.astype(jnp.float32), m), **_ratio_metrics(delta, m),
             **advantage_metrics(advantages)}
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)


@register_loss("policy", "topr")
def topr_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              agg: str = "seq-mean-token-sum", max_tokens: Optional[int] = None,
              ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0, kl_kind: str = "k3",
              entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
              teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
              kd_weight: Optional[jax.Array] = None,
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """TOPR (Le Roux, Bellemare et al. 2025, "Tapered Off-Policy REINFORCE"): asymmetric truncated importance
  sampling, plain SFT-like REINFORCE on positive sequences, the sequence ratio truncated to [0, 1] on negative ones.

  The paper's objective (mu the behaviour policy that produced tau, [x]_0^1 = min(max(x, 0), 1), no KL):
    J = sum_{tau: R(tau) >= 0} mu(tau) R(tau) log pi(tau)
        + sum_{tau: R(tau) < 0} mu(tau) sg([pi(tau) / mu(tau)]_0^1) R(tau) log pi(tau)
  Implemented per token (loss = -J; log pi(tau_i) = sum_t logp_it, the sequence ratio
  pi(tau_i)/mu(tau_i) = exp(sum_t m_it (logp_it - old_logp_it))):
    w_i = 1                                                   if A_i >= 0
    w_i = sg(exp(min(sum_t m_it (logp_it - old_logp_it), 0)))  if A_i < 0      (= min(pi/mu, 1), in (0, 1])
    l_t = -w_i A_i logp_t,   loss = agg(l) + KL / entropy terms as `ppo_clip_loss`
  Conventions chosen here: R(tau) is the advantage A (the paper's reward minus its REINFORCE baseline, which it
  shows decides which examples count as negative), so the estimator in the trainer sets the sign; the default
  aggregation `seq-mean-token-sum` is the paper's mean over trajectories of R log pi(tau) (the trainer passes its
  `grpo.agg`, token-mean unless set). The truncation interval [0, 1] is the paper's, no knob. TOPR is an
  off-policy method; the jaxpt GRPO trainer has no off-policy data path, so there it is used ON-policy: on the
  first update of a step pi = mu, every w_i = 1 and TOPR is REINFORCE with the estimator's baseline; later epochs
  / minibatches of the same rollouts see pi != mu and the taper acts on the negative sequences.
  Metrics: `clip_frac` = token-mean over tokens of negative sequences with pi/mu < 1 (tapered), `weight_mean` =
  mean of w_i over non-empty rows, and the shared ones (module doc; ratios token-level).
  """
  m, logp, ref_logp, entropy, adv, delta = _inputs(logp, old_logp, advantages, mask, ref_logp, entropy)
  seq_log_ratio = sg(jnp.sum(jnp.where(m != 0, delta * m, 0.0), axis=-1, keepdims=True))
  negative = adv < 0
  w = jnp.where(negative, jnp.exp(jnp.minimum(seq_log_ratio, 0.0)), 1.0)
  pg_loss = aggregate(-w * adv * logp, m, agg, max_tokens)
  rows = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
  tapered = jnp.broadcast_to(negative & (seq_log_ratio < 0.0), m.shape).astype(jnp.float32)
  metrics = {"pg_loss": pg_loss, "clip_frac": masked_mean(tapered, m),
             "weight_mean": jnp.sum(w[:, 0] * rows) / jnp.maximum(jnp.sum(rows), 1.0),
             **_ratio_metrics(delta, m), **advantage_metrics(advantages)}
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)
