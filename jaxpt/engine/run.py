"""The one loop path of every trainer: its `build(config, workdir)` returns a `BuiltRun`, which `run_built` trains.

    built = jaxpt.build("rm", config, workdir)        # TRAINERS.get("rm") builds it: data, model, compiled step
    result = jaxpt.train("rm", config, workdir, built=built)   # -> run_built(built, workdir): LoopResult

`run_built`: `hooks.init_state` -> `train_loop` (restore, record the launch, `hooks.train_step` on `batches`,
`evaluate`, checkpoints) -> `hooks.finished`. What differs between trainers is in their `Hooks`: the DPO reference's
log-probs before each step, GRPO's rollouts and minibatch updates, the reward-model report at the end. The CLI's
`jaxpt <trainer>` is `run_command`: the same path with one start line and one summary line.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Callable, Iterator

from absl import logging

from jaxpt import parallel
from jaxpt.engine.builder import Training
from jaxpt.engine.config import RunConfig, config_json
from jaxpt.engine.loop import LoopResult, print_summary, train_loop
from jaxpt.engine.record import record_launch
from jaxpt.engine.state import TrainState
from jaxpt.engine.trainers import TRAINERS
from jaxpt.models.transformer import param_count

__all__ = ["BuiltRun", "Hooks", "build", "run_built", "run_command", "train"]


class Hooks:
  """What a trainer changes in the one loop path; these defaults are a supervised run's (the shared compiled step
  on each batch, nothing after the loop). Trainers subclass it and override what differs."""

  def init_state(self, training: Training) -> TrainState:
    """The run's initial state, before any checkpoint restores into it (`Training.init_state`)."""
    return training.init_state()

  def train_step(self, training: Training, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
    """One loop step: `training.train_step` on the batch."""
    return training.train_step(state, batch)

  def finished(self, result: LoopResult, workdir: str) -> None:
    """After the loop returned (also when preempted: `result.preempted`)."""

  def describe(self) -> str:
    """What the start line adds after the compiled step's memory ('' = nothing)."""
    return ""


@dataclasses.dataclass
class BuiltRun:
  """A run built once by its trainer (`Trainer.build`); `run_built` trains it, and it can serve several runs.

  Attributes:
    trainer: its name in `TRAINERS`.
    title: the run's name in the start line and the log ('rm (dir)', 'dpo + DIR'); default `trainer`.
    config: the checked run config.
    training: the model, optimizer and shared step compiled for the mesh (`jaxpt.engine.builder.Training`).
    batches: `batches(start)` -> the batches of steps start, start + 1, ... (the loop's data).
    inputs: the run record's input digests (`jaxpt.engine.record.record_launch`): corpus, tokenizer, images, ...
    tokenizer: the tokenizer the launch keeps in `workdir/tokenizer` (None for image runs).
    data: the run's data object (`LMData`, `PreferenceData`, `ImageData`, the GRPO prompts, ...), for inspection.
    evaluate: `evaluate(state) -> {eval_*: scalar}` (None: the run has no eval set).
    hooks: what the trainer changes in the loop path (`Hooks`).
  """

  trainer: str
  config: RunConfig
  training: Training
  batches: Callable[[int], Iterator[Any]]
  inputs: dict[str, str]
  tokenizer: Any = None
  data: Any = None
  evaluate: Callable[[TrainState], dict] | None = None
  hooks: Hooks = dataclasses.field(default_factory=Hooks)
  title: str = ""

  def init_state(self) -> TrainState:
    return self.hooks.init_state(self.training)

  def train_step(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
    return self.hooks.train_step(self.training, state, batch)

  def describe(self) -> str:
    """The start line of `jaxpt <trainer>`: processes, devices, mesh, rules, compiled memory."""
    return self.training.describe(self.title or self.trainer) + self.hooks.describe()


def run_built(built: BuiltRun, workdir: str, stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) `built` in `workdir`: the launch is recorded once its checkpoint restored, then the loop
  runs to `config.steps` (or `stop_at`, as if preempted there); `hooks.finished` last. The loop's result."""
  config = built.config
  state = built.init_state()
  logging.info("%s: %.2fM params; training %d steps in %s", built.title or built.trainer,
               param_count(state.params) / 1e6, config.steps, workdir)
  parallel.log_memory(f"{built.trainer}_train_step", built.training.memory)
  result = train_loop(state, built.train_step, built.batches, config.loop, workdir, eval_fn=built.evaluate,
                      meta={"config": config_json(config)}, stop_at=stop_at,
                      record=lambda: record_launch(workdir, config, built.inputs, built.tokenizer))
  built.hooks.finished(result, workdir)
  return result


def build(trainer: str, config: Any, workdir: str) -> BuiltRun:
  """The run of trainer `trainer` (a name in `TRAINERS`) for `config` (its run config, or a ConfigDict checked
  here: ConfigError naming the field), built for `workdir`: data prepared there, model, compiled step."""
  return TRAINERS.get(trainer).build_function(config, workdir)


def train(trainer: str, config: Any, workdir: str, *, built: BuiltRun | None = None,
          stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) a `trainer` run ('pretrain', 'sft', 'rm', 'dpo', 'grpo', 'vit', 'dit', ...: `TRAINERS`)
  of `config` in `workdir`; `built` (from `build`, same trainer) reuses compiled functions across runs."""
  if built is not None and built.trainer != trainer:
    raise ValueError(f"built is a {built.trainer} run, not a {trainer} run")
  return run_built(built or build(trainer, config, workdir), workdir, stop_at)


def run_command(trainer: str, config: Any, workdir: str) -> int:
  """`jaxpt <trainer>`: builds, prints the start line (mesh, memory), trains, prints one summary line of the
  trainer's `summary` keys ('eval_accuracy*': every key with that prefix); the exit code."""
  built = build(trainer, config, workdir)
  print(built.describe(), flush=True)
  result = run_built(built, workdir)
  keys = [k for pattern in TRAINERS.get(trainer).summary for k in sorted(fnmatch.filter(result.last_row, pattern))]
  return print_summary(trainer, result, workdir, keys)
