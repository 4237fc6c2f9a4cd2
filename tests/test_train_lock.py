"""One writer per workdir: a live owner's lock refuses a second run; a dead owner's lock is taken over."""

import json
import os
import socket
import subprocess
import sys

import pytest

from jaxpt.engine.lock import LOCK_FILE, WorkdirLocked, workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_lock(workdir, pid, host=None):
  with open(os.path.join(workdir, LOCK_FILE), "w") as f:
    json.dump({"host": host or socket.gethostname(), "pid": pid}, f)


@pytest.fixture
def live_pid():
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  yield proc.pid
  proc.kill()
  proc.wait()


def test_lock_is_reentrant_and_released(tmp_path):
  path = tmp_path / LOCK_FILE
  with workdir_lock(str(tmp_path)):
    assert json.loads(path.read_text())["pid"] == os.getpid()
    with workdir_lock(str(tmp_path)):  # the CLI and train_loop both take it
      assert path.exists()
    assert path.exists()
  assert not path.exists()


def test_a_live_owner_refuses_and_a_dead_owner_is_taken_over(tmp_path, live_pid):
  _write_lock(str(tmp_path), live_pid)
  with pytest.raises(WorkdirLocked, match=rf"in use by pid {live_pid} on host"):
    with workdir_lock(str(tmp_path)):
      pass
  assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid  # untouched
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  _write_lock(str(tmp_path), int(dead.stdout))
  with workdir_lock(str(tmp_path)):
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
  _write_lock(str(tmp_path), 1, host="some-other-host")  # another host's run cannot be checked: refused
  with pytest.raises(WorkdirLocked, match="some-other-host"):
    with workdir_lock(str(tmp_path)):
      pass


def test_cli_into_a_locked_workdir_exits_4_before_any_work(tmp_path, live_pid):
  _write_lock(str(tmp_path), live_pid)
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "pretrain", "--config",
                           os.path.join(ROOT, "experiments", "configs", "tiny.py"), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert result.returncode == 4, result.stderr[-3000:]
  assert f"in use by pid {live_pid}" in result.stderr and "Traceback" not in result.stderr
  assert sorted(os.listdir(tmp_path)) == [LOCK_FILE]  # no data, tokenizer or metrics written
