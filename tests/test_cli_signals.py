"""A Ctrl-C or SIGTERM ends `jaxpt <trainer>` in one line, at any time (issue 33 item 4): while training, the loop
saves a checkpoint at that step (exit 130 for SIGINT, 75 for SIGTERM); before the loop starts, the CLI names the
stage under way (exit 130 / 143). Neither leaves a traceback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.record import checkpoint_steps
import pytest

from jaxpt.cli import Stopped, _signals_stop_the_command
from tests.test_train_pretrain import ROOT, _cli


# Execs its arguments with SIGINT and SIGTERM at their defaults, as a foreground command in a terminal has them: a
# disposition is inherited through exec only when it is SIG_IGN, and a test process may have SIGINT ignored (a
# background job's), which would make the command ignore the Ctrl-C it is sent (`test_an_ignored_ctrl_c_stays_ignored`)
FOREGROUND = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
              "signal.signal(signal.SIGTERM, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])")


def signal_after(command: list[str], signum: int, line_start: str) -> tuple[int, str, str]:
  """Starts `command` (as a foreground command: FOREGROUND), sends it `signum` once a stderr line starts with
  `line_start`; (exit code, stdout, stderr)."""
  proc = subprocess.Popen([sys.executable, "-c", FOREGROUND, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=ROOT)
  watchdog = threading.Timer(240, proc.kill)  # a run that stalls silently ends the wait for its next line
  watchdog.start()
  seen = []
  try:
    for line in proc.stderr:
      seen.append(line)
      if line.startswith(line_start):
        proc.send_signal(signum)
        break
    assert any(line.startswith(line_start) for line in seen), f"no line {line_start!r} within 240 s"
    out, err = proc.communicate(timeout=240)
  finally:
    watchdog.cancel()
    if proc.poll() is None:
      proc.kill()
  return proc.returncode, out, "".join(seen) + err


def test_ctrl_c_while_training_saves_that_step_exits_130_and_a_rerun_resumes(tmp_path):
  """Before: a KeyboardInterrupt traceback, nothing saved since the last checkpoint."""
  workdir = str(tmp_path)
  long_run = {"steps": 100_000, "eval_every": 0, "log_every": 1, "progress": True}  # a plain line per step
  code, out, err = signal_after(_cli(workdir, **long_run), signal.SIGINT, "train: step ")
  assert code == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  found = re.fullmatch(rf"jaxpt pretrain: Ctrl-C \(SIGINT\) at step (\d+); checkpoint saved in {workdir}, rerun to "
                       r"resume\.", out.strip().splitlines()[-1])
  assert found, out
  reached = int(found[1])
  assert reached >= 1 and checkpoint_steps(workdir)[-1] == reached
  assert read_metrics(workdir)[-1]["step"] == reached

  rerun = {**long_run, "steps": reached + 2, "allow_changes": "steps", "progress": False}
  done = subprocess.run(_cli(workdir, **rerun), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"resuming from the checkpoint at step {reached}" in done.stderr
  assert f"jaxpt pretrain: finished step {reached + 2} in {workdir}" in done.stdout


def test_a_signal_before_training_is_one_line_naming_the_stage(tmp_path):
  """SIGTERM or Ctrl-C while the data is prepared or the step compiled. Before: a bare exit 143 for SIGTERM, a
  KeyboardInterrupt traceback for Ctrl-C."""
  for signum, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
    workdir = str(tmp_path / signum.name)
    returncode, out, err = signal_after(_cli(workdir, progress=True), signum, "jaxpt pretrain: preparing data in ")
    assert returncode == code, err[-3000:]
    last = err.strip().splitlines()[-1]
    name = "SIGTERM" if signum == signal.SIGTERM else r"Ctrl-C \(SIGINT\)"
    assert re.fullmatch(rf"jaxpt pretrain: {name} while (preparing data in {workdir}|compiling the train step); "
                        "nothing was trained or saved since the last checkpoint; rerun the same command to continue",
                        last), err[-3000:]
    assert "Traceback" not in err and not checkpoint_steps(workdir), err[-3000:]


def test_an_ignored_ctrl_c_stays_ignored(tmp_path):
  """A background job (`jaxpt pretrain ... &` in a script, nohup) inherits SIGINT ignored, on purpose: a Ctrl-C in
  the parent's terminal must not stop it. Neither the CLI nor the loop installs a handler for it then."""
  workdir = str(tmp_path)
  ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
  long_run = {"steps": 100_000, "eval_every": 0, "log_every": 1, "progress": True}
  proc = subprocess.Popen(_cli(workdir, **long_run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT, preexec_fn=ignore)
  watchdog = threading.Timer(240, proc.kill)
  watchdog.start()
  try:
    steps = 0
    for line in proc.stderr:
      if line.startswith("jaxpt pretrain: preparing data in ") or line.startswith("train: step "):
        proc.send_signal(signal.SIGINT)  # before the loop (the CLI's handlers) and in it (the loop's)
        steps += line.startswith("train: step ")
      if steps == 3:
        proc.send_signal(signal.SIGTERM)
        break
    out, err = proc.communicate(timeout=240)
  finally:
    watchdog.cancel()
  assert proc.returncode == 75, err[-3000:]  # SIGTERM's: the SIGINTs did nothing
  assert re.match(r"jaxpt pretrain: SIGTERM at step \d+; checkpoint saved", out.strip().splitlines()[-1]), out


def test_a_signal_handled_where_exceptions_are_ignored_still_stops_the_command():
  """Python runs a signal's handler at whatever bytecode comes next, which can be inside a gc callback (jax has one)
  or a `__del__`, where a raised `Stopped` is printed as "Exception ignored" and dropped. Before: the command went
  on and trained to the end (a CI failure of the test above, exit 0 instead of 143)."""
  class SignalledWhileDropped:
    def __del__(self):
      signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside __del__

  with pytest.raises(Stopped, match="SIGTERM"), _signals_stop_the_command():
    SignalledWhileDropped()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
      time.sleep(0.01)


def test_a_dropped_signal_not_yet_sent_again_when_the_command_ends_still_stops_it():
  """The command ends within the 10 ms before the timer sends the dropped signal again: the signal still stops
  it (`Stopped` at the end), and nothing is sent after the handlers are restored (SIGTERM's default action would
  kill the process then). In a subprocess, for that reason."""
  script = textwrap.dedent("""
      import signal, time
      from jaxpt.cli import Stopped, _signals_stop_the_command
      class SignalledWhileDropped:
        def __del__(self):
          signal.raise_signal(signal.SIGTERM)
      try:
        with _signals_stop_the_command():
          SignalledWhileDropped()
      except Stopped as e:
        print("stopped", e.name)
      time.sleep(0.5)
      print("alive")
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert (done.returncode, done.stdout.split()) == (0, ["stopped", "SIGTERM", "alive"]), done.stderr[-2000:]
