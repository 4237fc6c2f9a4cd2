"""CLUB mutual-information upper bound with a categorical variational network q_psi(a | X) (the DIR estimator).

Spec: /work/shared/specs/dir.md. Three pieces, all pure functions over a params dict (so they compose with jit, grad,
scan and optax without a module wrapper):
- the estimator q_psi: Linear(d_in, hidden) -> ReLU -> Linear(hidden, n_classes), always run in float32;
- its own log-likelihood loss and a K-step inner update (X stop-gradient: only psi moves);
- the CLUB estimate, and the penalty form used in the reward-model loss (psi stop-gradient: only X moves).

Conventions: X is `[N, d_in]` (any float dtype, cast to float32), a is int `[N]` in [0, n_classes), optional pair
weights `[N]` (0 = padding pair; default all ones). With weights, every mean over pairs is a w-weighted mean.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

Params = dict[str, jax.Array]

CLUB_INPUT_MODES = ("difference", "concat")


def club_input(hidden_chosen: jax.Array, hidden_rejected: jax.Array, mode: str = "difference") -> jax.Array:
  """X from last-token hidden states h_c, h_r `[N, d]`: h_c - h_r (`difference`, `[N, d]`) or [h_c; h_r]
  (`concat`, `[N, 2d]`)."""
  if mode == "difference":
    return hidden_chosen - hidden_rejected
  if mode == "concat":
    return jnp.concatenate([hidden_chosen, hidden_rejected], axis=-1)
  raise ValueError(f"club input mode must be one of {CLUB_INPUT_MODES}, got {mode!r}")


def club_input_dim(d_model: int, mode: str = "difference") -> int:
  """Width of X for hidden size d_model under `mode`."""
  if mode not in CLUB_INPUT_MODES:
    raise ValueError(f"club input mode must be one of {CLUB_INPUT_MODES}, got {mode!r}")
  return d_model if mode == "difference" else 2 * d_model


def length_bias_label(chosen_lengths: jax.Array, rejected_lengths: jax.Array) -> jax.Array:
  """Length bias label a = 1[len(chosen) > len(rejected)] (token counts `[N]`), int32 `[N]` (2 classes)."""
  return (jnp.asarray(chosen_lengths) > jnp.asarray(rejected_lengths)).astype(jnp.int32)


def init_club_estimator(key: jax.Array, d_in: int, n_classes: int = 2, hidden: int = 1024) -> Params:
  """float32 params {w1 [d_in, hidden], b1 [hidden], w2 [hidden, n_classes], b2 [n_classes]} with the PyTorch
  Linear default init (weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))), as in the reference code."""
  k1, k2, k3, k4 = jax.random.split(key, 4)
  s1, s2 = 1.0 / jnp.sqrt(d_in), 1.0 / jnp.sqrt(hidden)
  u = lambda k, shape, s: jax.random.uniform(k, shape, jnp.float32, -s, s)
  return {"w1": u(k1, (d_in, hidden), s1), "b1": u(k2, (hidden,), s1),
          "w2": u(k3, (hidden, n_classes), s2), "b2": u(k4, (n_classes,), s2)}


def club_log_probs(q_params: Params, x: jax.Array) -> jax.Array:
  """log q_psi(. | X) `[N, n_classes]` in float32: log_softmax(relu(X W1 + b1) W2 + b2)."""
  x = x.astype(jnp.float32)
  p = jax.tree_util.tree_map(lambda v: v.astype(jnp.float32), q_params)
  h = jax.nn.relu(x @ p["w1"] + p["b1"])
  return jax.nn.log_softmax(h @ p["w2"] + p["b2"], axis=-1)


def _weights(a: jax.Array, weights: Optional[jax.Array]) -> jax.Array:
  return jnp.ones(a.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)


def _wmean(values: jax.Array, w: jax.Array) -> jax.Array:
  total = jnp.sum(w)
  return jnp.sum(w * values) / jnp.where(total > 0, total, 1.0)


def club_estimator_loss(q_params: Params, x: jax.Array, a: jax.Array,
                        weights: Optional[jax.Array] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The estimator's own loss, L_q(psi) = -(1/N) sum_i log q_psi(a_i | sg(X_i)).

  X is stop-gradient here: this loss trains psi only. Returns (loss, {`loss`, `accuracy`}).
  """
  logp = club_log_probs(q_params, jax.lax.stop_gradient(x))
  w = _weights(a, weights)
  ll = jnp.take_along_axis(logp, a[:, None].astype(jnp.int32), axis=-1)[:, 0]
  loss = -_wmean(ll, w)
  acc = _wmean((jnp.argmax(logp, axis=-1) == a).astype(jnp.float32), w)
  return loss, {"loss": loss, "accuracy": acc}


