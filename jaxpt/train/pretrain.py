"""Pretraining: config -> data -> model -> optimizer -> the generic train loop."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from jaxpt.data.pipeline import LMData
from jaxpt.models.config import ConfigError, ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.train.config import validate_config
from jaxpt.train.lm import make_lm_evaluator, make_lm_loss_fn
from jaxpt.train.loop import LoopConfig, LoopResult, train_loop
from jaxpt.train.optim import decay_mask, make_optimizer
from jaxpt.train.state import TrainState
from jaxpt.train.step import make_train_step


@dataclasses.dataclass
class Pretraining:
  """Everything `train_loop` needs, built once; `train_step` is jitted and can serve several runs."""

  model_config: ModelConfig
  model: nn.Module
  data: LMData
  init_state: Callable[[], TrainState]  # fresh (un-donated) initial state each call
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  batches: Callable[[int], Iterator[dict]]
  evaluate: Callable[[TrainState], dict] | None
  loop_config: LoopConfig
  meta: dict


def build_pretraining(config: Any, workdir: str) -> Pretraining:
  """Validates `config` (ConfigError naming the field), then builds data, model, optimizer and step functions.

  Init/dropout keys: split(PRNGKey(config.seed)) -> (init, train); step t uses fold_in(train, t).
  """
  model_config = validate_config(config)
  try:
    data = LMData.create(config.data, vocab_size=model_config.vocab_size, workdir=workdir, seed=config.seed)
  except ValueError as e:  # the data layer names the field (e.g. a vocab too small for the corpus)
    raise ConfigError(str(e) if str(e).startswith("config.") else f"config.{e}") from e
  if data.tokenizer.vocab_size > model_config.vocab_size:
    raise ConfigError(f"config.model.vocab_size={model_config.vocab_size}: smaller than the tokenizer's "
                      f"{data.tokenizer.vocab_size} tokens")
  model = TransformerLM(model_config)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  dummy = jnp.zeros((1, config.data.seq_len), jnp.int32)
  boxed = jax.eval_shape(model.init, init_rng, dummy)["params"]
  optimizer, schedule = make_optimizer(config.optim, config.steps, mask=decay_mask(boxed))

  @jax.jit
  def init_state() -> TrainState:
    params = nn.meta.unbox(model.init(init_rng, dummy)["params"])
    return TrainState.create(params, optimizer, train_rng)

  loss_name = config.loss.name
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  step_fn = make_train_step(make_lm_loss_fn(model, loss_name, **loss_kwargs), optimizer, schedule,
                            grad_accum_steps=config.optim.grad_accum_steps)
  # On CPU a checkpoint's host copy may alias device memory, so donate the state only on accelerators.
  donate = (0,) if jax.default_backend() != "cpu" else ()
  train_step = jax.jit(step_fn, donate_argnums=donate)
  eval_batches = data.eval_batches() if config.data.eval_batches else []
  evaluate = make_lm_evaluator(model, eval_batches, loss_name) if eval_batches else None
  return Pretraining(
      model_config=model_config, model=model, data=data, init_state=init_state, train_step=train_step,
      batches=lambda start: data.train_batches(start_step=start, process_index=jax.process_index(),
                                               process_count=jax.process_count()),
      evaluate=evaluate, loop_config=LoopConfig.from_config(config),
      meta={"config": json.loads(config.to_json_best_effort())})


def pretrain(config: Any, workdir: str, *, setup: Pretraining | None = None,
             stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) the run in `workdir`; returns the loop's result. `setup` reuses compiled functions."""
  os.makedirs(workdir, exist_ok=True)
  setup = setup or build_pretraining(config, workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  state = setup.init_state()
  n_params = sum(int(p.size) for p in jax.tree.leaves(state.params))
  logging.info("model: %.2fM params; training %d steps in %s", n_params / 1e6, config.steps, workdir)
  return train_loop(state, setup.train_step, setup.batches, setup.loop_config, workdir, eval_fn=setup.evaluate,
                    meta=setup.meta, stop_at=stop_at)
