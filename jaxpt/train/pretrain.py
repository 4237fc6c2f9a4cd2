"""Pretraining: config -> data -> model -> optimizer -> the generic train loop."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from jaxpt import parallel
from jaxpt.data.pipeline import LMData
from jaxpt.models.config import ConfigError, ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.train.checkpoint import load_run_params
from jaxpt.train.config import check_vocab, validate_config
from jaxpt.train.lm import make_lm_evaluator, make_lm_loss_fn
from jaxpt.train.loop import LoopConfig, LoopResult, save_run_config, train_loop
from jaxpt.train.optim import decay_mask, make_optimizer
from jaxpt.train.sharded import ShardedTraining, shard_training
from jaxpt.train.state import TrainState
from jaxpt.train.step import make_train_step


@dataclasses.dataclass
class Pretraining:
  """Everything `train_loop` needs, built once; `train_step` is jitted and can serve several runs."""

  model_config: ModelConfig
  model: nn.Module
  data: LMData
  init_state: Callable[[], TrainState]  # fresh (un-donated) initial state each call, sharded on the mesh
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]  # compiled for the mesh
  batches: Callable[[int], Iterator[dict]]  # global [B, ...] arrays; this process reads only its rows
  evaluate: Callable[[TrainState], dict] | None
  loop_config: LoopConfig
  meta: dict
  sharded: ShardedTraining  # mesh, rules, shardings, compiled per-device memory

  @property
  def memory(self) -> dict:
    """Compiled per-device memory of the train step in MiB (argument, output, temp, alias, peak)."""
    return self.sharded.memory


def build_pretraining(config: Any, workdir: str) -> Pretraining:
  """Validates `config` (ConfigError naming the field), then builds data, model, optimizer and step functions.

  Init/dropout keys: split(PRNGKey(config.seed)) -> (init, train); step t uses fold_in(train, t).
  The mesh comes from `config.mesh` (see `jaxpt.parallel.mesh`); the train step is compiled here, for it.
  """
  model_config = validate_config(config)
  mesh = make_checked_mesh(config)  # before any data work
  try:
    data = LMData.create(config.data, vocab_size=model_config.vocab_size, workdir=workdir, seed=config.seed)
  except ValueError as e:  # the data layer names the field (e.g. a vocab too small for the corpus)
    raise ConfigError(str(e) if str(e).startswith("config.") else f"config.{e}") from e
  model = TransformerLM(model_config)
  loss_name = config.loss.name
  return build_lm_training(config, model_config, data, mesh,
                           lambda eval_batches: make_lm_evaluator(model, eval_batches, loss_name))


def make_checked_mesh(config: Any):
  """The device mesh of `config.mesh`, checked against the devices and `config.data.batch_size` (ConfigError
  naming the fields); trainers call it before any data work."""
  mesh = parallel.make_mesh(parallel.MeshConfig.from_config(config))
  parallel.check_global_batch(int(config.data.batch_size), mesh)
  return mesh


def build_lm_training(config: Any, model_config: ModelConfig, data: LMData, mesh,
                      make_evaluate: Callable[[list[dict]], Callable[[TrainState], dict]]) -> Pretraining:
  """What every LM-loss trainer (pretraining, SFT) shares, for a validated `config`, its `data` and its mesh
  (`make_checked_mesh`): model, optimizer, the train step compiled for the mesh, sharded init (params from
  `config.init_from`'s latest checkpoint when that is set), global batches, and `make_evaluate(eval_batches)` run
  under the mesh's rules."""
  mesh_config = parallel.MeshConfig.from_config(config)
  batch_size = int(config.data.batch_size)
  check_vocab(model_config, data.tokenizer.vocab_size)
  rules = mesh_config.logical_rules
  model = TransformerLM(model_config)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  dummy = jnp.zeros((1, config.data.seq_len), jnp.int32)
  boxed = jax.eval_shape(model.init, init_rng, dummy)["params"]
  parallel.check_param_divisibility(boxed, mesh, rules, mesh_config.rules)
  optimizer, schedule = make_optimizer(config.optim, config.steps, mask=decay_mask(boxed))

  def init_fn() -> TrainState:
    params = nn.meta.unbox(model.init(init_rng, dummy)["params"])
    return TrainState.create(params, optimizer, train_rng)

  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  step_fn = make_train_step(make_lm_loss_fn(model, config.loss.name, **loss_kwargs), optimizer, schedule,
                            grad_accum_steps=config.optim.grad_accum_steps)
  batch_sh = parallel.batch_sharding(mesh, rules)
  data_index, data_count = parallel.process_batch_slice(batch_sh, batch_size)
  sample = data.train_batch(0, data_index, data_count)
  batch_shapes = {k: jax.ShapeDtypeStruct((batch_size,) + v.shape[1:], v.dtype) for k, v in sample.items()}
  # On CPU a checkpoint's host copy may alias device memory, so donate the state only on accelerators.
  sharded = shard_training(init_fn, step_fn, boxed, optimizer, mesh, rules, batch_shapes,
                           donate=jax.default_backend() != "cpu")
  evaluate = None
  if config.data.eval_batches:
    evaluate = with_rules(make_evaluate([parallel.full_batch(b, batch_sh) for b in data.eval_batches()]), mesh,
                          rules)
  init_from = config.get("init_from", "")

  def init_state() -> TrainState:
    state = sharded.init_state()
    if init_from:  # only the params: the optimizer state starts fresh
      state = state.replace(params=load_run_params(init_from, state.params))
    return state

  def batches(start: int) -> Iterator[dict]:
    local = data.train_batches(start_step=start, process_index=data_index, process_count=data_count)
    return parallel.global_batches(local, batch_sh, batch_size)

  return Pretraining(
      model_config=model_config, model=model, data=data, init_state=init_state, train_step=sharded.train_step,
      batches=batches, evaluate=evaluate, loop_config=LoopConfig.from_config(config),
      meta={"config": json.loads(config.to_json_best_effort())}, sharded=sharded)


def with_rules(evaluate: Callable[[TrainState], dict], mesh, rules) -> Callable[[TrainState], dict]:
  """`evaluate` with activation constraints on the mesh (its jitted step traces on the first call)."""

  def run(state: TrainState) -> dict:
    with parallel.activation_sharding(mesh, rules):
      return evaluate(state)

  return run


def pretrain(config: Any, workdir: str, *, setup: Pretraining | None = None,
             stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) the run in `workdir`; returns the loop's result. `setup` reuses compiled functions."""
  setup = setup or build_pretraining(config, workdir)
  save_run_config(config, workdir)
  state = setup.init_state()
  n_params = sum(int(p.size) for p in jax.tree.leaves(state.params))
  logging.info("model: %.2fM params; training %d steps in %s", n_params / 1e6, config.steps, workdir)
  logging.info("mesh %s (rules %s); %d process(es)", dict(setup.sharded.mesh.shape),
               parallel.MeshConfig.from_config(config).rules, jax.process_count())
  parallel.log_memory("train_step", setup.memory)
  return train_loop(state, setup.train_step, setup.batches, setup.loop_config, workdir, eval_fn=setup.evaluate,
                    meta=setup.meta, stop_at=stop_at)
