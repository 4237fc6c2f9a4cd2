"""Make glibc malloc keep and reuse freed memory, so XLA:CPU's per-step buffers stop page-faulting.

XLA:CPU allocates every step's temporaries afresh (1.8 GB for the d_model-512 benchmark step). By default glibc
serves such blocks with mmap (directly, or from per-thread arenas) and returns them to the kernel on free, so
every step faults the same memory in again: measured 460k minor page faults and ~15% of the step's CPU time
(`benchmarks/train_step.py`). With mmap disabled, one arena and no trimming, freed blocks are reused from the heap
and a step takes 0 faults. The price: memory freed by the process is kept for reuse rather than returned.

Call `reuse_freed_host_memory()` first thing in a process (the `jaxpt` CLI and the benchmarks do); it is a no-op
where glibc's `mallopt` is unavailable or `JAXPT_KEEP_MALLOC=1` is set.

The heap then only grows, and where programs of different buffer sizes alternate (PPO: sampler, reference, critic,
policy update) its free chunks fragment: the d512 PPO benchmark's resident memory grew to 13.9 GB and was killed,
where with `JAXPT_KEEP_MALLOC=1` it peaked at 9.7 GB. So the settings come with a pressure valve: a daemon thread
reads /proc/meminfo every `POLL_S` and, while the machine's available memory is below `TRIM_BELOW` of its total
(`JAXPT_TRIM_BELOW` overrides), returns the heap's free pages to the kernel (`malloc_trim(0)`; live memory is
untouched, the next step faults those pages in again). Without pressure it costs one small file read a poll.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
TRIM_BELOW = 0.15  # the valve trims while MemAvailable < TRIM_BELOW x MemTotal
POLL_S = 0.5


def reuse_freed_host_memory() -> bool:
  """Returns True if the allocator settings were applied."""
  if os.environ.get("JAXPT_KEEP_MALLOC") == "1":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  # A trim threshold of -1 becomes SIZE_MAX inside glibc: never trim (2**31 - 1 would trim a 2 GiB+ heap top).
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  applied = all(mallopt(option, value) == 1 for option, value in settings)
  if applied:
    below = float(os.environ.get("JAXPT_TRIM_BELOW", TRIM_BELOW))
    threading.Thread(target=_valve, args=(libc, below), name="jaxpt-host-trim", daemon=True).start()
  return applied


def available_fraction(meminfo: str) -> float | None:
  """MemAvailable / MemTotal from the text of /proc/meminfo (None if either line is missing)."""
  fields = dict(line.split(":", 1) for line in meminfo.splitlines() if ":" in line)
  try:
    return int(fields["MemAvailable"].split()[0]) / int(fields["MemTotal"].split()[0])
  except (KeyError, ValueError, IndexError, ZeroDivisionError):
    return None


def release_free_memory(libc=None) -> bool:
  """Returns the heap's free pages to the kernel (glibc `malloc_trim(0)`); True if some were released."""
  libc = libc or ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  return bool(libc.malloc_trim(0))


def _valve(libc, below: float) -> None:
  """Polls the machine's available memory; trims the heap while it is short (module docstring)."""
  while True:
    time.sleep(POLL_S)
    try:
      with open("/proc/meminfo") as f:
        fraction = available_fraction(f.read())
    except OSError:
      return
    if fraction is not None and fraction < below:
      release_free_memory(libc)
