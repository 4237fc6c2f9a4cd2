"""GRPO-family pieces on arrays: group advantages, KL estimators, token aggregation and policy losses.

Equations: `/work/shared/specs/grpo_clipo.md` (DeepSeekMath GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, DAPO
clip-higher, dual-clip PPO, GSPO). This module imports no model, train or data code.

Conventions
- Rewards and advantages are flat `[batch]` vectors with the G rollouts of one prompt CONTIGUOUS:
  rollout i belongs to group i // G (batch = num_groups * G, i.e. `rewards.reshape(num_groups, G)` row-major).
  That is the order a sampler produces when it repeats each prompt G times, and the advantages come back in the
  same `[batch]` shape the policy losses take.
- Per-token tensors are `[batch, seq]` over the RESPONSE positions: `logp[b, t]` is the log-prob of response token
  t of rollout b under the current policy; `old_logp` under the rollout (behaviour) policy, `ref_logp` under the
  frozen reference, `teacher_logp` under KDRL's teacher (the optional `kd_term` of every policy loss).
  `mask[b, t]` is 1 on real response tokens and 0 on padding / prompt.
- Everything is computed in float32; losses return `(loss, metrics)` and are registered as `policy` losses
  (`ppo_clip`, `gspo` here; `cispo`, `gppo`, `topr` in `jaxpt.losses.policy`; `clip_cov`, `kl_cov` in
  `jaxpt.losses.entropy_control`); the advantage estimators are the `ADVANTAGES` registry (`bnpo` in
  `jaxpt.losses.advantages`).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses.registry import register_loss
from jaxpt.registry import Registry

ADV_EPS = 1e-6          # eps in (R - mean) / (std + eps)
LOG_RATIO_CLIP = 20.0   # delta = clip(logp - logp_old, -20, 20)
K3_CLAMP = 10.0         # k3 clamped to [-10, 10]
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")
KD_KINDS = ("k2", "k3")     # the KDRL term's estimators (k1 as a loss has zero expected gradient)


# ---------------------------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------------------------

ADVANTAGES: Registry = Registry("advantage estimator")   # name -> f(rewards [batch], group_size) -> [batch]

def grouped_rewards(rewards: jax.Array, group_size: int) -> jax.Array:
  """rewards [batch] -> [num_groups, G] float32 (groups contiguous); ValueError for a bad shape or group size."""
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 1:
    raise ValueError(f"rewards must be flat [batch], got shape {rewards.shape}")
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(f"batch {rewards.shape[0]} is not a multiple of group_size {group_size}")
  return rewards.reshape(-1, group_size)


def _group_mean(r: jax.Array) -> jax.Array:
  """[num_groups, G] -> group mean [num_groups, 1]; 0 for a singleton group (spec: singleton mean 0)."""
  if r.shape[1] == 1:
    return jnp.zeros_like(r)
  return jnp.mean(r, axis=1, keepdims=True)


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, group_size: int, eps: float = ADV_EPS) -> jax.Array:
  """GRPO: A_i = (R_i - mean_g) / (std_g + eps), std unbiased (ddof 1).

  rewards [batch] (groups contiguous, see module doc) -> advantages [batch]. Singleton group (G = 1): mean 0,
  std 1, so A_i = R_i / (1 + eps).
  """
  r = grouped_rewards(rewards, group_size)
  if group_size == 1:
    return (r / (1.0 + eps)).reshape(-1)
  mean = jnp.mean(r, axis=1, keepdims=True)
  std = jnp.std(r, axis=1, keepdims=True, ddof=1)
  return ((r - mean) / (std + eps)).reshape(-1)


@ADVANTAGES.register("drgrpo")
def drgrpo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
  """Dr.GRPO: A_i = R_i - mean_g (no std normalisation). [batch] -> [batch]; singleton group: A_i = R_i."""
  r = grouped_rewards(rewards, group_size)
  return (r - _group_mean(r)).reshape(-1)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
  """RLOO: A_i = G/(G-1) (R_i - mean_g) = R_i - mean_{j != i} R_j.  [batch] -> [batch]; singleton: A_i = R_i."""
  r = grouped_rewards(rewards, group_size)
  if group_size == 1:
    return r.reshape(-1)
  return (group_size / (group_size - 1) * (r - _group_mean(r))).reshape(-1)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(rewards: jax.Array, group_size: int, eps: float = ADV_EPS) -> jax.Array:
  """REINFORCE++-baseline: a_i = R_i - mean_g, then whitening over the whole batch:
  A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps), std unbiased (ddof 1; a batch of one: std 1).

  [batch] -> [batch]. The whitening is over rollouts (each rollout weighs once, whatever its length).
  """
  a = drgrpo_advantages(rewards, group_size)
  if a.shape[0] == 1:
    return (a - jnp.mean(a)) / (1.0 + eps)
  return (a - jnp.mean(a)) / (jnp.std(a, ddof=1) + eps)


def group_advantages(rewards: jax.Array, group_size: int, estimator: str = "grpo") -> jax.Array:
  """Dispatch by name through `ADVANTAGES` (grpo, drgrpo, rloo, reinforce_pp_baseline, bnpo). [batch] -> [batch];
  KeyError naming the known estimators for an unknown name."""
  return ADVANTAGES.get(estimator)(rewards, group_size)


# ---------------------------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------------------------

def kl_estimate(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
  """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs; [batch, seq] -> [batch, seq].

  delta_ref = logp - ref_logp
    k1 = delta_ref
    k2 = 0.5 delta_ref^2
    k3 = clip(exp(-delta_ref) + delta_ref - 1, -10, 10)      ("low_var_kl"; alias accepted)
  For k3, delta_ref is first clipped to [-20, 20]: k3 already exceeds 10 for delta_ref < -2.61 and > 11 (where the
  clamp leaves it 10 with no gradient, as verl's low_var_kl does), so values are unchanged, and exp cannot overflow
  into an inf * 0 = nan gradient.
  """
  delta = jnp.asarray(logp, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)
  if kind == "k1":
    return delta
  if kind == "k2":
    return 0.5 * jnp.square(delta)
  if kind in ("k3", "low_var_kl"):
    d = jnp.clip(delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    return jnp.clip(jnp.exp(-d) + d - 1.0, -K3_CLAMP, K3_CLAMP)
  raise ValueError(f"unknown KL estimator {kind!r} (known: k1, k2, k3 / low_var_kl)")


def reward_kl(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, kind: str = "k1") -> jax.Array:
  """The per-token KL that goes into a reward (the one KL-in-the-reward mechanism, `grpo.kl_in_reward`):
  m_t kl_t with kl = `kl_estimate(logp, ref_logp, kind)`, 0 on masked positions, no gradient.
  logp / ref_logp / mask [batch, seq] -> [batch, seq]. GRPO subtracts its row sum from the sequence reward
  (`kl_penalized_rewards`), PPO each token's from that token's reward (`jaxpt.losses.value.kl_shaped_rewards`)."""
  kl = kl_estimate(logp, ref_logp, kind)
  m = jnp.asarray(mask, jnp.float32)
  return jax.lax.stop_gradient(jnp.where(m != 0, kl * m, 0.0))


def kl_penalized_rewards(rewards: jax.Array, logp: jax.Array, ref_logp: jax.Array, mask: jax.Array,
                         kl_coef: float, kind: str = "k1") -> jax.Array:
  """KL in the reward: R'_i = R_i - kl_coef * sum_t m_it kl_it (sequence KL, no gradient: `reward_kl`).

  rewards [batch], logp / ref_logp / mask [batch, seq] -> [batch]; feed R' to the group advantage.
  """
  seq_kl = jnp.sum(reward_kl(logp, ref_logp, mask, kind), axis=-1)
  return jnp.asarray(rewards, jnp.float32) - kl_coef * seq_kl


# ---------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------

def aggregate(values: jax.Array, mask: jax.Array, mode: str = "token-mean",
              max_tokens: Optional[int] = None) -> jax.Array:
  """Reduces per-token values [batch, seq] with mask m [batch, seq] to a scalar.

    token-mean               : sum_{b,t} v m / sum_{b,t} m
    seq-mean-token-sum       : mean_b' sum_t v m
    seq-mean-token-mean      : mean_b' (sum_t v m / sum_t m)
    seq-mean-token-sum-norm  : sum_{b,t} v m / (B T_max)             (Dr.GRPO; T_max = max_tokens or seq)
  For the first three, mean_b' runs over the rows with at least one unmasked token, so all-masked rows contribute
  nothing (neither to the numerator nor to the count); with no unmasked token at all the result is 0.
  seq-mean-token-sum-norm divides by a constant of the batch SHAPE: B = values.shape[0] rows, empty ones included,
  times T_max, never by anything the mask decides (the spec; verl's `agg_loss` divides by T_max alone,
  verl/trainer/ppo/core_algos.py:1072-1076 @ b178a3cd5: its rows x T_max version, verl PR 4510, was reverted).
  Masked positions are zeroed with `where`, so inf/nan there cannot leak into the value or the gradient.
  """
  v = jnp.asarray(values, jnp.float32)
  m = jnp.asarray(mask, jnp.float32)
  vm = jnp.where(m != 0, v * m, 0.0)
  if mode == "token-mean":
    n = jnp.sum(m)
    return jnp.sum(vm) / jnp.where(n > 0, n, 1.0)
  if mode == "seq-mean-token-sum-norm":
    return jnp.sum(vm) / float(v.shape[0] * (max_tokens if max_tokens is not None else v.shape[-1]))
  row_tokens = jnp.sum(m, axis=-1)
  row_valid = (row_tokens > 0).astype(jnp.float32)
  n_rows = jnp.sum(row_valid)
  row_sum = jnp.sum(vm, axis=-1)
  if mode == "seq-mean-token-sum":
    per_row = row_sum
  elif mode == "seq-mean-token-mean":
    per_row = row_sum / jnp.where(row_tokens > 0, row_tokens, 1.0)
  else:
    raise ValueError(f"unknown aggregation mode {mode!r} (known: {', '.join(AGG_MODES)})")
  return jnp.sum(per_row * row_valid) / jnp.where(n_rows > 0, n_rows, 1.0)


def aggregate_weight(mask: jax.Array, mode: str = "token-mean") -> jax.Array:
  """How many units `aggregate(values, mask, mode)` averages over: mask [batch, seq] -> float32 scalar. token-mean: the
  unmasked tokens; seq-mean-token-sum and seq-mean-token-mean: the rows with at least one unmasked token (empty rows
  are not averaged over); seq-mean-token-sum-norm: every row of the shape (its denominator is B T_max). Micro-batch
  aggregates weighted by it average to the whole batch's aggregate: the weight of gradient accumulation
  (`jaxpt.engine.step.accumulate`'s `weight_key`)."""
  m = jnp.asarray(mask, jnp.float32)
  if mode == "token-mean":
    return jnp.sum(m)
  if mode == "seq-mean-token-sum-norm":
    return jnp.asarray(m.shape[0], jnp.float32)
  if mode not in AGG_MODES:
    raise ValueError(f"unknown aggregation mode {mode!r} (known: {', '.join(AGG_MODES)})")
  return jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32))


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Per-token entropy H_t = -sum_v p_v log p_v of softmax(logits); [..., V] -> [...], float32."""
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


# ---------------------------------------------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------------------------------------------

def zero_masked(x, m):
  """x with masked positions replaced by 0 BEFORE any arithmetic, so -inf / nan log-probs on padding give
  neither a nan value nor a nan gradient (a `where` on the output alone would still backprop 0 * nan)."""
  return None if x is None else jnp.where(m != 0, jnp.asarray(x, jnp.float32), 0.0)


def masked_mean(x, m):
  """sum(x m) / sum(m) over the unmasked positions (0 when there is none)."""
  n = jnp.sum(m)
  return jnp.sum(jnp.where(m != 0, x * m, 0.0)) / jnp.where(n > 0, n, 1.0)


def regularise(pg_loss, metrics, logp, mask, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy,
               entropy_coef, teacher_logp=None, kd_coef=0.0, kd_kind="k2", kd_weight=None):
  """Adds beta * agg(KL_ref), subtracts entropy_coef * agg(H) and adds the KDRL term kd_coef * agg(w k(logp,
  teacher_logp)) (`kd_term`); fills the shared metrics."""
  loss = pg_loss
  m = jnp.asarray(mask, jnp.float32)
  if ref_logp is not None:
    kl = kl_estimate(logp, ref_logp, kl_kind)
    kl_agg = aggregate(kl, m, agg, max_tokens)
    loss = loss + kl_coef * kl_agg
    metrics["kl_ref"] = kl_agg
  if entropy is not None:
    ent_agg = aggregate(entropy, m, agg, max_tokens)
    loss = loss - entropy_coef * ent_agg
    metrics["entropy"] = masked_mean(jnp.asarray(entropy, jnp.float32), m)
  if teacher_logp is not None:
    kd, kd_metrics = kd_term(logp, teacher_logp, m, kd_kind, agg, max_tokens, kd_weight)
    loss = loss + kd_coef * kd
    metrics.update(kd_metrics)
  metrics["loss"] = loss
  return loss, metrics


def kd_term(logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array, kind: str = "k2", agg: str = "token-mean",
            max_tokens: Optional[int] = None, weight: Optional[jax.Array] = None,
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """KDRL's knowledge-distillation term (Xu et al. 2025, "KDRL: Post-Training Reasoning LLMs via Unified Knowledge
  Distillation and Reinforcement Learning"): the reverse KL(pi_theta || pi_T) to a teacher, estimated on the
  student's OWN samples (the rollouts), as a loss: logp, teacher_logp, mask [B, S]; weight [B] or None.
    d_t  = logp_t - teacher_logp_t                                   (teacher_logp is data: no gradient)
    k2_t = 0.5 d_t^2                  d k2_t / d logp_t = d_t         (the paper's choice: on-policy, E[d_t grad
                                                                       logp_t] is the gradient of position t's reverse
                                                                       KL with its prefix held fixed, not of the whole
                                                                       sequence's; after a step's first update
                                                                       (epochs / minibatches > 1) the samples are off-
                                                                       policy and no ratio corrects the term)
    k3_t = exp(-d_t) + d_t - 1        d k3_t / d logp_t = 1 - exp(-d_t)   (GRPO's estimator; biased as a loss)
    kd = agg(w_b k_bt)   (agg over `mask` as the policy loss's; w_b = weight[b], 1 when None: KDRL's
                          reward-guided masking drops the KD term of some rollouts, w = 0, which still count in agg)
  k3 uses `kl_estimate`'s clipping (d to [-20, 20], k3 to [-10, 10]). Masked positions (padding) are zeroed first.
  Metrics: `kd` (the aggregated term), `teacher_kl` (token-mean of d over the mask: the k1 estimate of the
  per-token reverse KL, no gradient), `kd_rows` (fraction of non-empty rows with w > 0).
  """
  if kind not in KD_KINDS:
    raise ValueError(f"unknown KD estimator {kind!r} (known: {', '.join(KD_KINDS)})")
  m = jnp.asarray(mask, jnp.float32)
  logp, teacher_logp = zero_masked(logp, m), zero_masked(teacher_logp, m)
  k = kl_estimate(logp, jax.lax.stop_gradient(teacher_logp), kind)
  w = jnp.ones(m.shape[:1], jnp.float32) if weight is None else jnp.asarray(weight, jnp.float32)
  kd = aggregate(k * w[:, None], m, agg, max_tokens)
  rows = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
  n_rows = jnp.sum(rows)
  return kd, {"kd": kd, "teacher_kl": masked_mean(jax.lax.stop_gradient(logp - teacher_logp), m),
              "kd_rows": jnp.sum(rows * (w > 0)) / jnp.where(n_rows > 0, n_rows, 1.0)}


def advantage_metrics(advantages, mask=None):
  """Mean, std, min and max of the advantages: over the batch ([B]), or over the unmasked tokens ([B, T])."""
  a = jnp.asarray(advantages, jnp.float32)
  if a.ndim == 1 or mask is None:
    return {"adv_mean": jnp.mean(a), "adv_std": jnp.std(a), "adv_min": jnp.min(a), "adv_max": jnp.max(a)}
  live = jnp.asarray(mask) != 0
  mean = masked_mean(a, live.astype(jnp.float32))
  return {"adv_mean": mean, "adv_std": jnp.sqrt(masked_mean(jnp.square(a - mean), live.astype(jnp.float32))),
          "adv_min": jnp.min(jnp.where(live, a, jnp.inf)), "adv_max": jnp.max(jnp.where(live, a, -jnp.inf))}


def token_advantages(advantages, mask):
  """[B] (one per rollout, broadcast over its tokens) or [B, T] (per token: PPO's GAE) -> float32 [B, 1] or
  [B, T], masked positions 0."""
  a = jnp.asarray(advantages, jnp.float32)
  return a[:, None] if a.ndim == 1 else zero_masked(a, mask)


# The helpers' former private names (jaxpt.losses.policy and outside callers use the public ones).
_zero_masked, _masked_mean, _regularise, _advantage_metrics = zero_masked, masked_mean, regularise, advantage_metrics
_grouped = grouped_rewards


@register_loss("policy", "ppo_clip")
def ppo_clip_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                  eps_lo: float = 0.2, eps_hi: float = 0.2, dual_clip_c: Optional[float] = 3.0,
                  agg: str = "token-mean", max_tokens: Optional[int] = None,
                  ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0, kl_kind: str = "k3",
                  entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
                  teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
                  kd_weight: Optional[jax.Array] = None,
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-level PPO-clip policy loss with clip-higher and dual-clip (GRPO / DAPO).

  logp, old_logp [B, S]; advantages [B] (broadcast over tokens) or [B, S] (per token, PPO's GAE); mask [B, S];
  optional ref_logp, entropy [B, S].
    delta = clip(logp - old_logp, -20, 20),  rho = exp(delta)
    l1 = -A rho ;  l2 = -A clip(rho, 1 - eps_lo, 1 + eps_hi) ;  l = max(l1, l2)
    dual clip (dual_clip_c = c, None disables): l = min(l, -A c) where A < 0
    loss = agg(l) + kl_coef * agg(k(logp, ref_logp)) - entropy_coef * agg(H)     (agg: see `aggregate`)
           + kd_coef * agg(kd_weight k(logp, teacher_logp))        (KDRL, when teacher_logp is given: `kd_term`)
  Gradient flows through logp only (old_logp, advantages are data). Masked positions are zeroed in every
  per-token input first: whatever they hold (-inf, nan), they get exactly zero gradient and change nothing.
  Metrics (token-means over the mask): `pg_loss`, `clip_frac` (l2 > l1: clipped, no gradient),
  `clip_frac_dual` (A < 0 and -A c < l: dual-clipped), `ratio_mean`, `approx_kl` (k3 of old vs new:
  mean(rho - 1 - delta)), `ppo_kl` (mean(-delta)), `kl_ref` (when ref_logp is given), `entropy` (when
  given), `kd` / `teacher_kl` / `kd_rows` (when teacher_logp is given), `adv_mean/std/min/max` (over the batch),
  `loss`.
  """
  if dual_clip_c is not None and dual_clip_c <= 1.0:
    raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp, ref_logp, entropy = (zero_masked(x, m) for x in (logp, old_logp, ref_logp, entropy))
  adv = token_advantages(advantages, m)
  delta = jnp.clip(logp - jnp.asarray(old_logp, jnp.float32), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
  rho = jnp.exp(delta)
  l1 = -adv * rho
  l2 = -adv * jnp.clip(rho, 1.0 - eps_lo, 1.0 + eps_hi)
  l = jnp.maximum(l1, l2)
  dual = jnp.zeros_like(l, dtype=bool)
  if dual_clip_c is not None:
    l3 = -adv * dual_clip_c
    dual = (adv < 0) & (l > l3)
    l = jnp.where(adv < 0, jnp.minimum(l, l3), l)
  pg_loss = aggregate(l, m, agg, max_tokens)
  rho_sg, delta_sg = jax.lax.stop_gradient(rho), jax.lax.stop_gradient(delta)
  metrics = {
      "pg_loss": pg_loss,
      "clip_frac": masked_mean((l2 > l1).astype(jnp.float32), m),
      "clip_frac_dual": masked_mean(dual.astype(jnp.float32), m),
      "ratio_mean": masked_mean(rho_sg, m),
      "approx_kl": masked_mean(rho_sg - 1.0 - delta_sg, m),
      "ppo_kl": masked_mean(-delta_sg, m),
      **advantage_metrics(advantages, m),
  }
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)


@register_loss("policy", "gspo")
def gspo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              eps_lo: float = 3e-4, eps_hi: float = 4e-4, agg: str = "seq-mean-token-mean",
              max_tokens: Optional[int] = None, ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0,
              kl_kind: str = "k3", entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
              teacher_logp: Optional[jax.Array] = None, kd_coef: float = 0.0, kd_kind: str = "k2",
              kd_weight: Optional[jax.Array] = None,
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GSPO: sequence-level importance ratio with token-level straight-through (GSPO-token).

  Shapes as `ppo_clip_loss`. With delta_t = logp_t - old_logp_t and L_i = sum_t m_it:
    log s_i  = clip(sum_t m_it delta_it / L_i, -20, 20)            (sequence ratio s_i = exp(mean_t delta))
    s_it     = exp(sg[log s_i] + logp_t - sg[logp_t])              (value s_i, d s_it = s_i d logp_t)
    l_t      = max(-A s_it, -A clip(s_it, 1 - eps_lo, 1 + eps_hi)),  loss = agg(l) + KL / entropy terms
  Defaults follow the GSPO paper (eps_lo 3e-4, eps_hi 4e-4, seq-mean-token-mean). Whole sequences are clipped
  together: `clip_frac` is the token-mean of (clipped term > unclipped term), `seq_clip_frac` the fraction of
  non-empty sequences clipped. Other metrics as `ppo_clip_loss`.
  """
  m = jnp.asarray(mask, jnp.float32)
  logp, old_logp, ref_logp, entropy = (zero_masked(x, m) for x in (logp, old_logp, ref_logp, entropy))
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  delta = logp - jnp.asarray(old_logp, jnp.float32)
  lengths = jnp.sum(m, axis=-1)
  seq_delta = jnp.sum(jnp.where(m != 0, delta * m, 0.0), axis=-1) / jnp.where(lengths > 0, lengths, 1.0)
  log_s = jnp.clip(seq_delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
  log_s_tok = jax.lax.stop_gradient(log_s)[:, None] + logp - jax.lax.stop_gradient(logp)
  s = jnp.exp(log_s_tok)
  l1 = -adv * s
  l2 = -adv * jnp.clip(s, 1.0 - eps_lo, 1.0 + eps_hi)
  l = jnp.maximum(l1, l2)
  pg_loss = aggregate(l, m, agg, max_tokens)
  clipped = (l2 > l1).astype(jnp.float32)
  row_valid = (lengths > 0).astype(jnp.float32)
  n_rows = jnp.sum(row_valid)
  s_seq = jax.lax.stop_gradient(jnp.exp(log_s))
  token_delta = jax.lax.stop_gradient(jnp.clip(delta, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
  metrics = {
      "pg_loss": pg_loss,
      "clip_frac": masked_mean(clipped, m),
      "seq_clip_frac": jnp.sum(jnp.max(clipped * m, axis=-1) * row_valid) / jnp.where(n_rows > 0, n_rows, 1.0),
      "ratio_mean": jnp.sum(s_seq * row_valid) / jnp.where(n_rows > 0, n_rows, 1.0),
      "approx_kl": masked_mean(jnp.exp(token_delta) - 1.0 - token_delta, m),
      "ppo_kl": masked_mean(-token_delta, m),
      **advantage_metrics(advantages),
  }
  return regularise(pg_loss, metrics, logp, m, agg, max_tokens, ref_logp, kl_coef, kl_kind, entropy, entropy_coef,
                    teacher_logp, kd_coef, kd_kind, kd_weight)
