"""One writer per workdir: `workdir/.lock` holds the host and pid of the run that owns it.

    with workdir_lock(workdir):      # WorkdirLocked if a live process on this host (or another host) holds it
      ...                            # re-entrant in the same process (the CLI and train_loop both take it)

A lock left by a process that no longer runs on this host is stale: it is taken over, with a warning. A lock from
another host cannot be checked; delete the file if that run is gone. In a multi-process run only process 0 takes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Iterator

import jax
from absl import logging

LOCK_FILE = ".lock"
_HELD: dict[str, int] = {}  # lock path -> nesting depth in this process


class WorkdirLocked(RuntimeError):
  """Another live run writes to this workdir."""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def _acquire(path: str) -> None:
  me = {"host": socket.gethostname(), "pid": os.getpid()}
  while True:
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      try:
        with open(path) as f:
          owner = json.load(f)
      except (OSError, ValueError):  # half-written by a process killed mid-write, or removed meanwhile
        owner = {}
      if owner.get("host") == me["host"] and isinstance(owner.get("pid"), int) and not _alive(owner["pid"]):
        logging.warning("taking over the stale lock %s of pid %d (no longer running)", path, owner["pid"])
        with contextlib.suppress(FileNotFoundError):
          os.remove(path)
        continue
      if not owner:
        raise WorkdirLocked(f"{path}: unreadable lock file; delete it if no run uses {os.path.dirname(path)}") from None
      raise WorkdirLocked(f"{os.path.dirname(path)} is in use by pid {owner.get('pid')} on host "
                          f"{owner.get('host')} ({path}; delete it if that run is gone)") from None
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
  """Holds `workdir/.lock` for the block (process 0 of a multi-process run only); re-entrant."""
  if jax.process_index() != 0:
    yield
    return
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise NotADirectoryError(f"the workdir {workdir} is a file, not a folder")
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.abspath(os.path.join(workdir, LOCK_FILE))
  if not _HELD.get(path):
    _acquire(path)
  _HELD[path] = _HELD.get(path, 0) + 1
  try:
    yield
  finally:
    _HELD[path] -= 1
    if not _HELD[path]:
      del _HELD[path]
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
      if created:  # made here and still empty: a launch refused after taking the lock leaves no folder behind
        with contextlib.suppress(OSError):
          os.rmdir(workdir)
