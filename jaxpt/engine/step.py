"""The one train step: gradients (optionally accumulated over micro-batches) -> optax update.

Every trainer uses it; only the gradient differs: `loss_fn(params, batch, rng) -> (loss, metrics)` (LM, policy
losses), or a `grad_fn(params, aux, batch, rng) -> (grads, aux, metrics)` that also updates the state's `aux` (the
reward model's DIR estimator). With a `trainable` mask (LoRA) only the trainable part of the params is updated and
has optimizer state; the gradient function still sees the whole params, and the gradients of the frozen leaves,
never read, are removed from the compiled step by XLA (no weight-gradient matmuls for the frozen base).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpt.engine.state import TrainState, trainable_part, with_part

LossFn = Callable[[Any, dict, jax.Array], tuple[jax.Array, dict]]
GradFn = Callable[[Any, Any, dict, jax.Array], tuple[Any, Any, dict]]  # (params, aux, batch, rng) -> grads, aux, m
TrainStep = Callable[[TrainState, dict], tuple[TrainState, dict]]


def split_micro_batches(batch: dict, num_micro: int) -> dict:
  """[B, ...] -> [num_micro, B / num_micro, ...] for every leaf.

  Under logical-axis rules (a device mesh), each micro-batch is spread over the data-parallel devices (one
  all-to-all per step) rather than living on a few of them; without rules this is a plain reshape.
  """

  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f"batch dimension {x.shape[0]} not divisible by optim.grad_accum_steps={num_micro}")
    micro = x.reshape((num_micro, x.shape[0] // num_micro) + x.shape[1:])
    return nn.with_logical_constraint(micro, (None, "batch") + (None,) * (x.ndim - 1))

  return jax.tree.map(split, batch)


def grad_fn_of(loss_fn: Callable[..., tuple[jax.Array, dict]], reads_aux: bool = False) -> GradFn:
  """The GradFn of `loss_fn(params, batch, rng) -> (loss, metrics)`, or with `reads_aux` of `loss_fn(params, batch,
  rng, aux)` (the aux state as a fixed input, e.g. GRPO's CLIPO head); `aux` passes through unchanged."""
  value_and_grad = jax.value_and_grad(loss_fn, has_aux=True, allow_int=True)  # QLoRA's int codes: float0 grads

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    (_, metrics), grads = value_and_grad(params, batch, rng, *((aux,) if reads_aux else ()))
    return grads, aux, metrics

  return grad_fn


def _is_float0(x) -> bool:
  """The gradient of an integer leaf (QLoRA's codes, `allow_int=True`): jax's float0, nothing to accumulate."""
  return x.dtype == jax.dtypes.float0


def accumulate(grad_fn: GradFn, params: Any, aux: Any, batch: dict, rng: jax.Array, num_micro: int = 1,
               weight_key: str = "num_tokens") -> tuple[Any, Any, dict]:
  """(grads, aux, metrics) of the batch, computed over `num_micro` micro-batches with a scan.

  Each micro-batch i has loss L_i over n_i = metrics[weight_key] units (1 if absent). The batch loss is
  L = sum_i n_i L_i / sum_i n_i, so grad L = sum_i n_i grad L_i / sum_i n_i, equal (to fp tolerance) to one
  gradient over the whole batch. Metrics are n-weighted means, except `weight_key` which is summed. `aux` is
  carried from one micro-batch to the next in order (e.g. the DIR estimator's inner updates). Micro-batch i uses
  rng fold_in(rng, i).
  """
  if num_micro == 1:
    return grad_fn(params, aux, batch, rng)
  micro = split_micro_batches(batch, num_micro)

  def body(carry, xs):
    grad_sum, aux, metric_sum, weight_sum = carry
    index, micro_batch = xs
    grads, aux, metrics = grad_fn(params, aux, micro_batch, jax.random.fold_in(rng, index))
    n = jnp.asarray(metrics.get(weight_key, 1.0), jnp.float32)
    grad_sum = jax.tree.map(lambda acc, g: acc if _is_float0(g) else acc + n * g.astype(jnp.float32), grad_sum, grads)
    metric_sum = jax.tree.map(lambda acc, m: acc + n * m, metric_sum, metrics)
    return (grad_sum, aux, metric_sum, weight_sum + n), None

  shapes = jax.eval_shape(lambda: grad_fn(params, aux, jax.tree.map(lambda x: x[0], micro), rng))
  zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(() if _is_float0(s) else s.shape, jnp.float32), tree)
  init = (zeros(shapes[0]), aux, zeros(shapes[2]), jnp.zeros((), jnp.float32))
  (grad_sum, aux, metric_sum, total), _ = jax.lax.scan(body, init, (jnp.arange(num_micro), micro))
  denom = jnp.where(total > 0, total, 1.0)
  grads = jax.tree.map(lambda g, s, p: np.zeros(s.shape, s.dtype) if _is_float0(s) else (g / denom).astype(p.dtype),
                       grad_sum, shapes[0], params)
  metrics = {k: v / denom for k, v in metric_sum.items()}
  if weight_key in metrics:
    metrics[weight_key] = total
  return grads, aux, metrics


