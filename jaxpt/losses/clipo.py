"""CLIPO: contrastive loss over rollout embeddings and the clipped contrastive reward.

Spec: /work/shared/specs/grpo_clipo.md, section CLIPO (arXiv 2603.10101). Follows the official code,
github Qwen-Applications/CLIPO @ 13c5fd6, `verl/trainer/ppo/ray_trainer.py` (cited as rt:LINE below): `supcon_loss`
rt:132-268, the levels in `compute_contrastive_rewards` rt:1647-1658, the reward rt:1667-1669. Pure functions of
arrays; this module imports no model, train or data code.

Conventions: N rollouts; head outputs z `[N, D]` (any float dtype, computed in float32); `labels` `[N]` are 0/1,
bool or raw rewards (y_i = 1[label > 0], the official `correctness_mask`, rt:1431); `group_ids` `[N]` int (the prompt
id, the official `uid`; rollouts need not be contiguous).

Sets (`contrastive_sets`), official names and masks (rt:182-195, with group_mask = 1[g_i = g_j]):
  group_level (default): P(i) = {j != i: g_j = g_i, y_j = y_i}   A(i) = {j != i: g_j = g_i}
  batch_level          : P(i) = {j != i: y_j = y_i}              A(i) = {j != i}     (no group_mask, rt:1647-1648)
  cross_level          : P(i) = {j != i: g_j = g_i, y_j = y_i}   A(i) = {j != i}     (other prompts' rollouts are
                                                                  extra negatives, rt:1653-1656)
  anchors (rt:189-192, 247-257; `skip_trivial` on, as by default):
    a_i = 1[y_i != masked_label] * 1[|P(i)| > 0] * 1[|A(i) \\ P(i)| > 0]      (masked_label -1: no label masked)
  With the default masked_label = 0 only correct rollouts anchor. A(i) \\ P(i) is every candidate that is not a
  positive, so at cross_level a correct rollout with a correct sibling anchors even when the batch holds no
  incorrect rollout at all (its negatives are then other prompts' correct rollouts).

Loss (`contrastive_loss`), temperature tau (0.05), eps = 1e-8 (rt:139):
  zn_i = z_i / ||z_i||                       (the head normalises, rt:102; so the loss is invariant to z -> c z, c > 0)
  s_ij = zn_i . zn_j  (`cosine`, rt:169-170)  or  s_ij = 1 - sqrt(max(2 - 2 zn_i . zn_j, eps))  (`l2`, rt:173-174:
         one minus the Euclidean distance of the unit vectors)
  l_ij = s_ij / tau - sg(max_k s_ik / tau)   (max over the whole row, k = i included, rt:198-202)
  lse_i = log(sum_{j in A(i)} exp l_ij + eps),   sp_i = log(sum_{p in P(i)} exp l_ip + eps)
  infonce    (infonce_loss, rt:233-242):    L_i = a_i (lse_i - l_{i,p_i}),  p_i ~ Uniform(P(i))
  supcon_out (supcon_loss_out, rt:227-231): L_i = a_i (|P(i)| lse_i - sum_{p in P(i)} l_ip) / (|P(i)| + eps)
  supcon_in  (supcon_loss_in, rt:221-225):  L_i = a_i (lse_i - sp_i + log(|P(i)| + eps))
  soft_nn    (soft_nn_loss, rt:215-219):    L_i = a_i (lse_i - sp_i)
  loss = sum_i L_i / (sum_i a_i + eps)   (rt:266-267; 0 with no anchor, rt:262-264)
Every L_i >= 0 (P(i) is inside A(i)), and L_i = 0 for non-anchors.

Reward (`contrastive_reward`, rt:1667-1669): r_con_i = max(-coef * L_i * y_i, floor) (coef 0.2, floor -0.5),
stop-gradient: 0 for incorrect rollouts even where masked_label lets them anchor.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses.registry import register_loss

TEMPERATURE = 0.05
LOG_EPS = 1e-8       # inside log(sum exp + 1e-8) and the anchor-count denominator
NORM_EPS = 1e-12     # ||z||^2 floor: an all-zero z row normalises to 0, not nan
LEVELS = ("group_level", "batch_level", "cross_level")           # the official names (rt:1647-1658)
RENAMED_LEVELS = {"group": "group_level", "batch": "cross_level", "cross": "batch_level"}  # jaxpt's names before
OBJECTIVES = ("infonce", "supcon_out", "supcon_in", "soft_nn")   # official loss_type: <name>_loss, supcon_loss_<x>
DISTANCES = ("cosine", "l2")                                     # official cosine_distance, l2_distance
MASKED_LABELS = (-1, 0, 1)                                       # rt:152: -1 none, 0 incorrect, 1 correct
REWARD_COEF = 0.2
REWARD_FLOOR = -0.5


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"clipo {name} must be one of {', '.join(allowed)}, got {value!r}")


def correct(labels: jax.Array) -> jax.Array:
  """y = 1[label > 0] as bool `[N]` (labels 0/1, bool or raw rewards)."""
  return jnp.asarray(labels).astype(jnp.float32) > 0


def _check_level(level: str) -> None:
  if level in RENAMED_LEVELS:
    raise ValueError(f"clipo level {level!r} was renamed: use the official names (group -> group_level, "
                     f"batch -> cross_level, cross -> batch_level)")
  _check("level", level, LEVELS)


def contrastive_sets(labels: jax.Array, group_ids: jax.Array, level: str = "group_level", masked_label: int = 0,
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Anchors, positives and candidates (see the module doc for each level and the anchor rule).

  labels, group_ids `[N]` -> (anchors float32 `[N]` (a_i in {0, 1}), positives bool `[N, N]` (row i = P(i)),
  candidates bool `[N, N]` (row i = A(i))). The diagonal is always False.
  """
  _check_level(level)
  if isinstance(masked_label, int) and masked_label not in MASKED_LABELS:  # (or a traced int)
    raise ValueError(f"clipo masked_label must be one of -1, 0, 1, got {masked_label!r}")
  y = correct(labels)
  g = jnp.asarray(group_ids)
  not_self = ~jnp.eye(y.shape[0], dtype=bool)
  same_group = (g[:, None] == g[None, :]) & not_self
  same_label = (y[:, None] == y[None, :]) & not_self
  positives = same_label if level == "batch_level" else same_group & same_label
  candidates = same_group if level == "group_level" else not_self
  unmasked = (masked_label == -1) | (y != (masked_label == 1))
  anchors = jnp.any(positives, axis=1) & jnp.any(candidates & ~positives, axis=1) & unmasked
  return anchors.astype(jnp.float32), positives, candidates


