"""Pretraining: run config -> data -> model -> the shared builder and step -> the train loop.

SFT (`jaxpt.trainers.sft`) is this trainer with other data and evaluation: both go through `build_lm_run`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from jaxpt.config import from_section
from jaxpt.data.config import LMDataConfig
from jaxpt.data.pipeline import LMData, local_corpus_id
from jaxpt.models.transformer import TransformerLM
from jaxpt.progress import say
from jaxpt.engine.builder import batch_shapes, build_training, training_mesh
from jaxpt.engine.config import RunConfig, check_vocab
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.trainers.lm import LMLossConfig, make_lm_evaluator, make_lm_loss_fn
from jaxpt.engine.record import check_launch, digest, resumes, run_inputs
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.state import TrainState


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainRunConfig(RunConfig):
  """A pretraining run: `RunConfig` plus these sections.

  Attributes:
    data: the training text and its batching (required section).
    loss: the `lm` loss and its options.
  """

  data: LMDataConfig
  loss: LMLossConfig = LMLossConfig()

  def check(self) -> None:
    super().check()
    self.check_seq_len(self.data.seq_len, "data.seq_len")
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")


def build_lm_run(trainer: str, config: PretrainRunConfig, mesh, data: LMData,
                 make_evaluate: Callable[[list[dict]], Callable[[TrainState], dict]]) -> BuiltRun:
  """What every LM-loss trainer (pretraining, SFT) shares, for a checked `config`, its `data` and its mesh
  (`training_mesh`): the model and the shared builder, global batches, and `make_evaluate(eval_batches)` run under
  the mesh's rules (only when data.eval_batches > 0)."""
  check_vocab(config.model, data.tokenizer.vocab_size)
  model = TransformerLM(config.model, lora=config.lora.spec())
  batch_size = config.data.batch_size
  say("compiling the train step ...")
  training = build_training(
      config, mesh, model, (jnp.zeros((1, config.data.seq_len), jnp.int32),),
      batch_shapes(data.train_batch(0), batch_size),
      loss_fn=make_lm_loss_fn(model, config.loss.name, **config.loss.kwargs()))
  evaluate = None
  if config.data.eval_batches:  # the evaluators read config.model alone: with LoRA, the merged params
    evaluate_merged = make_evaluate([training.put(b) for b in data.eval_batches()])
    evaluate = training.under_rules(lambda state: evaluate_merged(
        state.replace(params=training.merged_params(state.params))))
  return BuiltRun(trainer, config, training, training.batches(data.train_batch, batch_size),
                  inputs=run_inputs(data.corpus_id, data.tokenizer), tokenizer=data.tokenizer, data=data,
                  evaluate=evaluate)


def build(config: PretrainRunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (a PretrainRunConfig, or a ConfigDict converted here; ConfigError naming the field), then
  builds data, model, optimizer and the compiled step. The mesh comes from `config.mesh`."""
  config = from_section(PretrainRunConfig, config, "config")
  mesh = training_mesh(config, config.data.batch_size)  # before any data work
  say(f"preparing data in {workdir} ...")
  corpus_id = local_corpus_id(config.data)
  check_launch(workdir, config, None if corpus_id is None else {"corpus": digest(corpus_id)})
  data = LMData.create(config.data, vocab_size=config.model.vocab_size, workdir=workdir, seed=config.seed,
                       keep_tokenizer=resumes(workdir),
                       tokenizer=init_tokenizer(config.init_from, workdir, resumes(workdir), config.model))
  model = TransformerLM(config.model)
  return build_lm_run("pretrain", config, mesh, data,
                      lambda eval_batches: make_lm_evaluator(model, eval_batches, config.loss.name))