def club_estimate(q_params: Params, x: jax.Array, a: jax.Array,
                  weights: Optional[jax.Array] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """CLUB upper bound over all N^2 pairs (diagonal included), differentiable in both psi and X:

      I_club = (1/N) sum_i log q(a_i|X_i) - (1/N^2) sum_i sum_j log q(a_j|X_i)

  The double sum is computed exactly in O(N * n_classes): (1/N) sum_j log q(a_j|X_i) = sum_c p_hat(c) log q(c|X_i)
  with p_hat the empirical label frequencies. With weights w: every 1/N sum becomes a w-weighted mean (and p_hat the
  w-weighted frequencies). Returns (I_club, {`club`, `club_positive`, `club_negative`}).
  """
  logp = club_log_probs(q_params, x)
  w = _weights(a, weights)
  n_classes = logp.shape[-1]
  onehot = jax.nn.one_hot(a, n_classes, dtype=jnp.float32)
  positive = _wmean(jnp.sum(onehot * logp, axis=-1), w)
  total = jnp.sum(w)
  p_hat = jnp.sum(w[:, None] * onehot, axis=0) / jnp.where(total > 0, total, 1.0)
  negative = _wmean(logp @ p_hat, w)
  estimate = positive - negative
  return estimate, {"club": estimate, "club_positive": positive, "club_negative": negative}


def club_penalty(q_params: Params, x: jax.Array, a: jax.Array,
                 weights: Optional[jax.Array] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`club_estimate` with psi held constant (stop_gradient on q_params): the gradient reaches X only, and the
  estimator params get exactly zero gradient from the reward-model loss."""
  return club_estimate(jax.lax.stop_gradient(q_params), x, a, weights)


def make_estimator_optimizer(learning_rate: float = 1e-4, weight_decay: float = 0.01) -> optax.GradientTransformation:
  """The reference estimator optimizer: AdamW(lr 1e-4, weight decay 0.01)."""
  return optax.adamw(learning_rate, weight_decay=weight_decay)


def inner_update(q_params: Params, opt_state: Any, x: jax.Array, a: jax.Array,
                 optimizer: optax.GradientTransformation, num_steps: int = 5,
                 weights: Optional[jax.Array] = None) -> tuple[Params, Any, dict[str, jax.Array]]:
  """K (= num_steps, static) optimizer steps on `club_estimator_loss` for the same micro-batch, under `lax.scan`.

  X is stop-gradient (the caller's hidden states get no gradient through this update). `optimizer` is an optax
  GradientTransformation (close over it or mark it static under jit). Returns (q_params, opt_state, metrics) with
  metrics `estimator_loss` [K] (loss before each step) and `estimator_accuracy` [K].
  """
  x = jax.lax.stop_gradient(x)
  grad_fn = jax.value_and_grad(club_estimator_loss, has_aux=True)

  def step(carry, _):
    params, state = carry
    (loss, m), grads = grad_fn(params, x, a, weights)
    updates, state = optimizer.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), (loss, m["accuracy"])

  (q_params, opt_state), (losses, accs) = jax.lax.scan(step, (q_params, opt_state), None, length=num_steps)
  return q_params, opt_state, {"estimator_loss": losses, "estimator_accuracy": accs}
