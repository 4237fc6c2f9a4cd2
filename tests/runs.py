"""Helpers for the trainers' end-to-end tests: stop a CLI run with SIGTERM, read a run's checkpoint back."""

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
