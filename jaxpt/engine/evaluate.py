"""`jaxpt eval --workdir W [--step N]`: evaluates a checkpoint of an existing run, without training.

The run's recorded trainer (`jaxpt.engine.trainers.recorded_trainer` of `W/config.json`) names its entry in
`TRAINERS`, whose build function rebuilds the run from the record (data from the workdir's caches, model, evaluator,
compiled step); the checkpoint's params are restored into it (`Checkpointer.restore_params`) and the built run's own
`evaluate` runs once (a reference policy, DPO's or KTO's, is rebuilt from `init_from`, as on resume; each trainer's
module docstring says what its eval reports),
so the numbers are those the run's own eval rows in metrics.jsonl hold for that step. The result
{"step", "run", <metrics>} is one JSON line on stdout and `W/eval/step_<N>.json`; nothing is trained, no checkpoint
or run record is written, and no workdir lock is taken (a run that is still training may be evaluated).
"""

from __future__ import annotations

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
from jaxpt.engine.trainers import TRAINERS, recorded_trainer

EVAL_DIR = "eval"


class EvalError(ValueError):
  """A workdir with nothing to evaluate (no such checkpoint, no eval set, an unknown trainer): one line."""


def _field(config: Any, dotted: str) -> Any:
  """The value of field `dotted` ('data.eval_batches') of run config `config`."""
  for name in dotted.split("."):
    config = getattr(config, name)
  return config


def _build(name: str, recorded: dict, workdir: str) -> tuple[Any, Callable[[TrainState], dict]]:
  """(Training, the trainer's evaluate) of the run recorded as `recorded`, rebuilt by its trainer `name`."""
  if name not in TRAINERS:
    raise EvalError(f"{workdir}: a run of trainer {name!r}, which this jaxpt does not have (known: "
                    f"{', '.join(TRAINERS)})")
  trainer = TRAINERS.get(name)
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
  try:
    params = checkpointer.restore_params(template.params, step)
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
