"""Per-device memory of a compiled program, from XLA's `memory_analysis()` (sizes in MiB).

For an SPMD program the analysis is of one partition, i.e. per device: `argument` holds this device's shard of
the inputs (train state + batch), `temp` the live temporaries at the peak, and
peak = argument + output + temp - alias (outputs donated into inputs are counted once).
"""

from __future__ import annotations

from typing import Any

from absl import logging

_MIB = 2 ** 20


def compiled_memory(compiled: Any) -> dict[str, float]:
  """{argument_mib, output_mib, temp_mib, alias_mib, peak_mib} of `jax.jit(f).lower(...).compile()` per device."""
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  args, out = stats.argument_size_in_bytes, stats.output_size_in_bytes
  temp, alias = stats.temp_size_in_bytes, stats.alias_size_in_bytes
  mib = lambda n: round(n / _MIB, 3)
  return {"argument_mib": mib(args), "output_mib": mib(out), "temp_mib": mib(temp), "alias_mib": mib(alias),
          "peak_mib": mib(args + out + temp - alias)}


def log_memory(name: str, memory: dict[str, float]) -> None:
  if memory:
    logging.info("%s: compiled peak memory per device %.1f MiB (arguments %.1f, temporaries %.1f)", name,
                 memory["peak_mib"], memory["argument_mib"], memory["temp_mib"])
