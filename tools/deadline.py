"""A time limit for a command that must end inside its slot (the device check: one call of the device tool).

    with Deadline(seconds, grace_s, on_hard_stop):
      ...  # DeadlineReached is raised here at `seconds`

At `seconds` SIGALRM raises `DeadlineReached` in the main thread as soon as Python code runs again: a call into
XLA (a compile of minutes) returns first. It is a BaseException, so a section's `except Exception` lets it through.
If the main thread is still inside such a call `grace_s` later, a timer thread calls `on_hard_stop()` (write what
is known), kills this process's child processes (the torch peers, which hold GPU memory) and exits with status 2
(`os._exit`: nothing else runs). Main thread only (signals).
"""

from __future__ import annotations

import glob
import os
import signal
import threading
from typing import Callable

HARD_STOP_STATUS = 2


class DeadlineReached(BaseException):
  """The command's deadline has passed: the running part stops."""


def child_pids() -> list[int]:
  """This process's child processes (Linux /proc; [] elsewhere)."""
  pids = []
  for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
    with open(path) as f:
      pids += [int(p) for p in f.read().split()]
  return pids


def kill_children() -> None:
  for pid in child_pids():
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


class Deadline:
  """Raises DeadlineReached at `seconds`; stops the process `grace_s` later if the main thread has not got there
  (`kill` and `exit` are the hard stop's: replaced only by tests)."""

  def __init__(self, seconds: float, grace_s: float, on_hard_stop: Callable[[], None],
               kill: Callable[[], None] = kill_children, exit: Callable[[int], None] = os._exit):
    self.seconds, self.grace_s = seconds, grace_s
    self.on_hard_stop, self.kill, self.exit = on_hard_stop, kill, exit
    self.timer = threading.Timer(seconds + grace_s, self.hard_stop)
    self.timer.daemon = True

  def hard_stop(self) -> None:
    try:
      self.on_hard_stop()
    finally:
      self.kill()
      self.exit(HARD_STOP_STATUS)

  @staticmethod
  def _raise(signum, frame):
    raise DeadlineReached

  def __enter__(self) -> "Deadline":
    self.previous = signal.signal(signal.SIGALRM, self._raise)
    signal.setitimer(signal.ITIMER_REAL, self.seconds)
    self.timer.start()
    return self

  def __exit__(self, *exc) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    self.timer.cancel()
    signal.signal(signal.SIGALRM, self.previous)
