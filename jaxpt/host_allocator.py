"""Make glibc malloc keep and reuse freed memory, so XLA:CPU's per-step buffers stop page-faulting.

XLA:CPU allocates every step's temporaries afresh (1.8 GB for the d_model-512 benchmark step). By default glibc
serves such blocks with mmap (directly, or from per-thread arenas) and returns them to the kernel on free, so
every step faults the same memory in again: measured 460k minor page faults and ~15% of the step's CPU time
(`benchmarks/train_step.py`). With mmap disabled, one arena and no trimming, freed blocks are reused from the heap
and a step takes 0 faults. The price: memory freed by the process is kept for reuse rather than returned.

Call `reuse_freed_host_memory()` first thing in a process (the `jaxpt` CLI and the benchmarks do); it is a no-op
where glibc's `mallopt` is unavailable or `JAXPT_KEEP_MALLOC=1` is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


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
  return all(mallopt(option, value) == 1 for option, value in settings)
