"""reuse_freed_host_memory: repeated XLA:CPU executions stop page-faulting their temporaries in afresh."""

import subprocess
import sys

import pytest

PROGRAM = """
import resource, sys
if sys.argv[1] == "reuse":
  from jaxpt.host_allocator import reuse_freed_host_memory
  assert reuse_freed_host_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jax.lax.optimization_barrier(jnp.tanh(x)).sum())  # a 64 MiB temporary, scalar output
x = jnp.ones((4096, 4096), jnp.float32)
for _ in range(3):
  jax.block_until_ready(f(x))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  jax.block_until_ready(f(x))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def minor_faults(mode: str) -> int:
  out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
  return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_freed_temporaries_are_reused_instead_of_faulted_in_again():
  pages_per_buffer = 64 * 2**20 // 4096
  assert minor_faults("default") > pages_per_buffer  # the default allocator faults each temporary in
  assert minor_faults("reuse") < pages_per_buffer // 10
