"""Multi-process start-up: `jax.distributed.initialize` from flags or the environment, before any jax work.

The same command runs on every host. mode:
- `off`:  single process.
- `on`:   always initialize; arguments not given are auto-detected (TPU VM pod slices, SLURM, Open MPI, k8s), so
          on a TPU pod `jax.distributed.initialize()` runs with no arguments.
- `auto`: initialize when a coordinator address is given (argument or JAX_COORDINATOR_ADDRESS) or when the
          environment names several TPU workers (TPU_WORKER_HOSTNAMES); otherwise stay single-process.
"""

from __future__ import annotations

import os

import jax
from absl import logging

MODES = ("auto", "on", "off")


def _tpu_pod_env() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) > 1


def should_initialize(mode: str, coordinator_address: str | None) -> bool:
  if mode not in MODES:
    raise ValueError(f"--distributed={mode!r}: must be one of {', '.join(MODES)}")
  if mode != "auto":
    return mode == "on"
  return bool(coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")) or _tpu_pod_env()


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Calls `jax.distributed.initialize` if `mode` says so (arguments left None are auto-detected by jax).

  Returns True if this run is multi-process. Must run before anything touches a jax backend.
  """
  if not should_initialize(mode, coordinator_address):
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address or None, num_processes=num_processes,
                             process_id=process_id)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return True