def normalize(z: jax.Array) -> jax.Array:
  """z_i / ||z_i|| in float32, `[N, D]` -> `[N, D]`; rows are first divided by their (stop-gradient) max |z|, so
  huge or tiny values neither overflow nor underflow (the result and its gradient are unchanged by that
  rescaling, since normalisation is scale invariant); a zero row stays 0."""
  z = jnp.asarray(z, jnp.float32)
  scale = jax.lax.stop_gradient(jnp.max(jnp.abs(z), axis=-1, keepdims=True))
  z = z / jnp.where(scale > 0, scale, 1.0)
  return z * jax.lax.rsqrt(jnp.maximum(jnp.sum(z * z, axis=-1, keepdims=True), NORM_EPS))


def similarities(zn: jax.Array, distance: str = "cosine") -> jax.Array:
  """s `[N, N]` of normalised zn `[N, D]`: zn_i . zn_j (`cosine`) or 1 - sqrt(max(2 - 2 zn_i . zn_j, 1e-8)) (`l2`,
  rt:173-174: 2 - 2 cos is ||zn_i - zn_j||^2 for unit rows). On the diagonal 2 - 2 cos_ii is taken exactly (0 for a
  unit row, 2 for a zero row), so s_ii = 1 - 1e-4 is not moved by rounding: it is the row max that every l_ij is
  shifted by, and the 1e-8 inside log(sum exp l + 1e-8) makes the loss sensitive to that shift."""
  _check("distance", distance, DISTANCES)
  dots = zn @ zn.T
  if distance == "cosine":
    return dots
  self_d2 = 2.0 - 2.0 * jnp.round(jax.lax.stop_gradient(jnp.sum(zn * zn, axis=-1)))
  d2 = jnp.where(jnp.eye(dots.shape[0], dtype=bool), self_d2[:, None], 2.0 - 2.0 * dots)
  return 1.0 - jnp.sqrt(jnp.maximum(d2, LOG_EPS))


def sample_positives(positives: jax.Array, rng: jax.Array) -> jax.Array:
  """p_i drawn uniformly from P(i) (row i of positives `[N, N]`), int32 `[N]`; 0 where P(i) is empty."""
  scores = jnp.where(positives, jax.random.uniform(rng, positives.shape), -1.0)
  return jnp.argmax(scores, axis=1).astype(jnp.int32)


def _log_sum_exp_over(l: jax.Array, mask: jax.Array) -> jax.Array:
  """log(sum_{j in mask_i} exp l_ij + 1e-8) per row; l <= 0, so exp cannot overflow."""
  return jnp.log(jnp.sum(jnp.where(mask, jnp.exp(l), 0.0), axis=1) + LOG_EPS)