def accumulate_gradients(loss_fn: LossFn, params: Any, batch: dict, rng: jax.Array, num_micro: int = 1,
                         weight_key: str = "num_tokens") -> tuple[Any, dict]:
  """(grads, metrics) of `loss_fn` over the batch in `num_micro` micro-batches (`accumulate` without aux)."""
  grads, _, metrics = accumulate(grad_fn_of(loss_fn), params, None, batch, rng, num_micro, weight_key)
  return grads, metrics


def all_finite(tree: Any) -> jax.Array:
  """bool scalar: every element of every leaf of `tree` is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def make_train_step(loss_fn: LossFn | None, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                    grad_accum_steps: int = 1, weight_key: str = "num_tokens", *, grad_fn: GradFn | None = None,
                    skip_nonfinite: bool = False, trainable: Any = None) -> TrainStep:
  """Returns `train_step(state, batch) -> (state, metrics)` (un-jitted); metrics gain `grad_norm`, `lr` and
  `nonfinite` (1.0 when the loss, the gradient norm or an updated parameter is NaN or inf, else 0.0).

  The gradient comes from `loss_fn(params, batch, rng) -> (loss, metrics)`, or from `grad_fn(params, aux, batch,
  rng) -> (grads, aux, metrics)` for a step that also updates `state.aux` (give exactly one). With `skip_nonfinite`
  a non-finite step keeps the old params, optimizer state and aux (the step count still advances). The step's
  randomness is `fold_in(state.rng, state.step)`, so it depends only on the step number. `trainable`: a tree of
  bools shaped like the params (None: all train); `optimizer` then works on `trainable_part(params, trainable)`, and
  `grad_norm` and the finiteness check cover that part.
  """
  if (loss_fn is None) == (grad_fn is None):
    raise ValueError("make_train_step: give exactly one of loss_fn and grad_fn")
  grad_fn = grad_fn or grad_fn_of(loss_fn)

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    part = trainable_part(state.params, trainable)

    def part_grad_fn(part: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
      if trainable is None:
        return grad_fn(part, aux, batch, rng)
      grads, aux, metrics = grad_fn(with_part(state.params, part), aux, batch, rng)
      return trainable_part(grads, trainable), aux, metrics

    grads, aux, metrics = accumulate(part_grad_fn, part, state.aux, batch, state.step_rng(), grad_accum_steps,
                                     weight_key)
    updates, opt_state = optimizer.update(grads, state.opt_state, part)
    new_part = optax.apply_updates(part, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm) & all_finite(new_part) & jnp.isfinite(metrics.get("loss", 0.0))
    new = (new_part, opt_state, aux)
    if skip_nonfinite:
      new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, (part, state.opt_state, state.aux))
    metrics = dict(metrics, grad_norm=grad_norm, lr=jnp.asarray(schedule(state.step), jnp.float32),
                   nonfinite=1.0 - finite.astype(jnp.float32))
    new_part, opt_state, aux = new
    params = with_part(state.params, new_part) if trainable is not None else new_part
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, aux=aux), metrics

  return train_step
