"""Preference losses: pairwise Bradley-Terry (`bt`), BT + CLUB (`dir`), `dpo` (with the DPO+DIR hook), `odin`, and
the unpaired `kto` (each example desirable or not).

Spec: /work/shared/specs/dir.md. All are pure functions of arrays returning `(loss, metrics)`, computed in float32.
Conventions: scores / log-probs are `[N]` per chosen/rejected pair; optional pair `weights` `[N]` (0 = padding pair,
default all ones) turn every mean over pairs into a w-weighted mean (N = sum w; with N = 0 the pair terms are 0).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxpt.losses import club as club_lib
from jaxpt.losses.registry import register_loss

Metrics = dict[str, jax.Array]


def _f32(x) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


def _pair_weights(like: jax.Array, weights: Optional[jax.Array]) -> jax.Array:
  return jnp.ones(like.shape, jnp.float32) if weights is None else _f32(weights)


def _wmean(values: jax.Array, w: jax.Array) -> jax.Array:
  total = jnp.sum(w)
  return jnp.sum(w * values) / jnp.where(total > 0, total, 1.0)


def _smoothed_logistic(z: jax.Array, label_smoothing: float) -> jax.Array:
  """Per-pair -(1 - eps) log sigmoid(z) - eps log sigmoid(-z) (stable for any |z|)."""
  return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(-z)


@register_loss("preference", "bt")
def bradley_terry(chosen_scores: jax.Array, rejected_scores: jax.Array, margin=0.0, label_smoothing: float = 0.0,
                  center_coef: float = 0.0, weights: Optional[jax.Array] = None) -> tuple[jax.Array, Metrics]:
  """Bradley-Terry reward-model loss.

  chosen_scores, rejected_scores [N]; margin scalar or [N]; label_smoothing eps in [0, 0.5]; center_coef c.
    z_i   = r_c,i - r_r,i - m_i
    loss  = mean_i [ -(1 - eps) log sigmoid(z_i) - eps log sigmoid(-z_i) ]  +  c * mean_i (r_c,i + r_r,i)^2
  The second term is reward centering (Eisenstein et al. 2023): it pins the pair's mean reward near 0. Defaults give
  the plain -mean log sigmoid(r_c - r_r); all-equal scores give log 2.
  Metrics: `loss`, `bt_loss` (first term), `center_loss` (second), `accuracy` (r_c > r_r), `reward_margin`
  (mean r_c - r_r), `chosen_reward`, `rejected_reward` (means).
  """
  rc, rr = _f32(chosen_scores), _f32(rejected_scores)
  w = _pair_weights(rc, weights)
  diff = rc - rr
  bt = _wmean(_smoothed_logistic(diff - _f32(margin), label_smoothing), w)
  center = center_coef * _wmean(jnp.square(rc + rr), w)
  loss = bt + center
  return loss, {
      "loss": loss,
      "bt_loss": bt,
      "center_loss": center,
      "accuracy": _wmean((diff > 0).astype(jnp.float32), w),
      "reward_margin": _wmean(diff, w),
      "chosen_reward": _wmean(rc, w),
      "rejected_reward": _wmean(rr, w),
  }


@register_loss("preference", "dir")
def dir_loss(chosen_scores: jax.Array, rejected_scores: jax.Array, hidden_chosen: jax.Array,
             hidden_rejected: jax.Array, bias_labels: jax.Array, q_params: club_lib.Params, mi_weight: float = 0.1,
             mode: str = "difference", margin=0.0, label_smoothing: float = 0.0, center_coef: float = 0.0,
             weights: Optional[jax.Array] = None) -> tuple[jax.Array, Metrics]:
  """DIR reward-model loss: L = L_BT + lambda * I_club(X, a), with the estimator psi held constant.

  hidden_chosen, hidden_rejected [N, d] (last-token final hidden states); bias_labels int [N]; q_params from
  `club.init_club_estimator` (updated beforehand by `club.inner_update` on the same batch); mode picks
  X = h_c - h_r (`difference`) or [h_c; h_r] (`concat`). I_club is `club.club_penalty` (all N^2 pairs):
    I_club = (1/N) sum_i log q(a_i|X_i) - (1/N^2) sum_ij log q(a_j|X_i)
  The gradient reaches the scores and hidden states, never q_params (exactly zero). lambda: 0.1 (reference code
  default; the published script uses 1.0 on 8 GPUs, where each rank's MI gradient is averaged over the 8: 0.125
  here, `DIRSettings.mi_weight`). Other arguments as in `bradley_terry`.
  Metrics: those of `bradley_terry` (`loss` is the total), `club`, `club_positive`, `club_negative`, `mi_loss`
  (lambda * I_club).
  """
  loss_bt, metrics = bradley_terry(chosen_scores, rejected_scores, margin, label_smoothing, center_coef, weights)
  x = club_lib.club_input(hidden_chosen, hidden_rejected, mode)
  mi, club_metrics = club_lib.club_penalty(q_params, x, bias_labels, weights)
  mi_term = mi_weight * mi
  loss = loss_bt + mi_term
  return loss, {**metrics, **club_metrics, "loss": loss, "mi_loss": mi_term}


@register_loss("preference", "dpo")
def dpo(policy_chosen_logps: jax.Array, policy_rejected_logps: jax.Array, reference_chosen_logps: jax.Array,
        reference_rejected_logps: jax.Array, beta: float = 0.1, label_smoothing: float = 0.0,
        weights: Optional[jax.Array] = None, *, q_params: Optional[club_lib.Params] = None,
        hidden_chosen: Optional[jax.Array] = None, hidden_rejected: Optional[jax.Array] = None,
        chosen_lengths: Optional[jax.Array] = None, rejected_lengths: Optional[jax.Array] = None,
        bias_labels: Optional[jax.Array] = None, step=0, warmup_steps: int = 80, mi_weight: float = 0.1,
        mode: str = "difference") -> tuple[jax.Array, Metrics]:
  """DPO on sequence log-probs, with the optional DIR term (DPO+DIR).

  policy_* / reference_* [N]: summed log-probs of the chosen / rejected responses under the policy / frozen
  reference. beta > 0, label_smoothing eps (conservative DPO).
    z_i   = beta * [(pi_c,i - ref_c,i) - (pi_r,i - ref_r,i)]
    L_dpo = mean_i [ -(1 - eps) log sigmoid(z_i) - eps log sigmoid(-z_i) ]
  DIR hook (on when q_params is given; then hidden_chosen, hidden_rejected [N, d] and either bias_labels int [N] or
  chosen_lengths, rejected_lengths [N] response token counts are required):
    a_i   = bias_labels_i, else 1[len(chosen_i) > len(rejected_i)],  X = club_input(h_c, h_r, mode)
    L     = L_dpo + 1[step > warmup_steps] * lambda * I_club(X, a)     (psi held constant, as in `dir_loss`)
  `step` is the 0-based index of the optimizer step (the reference's `global_step`, which switches the term on at
  `global_step > 80`); it may be traced (the gate is a jnp.where, so one jitted step serves both phases).
  Metrics: `loss`, `dpo_loss`, `accuracy` (z > 0), `reward_margin` (mean z, the implicit reward difference),
  `chosen_reward`, `rejected_reward` (mean beta * (pi - ref)); with DIR also `club`, `club_positive`,
  `club_negative`, `mi_loss` (gated lambda * I_club), `mi_gate` (0 or 1).
  """
  pc, pr = _f32(policy_chosen_logps), _f32(policy_rejected_logps)
  rc, rr = _f32(reference_chosen_logps), _f32(reference_rejected_logps)
  w = _pair_weights(pc, weights)
  chosen_reward = beta * (pc - rc)
  rejected_reward = beta * (pr - rr)
  z = chosen_reward - rejected_reward
  loss_dpo = _wmean(_smoothed_logistic(z, label_smoothing), w)
  metrics = {
      "dpo_loss": loss_dpo,
      "accuracy": _wmean((z > 0).astype(jnp.float32), w),
      "reward_margin": _wmean(z, w),
      "chosen_reward": _wmean(chosen_reward, w),
      "rejected_reward": _wmean(rejected_reward, w),
  }
  loss = loss_dpo
  if q_params is not None:
    needed = (("hidden_chosen", hidden_chosen), ("hidden_rejected", hidden_rejected))
    if bias_labels is None:
      needed += (("chosen_lengths", chosen_lengths), ("rejected_lengths", rejected_lengths))
    missing = [name for name, v in needed if v is None]
    if missing:
      raise ValueError(f"dpo with the DIR term (q_params given) needs {', '.join(missing)}")
    a = club_lib.length_bias_label(chosen_lengths, rejected_lengths) if bias_labels is None else bias_labels
    x = club_lib.club_input(hidden_chosen, hidden_rejected, mode)
    mi, club_metrics = club_lib.club_penalty(q_params, x, a, weights)
    gate = jnp.where(jnp.asarray(step) > warmup_steps, 1.0, 0.0).astype(jnp.float32)
    mi_term = gate * mi_weight * mi
    loss = loss + mi_term
    metrics.update(club_metrics, mi_loss=mi_term, mi_gate=gate)
  metrics["loss"] = loss
  return loss, metrics


def _weighted_corr(x: jax.Array, y: jax.Array, w: jax.Array, eps: float = 1e-12) -> jax.Array:
  """w-weighted Pearson correlation; 0 when either side is constant."""
  xc = x - _wmean(x, w)
  yc = y - _wmean(y, w)
  cov = _wmean(xc * yc, w)
  vx, vy = _wmean(xc * xc, w), _wmean(yc * yc, w)
  # Scale by each std separately (not sqrt(vx * vy)) so 1e4-sized scores do not overflow float32.
  return cov / (jnp.sqrt(vx + eps) * jnp.sqrt(vy + eps))


@register_loss("preference", "odin")
def odin(quality_chosen: jax.Array, quality_rejected: jax.Array, length_chosen: jax.Array,
         length_rejected: jax.Array, chosen_lengths: jax.Array, rejected_lengths: jax.Array,
         quality_head_weight: jax.Array, length_head_weight: jax.Array, corr_coef: float = 1.0,
         ortho_coef: float = 1.0, margin=0.0, label_smoothing: float = 0.0, center_coef: float = 0.0,
         weights: Optional[jax.Array] = None, length_sign: float = 1.0) -> tuple[jax.Array, Metrics]:
  """ODIN (Chen et al. 2024): two heads on shared features, the length head soaks up the length signal.

  quality_* = r_Q, length_* = r_L [N] head scores of chosen / rejected; chosen_lengths, rejected_lengths [N] token
  counts; quality_head_weight W_Q, length_head_weight W_L: the bias-free score heads' weights ([d] or [d, 1]).
    L = L_BT(r_Q + r_L)                                        (`bradley_terry` with margin / smoothing / centering)
      + corr_coef  * ( |rho(r_Q, len)| - s * rho(r_L, len) ) rho: Pearson over all 2N responses (chosen and rejected)
      + ortho_coef * |W_Q^T W_L|
  s = length_sign: +1 (the paper's setting, longer responses preferred: r_L grows with length) or -1 (data where the
  shorter response wins: r_L must fall with length to carry the length signal). Only r_Q is used downstream.
  rho is 0 when scores or lengths are constant.
  Metrics: those of `bradley_terry` on r_Q + r_L (`loss` is the total), `corr_loss`, `ortho_loss` (unweighted
  terms), `corr_quality_length`, `corr_length_length` (the two rho), `quality_accuracy` (r_Q,c > r_Q,r).
  """
  qc, qr, lc, lr = _f32(quality_chosen), _f32(quality_rejected), _f32(length_chosen), _f32(length_rejected)
  loss_bt, metrics = bradley_terry(qc + lc, qr + lr, margin, label_smoothing, center_coef, weights)
  w = _pair_weights(qc, weights)
  w2 = jnp.concatenate([w, w])
  lengths = jnp.concatenate([_f32(chosen_lengths), _f32(rejected_lengths)])
  rho_q = _weighted_corr(jnp.concatenate([qc, qr]), lengths, w2)
  rho_l = _weighted_corr(jnp.concatenate([lc, lr]), lengths, w2)
  corr_loss = jnp.abs(rho_q) - length_sign * rho_l
  ortho_loss = jnp.abs(jnp.vdot(_f32(quality_head_weight).reshape(-1), _f32(length_head_weight).reshape(-1)))
  loss = loss_bt + corr_coef * corr_loss + ortho_coef * ortho_loss
  return loss, {
      **metrics,
      "loss": loss,
      "corr_loss": corr_loss,
      "ortho_loss": ortho_loss,
      "corr_quality_length": rho_q,
      "corr_length_length": rho_l,
      "quality_accuracy": _wmean((qc > qr).astype(jnp.float32), w),
  }


@register_loss("preference", "kto")
def kto(policy_logps: jax.Array, reference_logps: jax.Array, kl_policy_logps: jax.Array,
        kl_reference_logps: jax.Array, desirable: jax.Array, beta: float = 0.1, desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0, weights: Optional[jax.Array] = None) -> tuple[jax.Array, Metrics]:
  """KTO (Ethayarajh et al. 2024, Kahneman-Tversky Optimization) on unpaired examples, each desirable or not.

  policy_logps / reference_logps [N]: summed log-probs of each example's response under the policy / the frozen
  reference; kl_policy_logps / kl_reference_logps [N]: the same of mismatched (prompt, response) rows, the prompt of
  one example with the response of another (the reference point's estimate); desirable [N]: 1 = desirable (y_D),
  0 = undesirable (y_U); beta > 0; lambda_D, lambda_U = desirable_weight, undesirable_weight.
    r_i  = pi_i - ref_i                                          implicit reward (log-ratio)
    z0   = max(0, mean_i (pi'_i - ref'_i)), gradient stopped        the KL reference point, over mismatched rows
    v_i  = lambda_D sigmoid(beta (r_i - z0))   if desirable_i
           lambda_U sigmoid(beta (z0 - r_i))   otherwise
    L    = mean_i (lambda_{y_i} - v_i)
  Means are w-weighted over the rows (`weights`, 0 = padding). Metrics: `loss`, `kl` (z0), `desirable_reward`,
  `undesirable_reward` (means of beta r over each kind; 0 where a batch has none), `desirable_share`.
  """
  r = _f32(policy_logps) - _f32(reference_logps)
  w = _pair_weights(r, weights)
  good = _f32(desirable) > 0
  z0 = jax.lax.stop_gradient(jnp.maximum(_wmean(_f32(kl_policy_logps) - _f32(kl_reference_logps), w), 0.0))
  lam = jnp.where(good, desirable_weight, undesirable_weight)
  value = lam * jax.nn.sigmoid(jnp.where(good, beta * (r - z0), beta * (z0 - r)))
  loss = _wmean(lam - value, w)
  w_good, w_bad = w * good, w * (~good)
  return loss, {
      "loss": loss,
      "kl": z0,
      "desirable_reward": _wmean(beta * r, w_good),
      "undesirable_reward": _wmean(beta * r, w_bad),
      "desirable_share": _wmean(good.astype(jnp.float32), w),
  }
