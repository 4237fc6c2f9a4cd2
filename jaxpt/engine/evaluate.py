"""`jaxpt eval --workdir W [--step N]`: evaluates a checkpoint of an existing run, without training.

The run's recorded trainer (`jaxpt.engine.trainers.recorded_trainer` of `W/config.json`) names its entry in
`TRAINERS`, whose build function rebuilds the run from the record (data from the workdir's caches, model, evaluator,
compiled step); the checkpoint's params are restored into it (`Checkpointer.restore_params`) and the built run's own
`evaluate` runs once (a reference policy, DPO's or KTO's, is rebuilt from `init_from`, as on resume; each trainer's
module docstring says what its eval reports),
so the numbers are those the run's own eval rows in metrics.jsonl hold for that step. Inputs only training reads
(`Trainer.eval_unread`: an RL run's `reward.model`, PPO's `ppo.critic_init`) may be gone: the run is then rebuilt
with them at their defaults (one note each; the eval scores the policy with the verifier, as the run's own eval
did), and a run holding its policy beside a critic (`Trainer.lm_key`) has its policy alone restored. The result
{"step", "run", <metrics>} is one JSON line on stdout and `W/eval/step_<N>.json`; nothing is trained, no checkpoint
or run record is written, and no workdir lock is taken (a run that is still training may be evaluated).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable

import jax

from jaxpt.oserrors import write_atomically
from jaxpt.progress import say
from jaxpt.engine.checkpoint import CheckpointError, Checkpointer
from jaxpt.engine.record import CONFIG_FILE, NoRunRecord, checkpoint_steps, recorded_config
from jaxpt.engine.state import TrainState
from jaxpt.engine.trainers import TRAINERS, Trainer, recorded_trainer

EVAL_DIR = "eval"


class EvalError(ValueError):
  """A workdir with nothing to evaluate (no such checkpoint, no eval set, an unknown trainer): one line."""


def _field(config: Any, dotted: str) -> Any:
  """The value of field `dotted` ('data.eval_batches') of run config `config`."""
  for name in dotted.split("."):
    config = getattr(config, name)
  return config


def _default(config_type: type, dotted: str) -> Any:
  """The default of field or section `dotted` of run config class `config_type`, as its JSON record holds it."""
  value: Any = None
  for name in dotted.split("."):
    field = {f.name: f for f in dataclasses.fields(config_type)}[name]
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    config_type = type(value)
  return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def without_gone_inputs(trainer: Trainer, recorded: dict) -> tuple[dict, list[str]]:
  """(the recorded config `recorded` of a `trainer` run in which every `trainer.eval_unread` field naming a
  directory that is gone has its reset field or section at the default, those named in allow_changes; one note
  per such field). The record itself is not changed."""
  recorded, notes, allowed = json.loads(json.dumps(recorded)), [], []
  for field, reset in trainer.eval_unread:
    section, _, name = field.rpartition(".")
    path = str((recorded.get(section, {}) if section else recorded).get(name) or "")
    if not path or os.path.exists(os.path.expanduser(path.removeprefix("hf:"))):
      continue
    *parents, last = reset.split(".")
    target = recorded
    for parent in parents:
      target = target.setdefault(parent, {})
    target[last] = _default(trainer.config_type, reset)
    allowed.append(reset)
    notes.append(f"{field}={path} is gone; it is only read in training, so the eval runs without it ({reset} at "
                 "its default: the policy is scored by the verifier)")
  if allowed:
    recorded["allow_changes"] = ",".join(filter(None, [str(recorded.get("allow_changes") or "")] + allowed))
  return recorded, notes


def with_recorded_before(trainer: Trainer, recorded: dict) -> dict:
  """`recorded` (a run's config.json) with the fields added since it was written, whose default would change what
  the run does, at the value it ran with (its run config's `recorded_before`, as a resume reads them): an eval
  rebuilds the run it evaluates, not one with today's defaults."""
  from jaxpt.config import from_section

  filled = json.loads(json.dumps(recorded))
  for dotted, value in from_section(trainer.config_type, recorded, "config").recorded_before(recorded).items():
    *sections, last = dotted.split(".")
    target = filled
    for name in sections:
      target = target.setdefault(name, {})
    target.setdefault(last, value)
  return filled


def _build(name: str, recorded: dict, workdir: str) -> tuple[Any, Callable[[TrainState], dict]]:
  """(Training, the trainer's evaluate) of the run recorded as `recorded`, rebuilt by its trainer `name`."""
  if name not in TRAINERS:
    raise EvalError(f"{workdir}: a run of trainer {name!r}, which this jaxpt does not have (known: "
                    f"{', '.join(TRAINERS)})")
  trainer = TRAINERS.get(name)
  recorded, notes = without_gone_inputs(trainer, recorded)
  for note in notes:
    say(note)
  recorded = with_recorded_before(trainer, recorded)
  built = trainer.build_function(recorded, workdir)
  if trainer.eval_set and not _field(built.config, trainer.eval_set):
    raise EvalError(f"{workdir}: the run has no eval set (config.{trainer.eval_set}=0)")
  return built.training, built.evaluate


def evaluate_run(workdir: str, step: int | None = None) -> dict:
  """{"step", "run", <the trainer's eval metrics>} of the checkpoint at `step` (default: the latest) of the run in
  `workdir`, also written to `workdir/eval/step_<step>.json` (process 0). NoRunRecord for a workdir without a run
  record; EvalError for one without a checkpoint at `step` or an eval set; CheckpointError when the checkpoint
  does not restore."""
  recorded = recorded_config(workdir)
  kind = recorded_trainer(recorded)
  steps = checkpoint_steps(workdir)
  if not steps:
    raise EvalError(f"{workdir}: no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise EvalError(f"{workdir}: no checkpoint at step {step} (checkpoints at steps {', '.join(map(str, steps))})")
  say(f"evaluating step {step} of the {kind} run in {workdir}; rebuilding the run from its {CONFIG_FILE} ...")
  training, evaluate = _build(kind, recorded, workdir)
  template = training.sharded.init_state()  # not init_state(): `init_from`'s params would be read for nothing
  say(f"restoring the params of step {step} ...")
  checkpointer = Checkpointer(workdir, async_save=False, create=False)
  key = TRAINERS.get(kind).lm_key  # PPO: its policy (the critic's start may be gone, its eval reads the policy)
  try:
    if key is None:
      params = checkpointer.restore_params(template.params, step)
    else:
      params = {**template.params, key: checkpointer.restore_params(template.params[key], step, key=key)}
  except Exception as e:  # orbax / tensorstore raise ValueError, KeyError, FileNotFoundError, ...
    cause = (str(e).strip().splitlines() or [""])[0][:300]
    raise CheckpointError(f"restoring the params of step {step} in {checkpointer.directory} failed: "
                          f"{type(e).__name__}: {cause}") from None
  finally:
    checkpointer.close()
  say("evaluating ...")
  metrics = {k: float(v) for k, v in jax.device_get(evaluate(template.replace(params=params))).items()}
  row = {"step": step, "run": kind, **metrics}
  if jax.process_index() == 0:
    directory = os.path.join(workdir, EVAL_DIR)
    os.makedirs(directory, exist_ok=True)
    write_atomically(os.path.join(directory, f"step_{step}.json"), json.dumps(row, indent=2))
  return row


def run_eval(workdir: str, step: int | None = None) -> int:
  """`jaxpt eval`: prints the result as one JSON line on stdout; exit code 0, or 2 with one line on stderr for a
  workdir with nothing to evaluate."""
  try:
    row = evaluate_run(workdir, step)
  except (EvalError, NoRunRecord) as e:
    print(f"jaxpt eval: {e}", file=sys.stderr)
    return 2
  print(json.dumps(row), flush=True)
  return 0
