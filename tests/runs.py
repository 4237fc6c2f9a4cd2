"""Helpers for the trainers' end-to-end tests: stop a CLI run with SIGTERM, read a run's checkpoint back, train a
micro SFT run and a reward model started from it; and a recording stand-in for an experiment grid's training."""

import json
import os
import signal
import subprocess
import time

from jaxpt.engine.checkpoint import Checkpointer


def sigterm_after_first_row(command, workdir, cwd):
  """Starts `command` (a jaxpt CLI run writing to `workdir`), sends it SIGTERM once metrics.jsonl has a row and
  returns (exit code, stdout, stderr)."""
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 120
  while not (os.path.exists(metrics) and os.path.getsize(metrics)) and proc.poll() is None:
    assert time.time() < deadline, "no metrics row within 120 s"
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  return proc.returncode, out, err


def latest_state(workdir, template):
  """The state of the newest checkpoint in `workdir`, restored into the layout of `template` (a TrainState)."""
  checkpointer = Checkpointer(workdir)
  try:
    return checkpointer.restore_latest(template)
  finally:
    checkpointer.close()


def flat(prefix, section):
  """{"prefix.key": value} of a section's dict, for `update_from_flattened_dict`."""
  return {f"{prefix}.{k}": v for k, v in section.items()}


def sft_and_reward_model(tmp_path_factory, model, task, quiet, rm_loss="bt"):
  """(sft workdir, rm workdir): 3 steps of `sft_tiny` with `model` (a model section's fields), `task` and `quiet`
  (flattened overrides; no eval: the SFT run only starts the RM and the policies), then 2 steps of an `rm_tiny`
  reward model (loss `rm_loss`) whose backbone and tokenizer are the SFT run's (so it reads an RL run's rollouts in
  their own tokens)."""
  import jaxpt
  from experiments.configs import rm_tiny, sft_tiny

  sft = str(tmp_path_factory.mktemp("sft"))
  config = sft_tiny.get_config()
  config.update_from_flattened_dict({**flat("model", model), **task, **quiet, "steps": 3, "checkpoint_every": 3,
                                     "data.seq_len": 48, "data.batch_size": 8, "data.eval_batches": 0,
                                     "decode.eval_problems": 0, "decode.prompt_len": 32,
                                     "decode.max_new_tokens": 16})
  jaxpt.train("sft", config, sft)
  rm = str(tmp_path_factory.mktemp("rm"))
  config = rm_tiny.get_config()
  backbone = {**sft_tiny.get_config().model.to_dict(), **model}  # the SFT run's model: its params start the RM
  config.update_from_flattened_dict({**flat("model", backbone), **quiet, "steps": 2, "checkpoint_every": 2,
                                     "rm.loss": rm_loss, "init_from": sft, "data.seq_len": 48,
                                     "data.batch_size": 8, "data.synthetic_train_pairs": 32,
                                     "data.synthetic_test_pairs": 8})
  jaxpt.train("rm", config, rm)
  return sft, rm


def recording_grid(runner, summarise, trained):
  """A stand-in for `experiments.toolkit.runner.run_grid` that trains nothing: each unfinished run's done.json is
  the run + `summarise(run)` (+ an empty environment), and its name is appended to `trained`; `after_each` as the
  real one's."""
  def run_grid(runs, train_one, workdir, jobs, describe=None, after_each=None):
    for run in runs:
      if runner.load_done(workdir, run) is None:
        trained.append(run["name"])
        os.makedirs(runner.run_dir(workdir, run))
        with open(os.path.join(runner.run_dir(workdir, run), "done.json"), "w") as f:
          json.dump(dict(run, **summarise(run), environment={}), f)
        if after_each is not None:
          after_each(runner.load_done(workdir, run))
    return [runner.load_done(workdir, r) for r in runs]

  return run_grid
