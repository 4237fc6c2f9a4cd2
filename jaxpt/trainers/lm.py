"""LM step functions: the loss_fn the generic train step differentiates, and a held-out evaluator."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import ConfigError, Section, in_range
from jaxpt.losses import get_loss
from jaxpt.nn.moe import aux_losses as moe_aux_losses
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import LossFn


@dataclasses.dataclass(frozen=True)
class LMLossConfig(Section):
  """The `loss` section of LM runs.

  Attributes:
    name: a registered `lm` loss (`jaxpt.losses`), e.g. lm_cross_entropy.
    z_loss: weight of the z-loss on the log of the softmax normaliser (0 = off).
  """

  name: str = "lm_cross_entropy"
  z_loss: float = 1e-4

  def check(self) -> None:
    try:
      get_loss("lm", self.name)
    except KeyError as e:
      raise ConfigError("name", e.args[0], self.name) from None
    in_range(self, "z_loss", 0.0)

  def kwargs(self) -> dict[str, Any]:
    """The loss function's keyword arguments."""
    return {"z_loss": self.z_loss}


def _forward(model: nn.Module, params: Any, batch: dict, rng: jax.Array | None,
             moe: bool = False) -> tuple[jax.Array, dict]:
  """(logits [B, S, V] for batch['inputs'] with its positions/segment_ids, the MoE aux losses averaged over the
  layers (`jaxpt.nn.moe.aux_losses`; {} unless `moe`)); dropout on iff rng is given."""
  out = model.apply({"params": params}, batch["inputs"], positions=batch.get("positions"),
                    segment_ids=batch.get("segment_ids"), deterministic=rng is None,
                    rngs=None if rng is None else {"dropout": rng}, mutable=["losses"] if moe else False)
  if not moe:
    return out, {}
  logits, state = out
  return logits, moe_aux_losses(state.get("losses", {}))


def make_lm_loss_fn(model: nn.Module, loss_name: str = "lm_cross_entropy", train: bool = True,
                    **loss_kwargs: Any) -> LossFn:
  """loss_fn(params, batch, rng) -> (loss, metrics): model.apply -> registered loss on (targets, weights).

  A model with `num_experts > 0` adds moe_load_balance_coef * moe_load_balance + moe_router_z_coef * moe_router_z
  (each averaged over the layers; `jaxpt.nn.moe`) to the loss, and reports both terms unweighted in the metrics.

  With train=False, or a model without dropout, the rng is ignored (deterministic forward).
  """
  loss = get_loss("lm", loss_name)
  config = getattr(model, "config", None)
  use_rng = train and getattr(config, "dropout_rate", 0.0) > 0
  moe = getattr(config, "num_experts", 0) > 0
  coefs = {"moe_load_balance": getattr(config, "moe_load_balance_coef", 0.0),
           "moe_router_z": getattr(config, "moe_router_z_coef", 0.0)}

  def loss_fn(params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
    logits, aux = _forward(model, params, batch, rng if use_rng else None, moe)
    value, metrics = loss(logits, batch["targets"], batch["weights"], **loss_kwargs)
    if aux:  # MoE: + the weighted aux losses; metrics keep each unweighted
      value = value + sum(coefs[name] * term for name, term in aux.items())
      metrics = dict(metrics, loss=value, **aux)
    return value, metrics

  return loss_fn


def make_lm_evaluator(model: nn.Module, eval_batches: Sequence[dict],
                      loss_name: str = "lm_cross_entropy") -> Callable[[TrainState], dict]:
  """evaluate(state) -> {eval_loss, eval_ppl, eval_accuracy} over all `eval_batches` (token-weighted).

  eval_loss = sum_b N_b nll_b / sum_b N_b (no z-loss); eval_ppl = exp(eval_loss).
  """
  if not eval_batches:
    raise ValueError("make_lm_evaluator: no eval batches (data.eval_batches must be >= 1)")
  loss_fn = make_lm_loss_fn(model, loss_name, train=False)

  @jax.jit
  def eval_step(params: Any, batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    _, metrics = loss_fn(params, batch, jax.random.PRNGKey(0))
    n = metrics["num_tokens"]
    return n * metrics["nll"], n * metrics["accuracy"], n

  device_batches = [jax.tree.map(jnp.asarray, b) for b in eval_batches]

  def evaluate(state: TrainState) -> dict:
    sums = np.zeros(3, np.float64)
    for batch in device_batches:
      sums += np.asarray(jax.device_get(eval_step(state.params, batch)), np.float64)
    nll_sum, correct_sum, n = sums
    eval_loss = nll_sum / max(n, 1.0)
    return {"eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 700.0)),
            "eval_accuracy": correct_sum / max(n, 1.0)}

  return evaluate