def _masked_pair_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  n = jnp.sum(mask)
  return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.where(n > 0, n, 1.0)


def contrastive_loss(z: jax.Array, labels: jax.Array, group_ids: jax.Array, rng: Optional[jax.Array] = None, *,
                     objective: str = "infonce", level: str = "group_level", distance: str = "cosine",
                     temperature: float = TEMPERATURE, masked_label: int = 0,
                     positive_index: Optional[jax.Array] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The CLIPO head loss (module doc): z `[N, D]`, labels / group_ids `[N]` -> (loss, metrics).

  `infonce` needs one positive per anchor: `positive_index` int `[N]` (p_i, used where a_i = 1) or else `rng` to
  draw p_i ~ Uniform(P(i)). Gradients flow into z only. Metrics: `loss`, `per_rollout_loss` `[N]` (L_i, 0 for
  non-anchors), `num_anchors`, `pos_sim` / `neg_sim` (mean s_ij over anchor i and j in P(i) / in A(i) \\ P(i);
  0 with no such pair).
  """
  _check("objective", objective, OBJECTIVES)
  if isinstance(temperature, (int, float)) and not temperature > 0:  # (or a traced scalar)
    raise ValueError(f"clipo temperature must be > 0, got {temperature}")
  anchors, positives, candidates = contrastive_sets(labels, group_ids, level, masked_label)
  s = similarities(normalize(z), distance)
  logits = s / temperature
  l = logits - jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
  log_denominator = _log_sum_exp_over(l, candidates)
  if objective == "infonce":
    if positive_index is None:
      if rng is None:
        raise ValueError("clipo infonce needs rng (to draw p_i) or positive_index")
      positive_index = sample_positives(positives, rng)
    positive_term = jnp.take_along_axis(l, jnp.asarray(positive_index, jnp.int32)[:, None], axis=1)[:, 0]
    per_rollout = log_denominator - positive_term
  elif objective == "supcon_out":  # rt:230-231: the mean over P(i) divides by |P(i)| + eps
    n_pos = jnp.sum(positives, axis=1).astype(jnp.float32)
    per_rollout = (n_pos * log_denominator - jnp.sum(jnp.where(positives, l, 0.0), axis=1)) / (n_pos + LOG_EPS)
  elif objective == "supcon_in":   # rt:224
    n_pos = jnp.sum(positives, axis=1).astype(jnp.float32)
    per_rollout = log_denominator - _log_sum_exp_over(l, positives) + jnp.log(n_pos + LOG_EPS)
  else:  # soft_nn, rt:218
    per_rollout = log_denominator - _log_sum_exp_over(l, positives)
  is_anchor = anchors > 0
  per_rollout = jnp.where(is_anchor, per_rollout, 0.0)
  num_anchors = jnp.sum(anchors)
  loss = jnp.sum(per_rollout) / (num_anchors + LOG_EPS)
  s_sg = jax.lax.stop_gradient(s)
  metrics = {
      "loss": loss,
      "per_rollout_loss": per_rollout,
      "num_anchors": num_anchors,
      "pos_sim": _masked_pair_mean(s_sg, is_anchor[:, None] & positives),
      "neg_sim": _masked_pair_mean(s_sg, is_anchor[:, None] & candidates & ~positives),
  }
  return loss, metrics


def contrastive_reward(per_rollout_loss: jax.Array, labels: jax.Array, coef: float = REWARD_COEF,
                       floor: float = REWARD_FLOOR) -> jax.Array:
  """r_con_i = max(-coef * L_i * y_i, floor), float32 `[N]`, stop-gradient (a reward is data).

  With L_i >= 0, coef >= 0 and floor <= 0: floor <= r_con_i <= 0, and r_con_i = 0 for incorrect rollouts and for
  non-anchors (L_i = 0). Add it to R_i BEFORE the group advantage.
  """
  if coef < 0 or floor > 0:
    raise ValueError(f"clipo reward needs coef >= 0 and floor <= 0, got coef={coef}, floor={floor}")
  y = correct(labels).astype(jnp.float32)
  l = jax.lax.stop_gradient(jnp.maximum(jnp.asarray(per_rollout_loss, jnp.float32), 0.0))  # an L rounded below 0
  return jnp.maximum(-coef * l * y, floor)


def _register(objective: str) -> None:
  def loss(z, labels, group_ids, rng=None, **kwargs):
    return contrastive_loss(z, labels, group_ids, rng, objective=objective, **kwargs)

  loss.__name__ = loss.__qualname__ = f"clipo_{objective}_loss"
  loss.__doc__ = f"`contrastive_loss` with objective={objective!r}."
  register_loss("contrastive", f"clipo_{objective}")(loss)


for _objective in OBJECTIVES:
  _register(_objective)
