"""Advantage estimators beyond the GRPO family's, registered in the same `jaxpt.losses.grpo.ADVANTAGES` registry
(grpo, drgrpo, rloo and reinforce_pp_baseline stay in `jaxpt.losses.grpo`): BNPO.

Conventions as `jaxpt.losses.grpo`: rewards are a flat [batch] vector with the G rollouts of a prompt contiguous,
the advantages come back in the same shape, float32. Advantages are data: nothing here is differentiated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln, xlog1py, xlogy

from jaxpt.losses.grpo import ADVANTAGES, grouped_rewards

BNPO_MAX_WEIGHT = 1e6   # 1 / f_N is clamped to [0, 1e6] (the official code's clamp)


@ADVANTAGES.register("bnpo")
def bnpo_advantages(rewards: jax.Array, group_size: int, r_min: float = 0.0, r_max: float = 1.0,
                    max_weight: float = BNPO_MAX_WEIGHT) -> jax.Array:
  """BNPO (Xiao, Zhang, Cao 2025, "BNPO: Beta Normalization Policy Optimization"): the advantage normalised by a
  Beta density whose parameters are estimated from the batch, adaptively as the policy's success rates move.

  The paper, for binary rewards R in {0, 1} and p(q) = E[R | q] the prompt's success rate:
    A(q, o) = (R(q, o) - p(q)) / f_N(p(q); alpha, beta),   f_N the Beta(alpha, beta) density,
    p(q) ~ Beta(a, b) over prompts (estimated), and the variance-minimising choice alpha = 1 + a/3, beta = 1 + b/3.
  Implemented (rewards [batch] in groups of G; the estimates as the official code, changyi7231/BNPO
  recipe/bnpo/src/bnpo_ray_trainer.py, computes them):
    s_i   = (R_i - r_min) / (r_max - r_min)                     (rewards mapped to [0, 1]; defaults 0, 1)
    p_g   = mean of s over group g                               (singleton group: p_g = 0, as grpo.py's mean)
    m, v  = mean and unbiased variance (ddof 1) of p_g over the groups   (one group: m = 0, v = 1)
    a     = (m (1 - m) / v - 1) m,   b = (m (1 - m) / v - 1) (1 - m)     (method of moments for Beta(a, b))
    alpha = max(1 + a/3, 1),   beta = max(1 + b/3, 1)
    A_i   = clip(1 / f_N(p_g; alpha, beta), 0, max_weight) * (s_i - p_g),   max_weight = 1e6
  alpha = beta = 1 gives A = s - p (REINFORCE with the group baseline, Dr.GRPO); alpha = beta = 3/2 weighs by
  1 / sqrt(p (1 - p)) up to a constant: GRPO's std normalisation. Conventions chosen where the paper and code
  leave it open: when every group has the same p_g (v = 0, where the official code divides by zero) alpha = beta
  = 1 (A = s - p); f_N is evaluated at clip(p_g, 0, 1), so rewards outside [r_min, r_max] (a CLIPO or KL-shaped
  reward) still get a finite weight; at p_g in {0, 1} with alpha or beta > 1 the density is 0 and the weight is
  max_weight, but then (binary rewards) s_i - p_g = 0. A group of equal rewards always gets A = 0. Left out: the
  paper's advantage decomposition for multi-component rewards.
  """
  s = (grouped_rewards(rewards, group_size) - r_min) / (r_max - r_min)
  p = jnp.zeros((s.shape[0], 1), s.dtype) if group_size == 1 else jnp.mean(s, axis=1, keepdims=True)
  if s.shape[0] > 1:
    mean, var = jnp.mean(p), jnp.var(p, ddof=1)
  else:
    mean, var = jnp.zeros((), s.dtype), jnp.ones((), s.dtype)
  spread = jnp.where(jnp.max(p) > jnp.min(p), mean * (1.0 - mean) / jnp.where(var > 0, var, 1.0) - 1.0, 0.0)
  alpha = jnp.maximum(1.0 + spread * mean / 3.0, 1.0)
  beta = jnp.maximum(1.0 + spread * (1.0 - mean) / 3.0, 1.0)
  pc = jnp.clip(p, 0.0, 1.0)
  log_density = xlogy(alpha - 1.0, pc) + xlog1py(beta - 1.0, -pc) - betaln(alpha, beta)
  weight = jnp.clip(jnp.exp(-log_density), 0.0, max_weight)
  return (weight * (s - p)).reshape(-1)
