"""Make glibc malloc keep and reuse freed memory, so XLA:CPU's per-step buffers stop page-faulting.

XLA:CPU allocates every step's temporaries afresh (1.8 GB for the d_model-512 benchmark step). By default glibc
serves such blocks with mmap (directly, or from per-thread arenas) and returns them to the kernel on free, so
every step faults the same memory in again: measured 460k minor page faults and ~15% of the step's CPU time
(`benchmarks/train_step.py`). With mmap disabled, one arena and no trimming, freed blocks are reused from the heap
and a step takes 0 faults. The price: memory freed by the process is kept for reuse rather than returned.

Call `reuse_freed_host_memory()` first thing in a process (the `jaxpt` CLI and the benchmarks do); it is a no-op
where glibc's `mallopt` is unavailable or `JAXPT_KEEP_MALLOC=1` is set.

The heap then only grows, and where programs of different buffer sizes alternate (PPO: sampler, reference, critic,
policy update) its free chunks can fragment: the d512 PPO benchmark's resident memory grew to 13.9 GB over two
rounds and was killed, where with `JAXPT_KEEP_MALLOC=1` one round peaked at 9714 MiB, its resident memory falling
back to ~4 GB between phases. So the settings come with a pressure valve: a daemon thread reads /proc/meminfo (and
the cgroup v2 limit, where one is set) every `POLL_S` and, while the available memory is below `TRIM_BELOW` of the
total (`JAXPT_TRIM_BELOW` overrides), returns the heap's free pages to the kernel (`malloc_trim(0)`; live memory
is untouched, the next step faults those pages in again). Without pressure it costs one small file read a poll.
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
TRIM_BELOW = 0.15  # the valve trims while less than this fraction of the memory is available
POLL_S = 0.5
IDLE_AFTER_NOTHING_S = 30.0  # after a trim that released nothing: the memory is live, trimming again cannot help
CGROUP = "/sys/fs/cgroup"  # cgroup v2: memory.max / memory.current, the limit a container's OOM killer enforces
_valve_started = threading.Event()


def reuse_freed_host_memory() -> bool:
  """Returns True if the allocator settings were applied (the valve then runs, once per process)."""
  if os.environ.get("JAXPT_KEEP_MALLOC") == "1":
    return False
  below = trim_threshold(os.environ.get("JAXPT_TRIM_BELOW"))
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  # A trim threshold of -1 becomes SIZE_MAX inside glibc: never trim (2**31 - 1 would trim a 2 GiB+ heap top).
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  applied = all(mallopt(option, value) == 1 for option, value in settings)
  if applied and not _valve_started.is_set():
    _valve_started.set()
    threading.Thread(target=_valve, args=(libc, below), name="jaxpt-host-trim", daemon=True).start()
  return applied


def trim_threshold(value: str | None) -> float:
  """JAXPT_TRIM_BELOW's value (unset: TRIM_BELOW); a one-line SystemExit naming it if it is not a number >= 0."""
  if value is None:
    return TRIM_BELOW
  try:
    below = float(value)
  except ValueError:
    below = -1.0
  if not below >= 0:
    raise SystemExit(f"JAXPT_TRIM_BELOW={value!r}: must be a number >= 0 (the fraction of the memory left available "
                     f"below which freed heap memory is returned to the kernel; default {TRIM_BELOW})")
  return below


def available_fraction(meminfo: str) -> float | None:
  """MemAvailable / MemTotal from the text of /proc/meminfo (None if either line is missing)."""
  fields = dict(line.split(":", 1) for line in meminfo.splitlines() if ":" in line)
  try:
    return int(fields["MemAvailable"].split()[0]) / int(fields["MemTotal"].split()[0])
  except (KeyError, ValueError, IndexError, ZeroDivisionError):
    return None


def cgroup_available_fraction(limit: str, current: str) -> float | None:
  """(memory.max - memory.current) / memory.max of a cgroup v2 (None without a limit: 'max')."""
  try:
    return max(0.0, 1.0 - int(current) / int(limit))
  except (ValueError, ZeroDivisionError):
    return None


def _read(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


def machine_available_fraction() -> float | None:
  """The smaller of the machine's and this process's cgroup's available fractions (None if neither is known)."""
  meminfo, limit, current = (_read(p) for p in ("/proc/meminfo", f"{CGROUP}/memory.max", f"{CGROUP}/memory.current"))
  fractions = [available_fraction(meminfo) if meminfo else None,
               cgroup_available_fraction(limit, current) if limit and current else None]
  known = [f for f in fractions if f is not None]
  return min(known) if known else None


def release_free_memory(libc=None) -> bool:
  """Returns the heap's free pages to the kernel (glibc `malloc_trim(0)`); True if some were released."""
  libc = libc or ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  return bool(libc.malloc_trim(0))


def _valve(libc, below: float) -> None:
  """Polls the available memory; trims the heap while it is short (module docstring), idling a while after a trim
  that released nothing (the memory is live: each trim walks the heap under the allocator's one arena lock)."""
  while True:
    time.sleep(POLL_S)
    fraction = machine_available_fraction()
    if fraction is not None and fraction < below and not release_free_memory(libc):
      time.sleep(IDLE_AFTER_NOTHING_S)
