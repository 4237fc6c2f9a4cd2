"""`jaxpt eval --workdir W [--step N]`: evaluates a checkpoint of an existing run, without training.

The run's recorded config (`W/config.json`, `jaxpt.train.record`) says which trainer made it: an `rm` section -> the
reward-model trainer, `vit` -> the ViT trainer, `dit` -> the DiT trainer, `dpo` -> DPO, `grpo` -> GRPO, `task` and
`decode` -> SFT, else pretraining. That trainer's own build function rebuilds the run from the record (data from the
workdir's caches, model, evaluator, compiled step), the checkpoint's params are restored into it
(`Checkpointer.restore_params`) and the trainer's own evaluator runs once (DPO's reference policy is rebuilt from
`init_from`, as on resume):

    pretrain  eval_loss, eval_ppl, eval_accuracy                   (jaxpt.train.lm.make_lm_evaluator)
    sft       those + eval_answer_accuracy (+ eval_sample_accuracy) (jaxpt.train.sft.make_sft_evaluator)
    rm        eval_* (eval_<split>_* for the other splits)          (jaxpt.train.rm.RMEvaluator)
    vit       eval_top1, eval_loss (test), eval_val_* (validation)  (jaxpt.train.vit.make_vit_evaluator)
    dit       eval_loss (test), eval_val_loss (validation)          (jaxpt.train.dit.make_dit_evaluator)
    dpo       the same, of the implicit reward beta (logp - ref)    (jaxpt.train.dpo.DPOTraining.evaluate)
    grpo      eval_accuracy_<set>                                   (jaxpt.train.grpo.GRPOTrainer.evaluate)

so the numbers are those the run's own eval rows in metrics.jsonl hold for that step. The result
{"step", "run", <metrics>} is one JSON line on stdout and `W/eval/step_<N>.json`; nothing is trained, no checkpoint
or run record is written, and no workdir lock is taken (a run that is still training may be evaluated).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Mapping

import jax

from jaxpt.oserrors import write_atomically
from jaxpt.progress import say
from jaxpt.train.checkpoint import CheckpointError, Checkpointer
from jaxpt.train.record import CONFIG_FILE, checkpoint_steps
from jaxpt.train.state import TrainState

EVAL_DIR = "eval"


class EvalError(ValueError):
  """A workdir with nothing to evaluate (no config.json, no such checkpoint, no eval set): one line."""


def run_kind(recorded: Mapping[str, Any]) -> str:
  """Which trainer made the run whose config.json is `recorded`: rm | vit | dit | dpo | grpo | sft | pretrain."""
  for kind in ("rm", "vit", "dit"):
    if kind in recorded:
      return kind
  if "dpo" in recorded:
    return "dpo"
  if "grpo" in recorded:
    return "grpo"
  if "task" in recorded and "decode" in recorded:
    return "sft"
  return "pretrain"


def recorded_config(workdir: str) -> dict:
  """The run config recorded in `workdir/config.json` (EvalError when there is none or it is unreadable)."""
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    with open(path) as f:
      recorded = json.load(f)
  except FileNotFoundError:
    raise EvalError(f"{workdir}: no {CONFIG_FILE} there (not the workdir of a jaxpt run)") from None
  except (OSError, ValueError) as e:
    raise EvalError(f"{path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
  if not isinstance(recorded, dict):
    raise EvalError(f"{path}: not a run config (a JSON object)")
  return recorded


def _build(kind: str, config: dict, workdir: str) -> tuple[Any, Callable[[TrainState], dict] | None, str]:
  """(Training, the trainer's evaluate or None, the field that turned the eval off) of the run, by its trainer."""
  if kind == "rm":
    from jaxpt.train.rm import build_rm

    setup = build_rm(config, workdir)
    return setup.training, setup.evaluate, ""
  if kind == "vit":
    from jaxpt.train.vit import build_vit

    setup = build_vit(config, workdir)
    return setup.training, setup.evaluate, ""
  if kind == "dit":
    from jaxpt.train.dit import build_dit

    setup = build_dit(config, workdir)
    return setup.training, setup.evaluate, ""
  if kind == "dpo":
    from jaxpt.train.dpo import build_dpo

    trainer = build_dpo(config, workdir)
    return trainer.training, trainer.evaluate, ""
  if kind == "grpo":
    from jaxpt.train.grpo import build_grpo

    trainer = build_grpo(config, workdir)
    return trainer.training, trainer.evaluate if trainer.config.data.eval_prompts else None, "data.eval_prompts"
  if kind == "sft":
    from jaxpt.train.sft import build_sft as build
  else:
    from jaxpt.train.pretrain import build_pretraining as build
  setup = build(config, workdir)
  return setup.training, setup.evaluate, "data.eval_batches"


def evaluate_run(workdir: str, step: int | None = None) -> dict:
  """{"step", "run", <the trainer's eval metrics>} of the checkpoint at `step` (default: the latest) of the run in
  `workdir`, also written to `workdir/eval/step_<step>.json` (process 0). EvalError for a workdir without a run
  record, a checkpoint at `step` or an eval set; CheckpointError when the checkpoint does not restore."""
  recorded = recorded_config(workdir)
  kind = run_kind(recorded)
  steps = checkpoint_steps(workdir)
  if not steps:
    raise EvalError(f"{workdir}: no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise EvalError(f"{workdir}: no checkpoint at step {step} (checkpoints at steps {', '.join(map(str, steps))})")
  say(f"evaluating step {step} of the {kind} run in {workdir}; rebuilding the run from its {CONFIG_FILE} ...")
  training, evaluate, eval_field = _build(kind, recorded, workdir)
  if evaluate is None:
    raise EvalError(f"{workdir}: the run has no eval set (config.{eval_field}=0)")
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
  except EvalError as e:
    print(f"jaxpt eval: {e}", file=sys.stderr)
    return 2
  print(json.dumps(row), flush=True)
  return 0
