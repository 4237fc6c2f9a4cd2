"""The XLA flags the suite compiles under, in one place: the conftest sets them for every test process, the
multi-device suites (tests/multidevice) and the multi-process run add their simulated devices to them.

XLA:CPU's cheaper code generation for the suite's tiny programs, whose compile time, not run time, dominates them
(the same HLO): no backend optimisation, no expensive LLVM passes, and the elemental IR emitters in place of the
MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`), which halved the compile time of a one-op program
(41 -> 21 ms) and of tests/test_models_transformer.py's 1432 compiles (84 -> 41 s; the file 140 -> 97 s), and took
the suite (README's command, two experiments niced beside it) from 36.4 to 26.5 min wall, 59.7 to 43.1 CPU-min; one
machine, jax 0.10.2. Imports nothing, so a process sets XLA_FLAGS from it before jax starts.
"""

# as compile options of one `Compiled` (`.compile(compiler_options=...)`)
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                    "xla_cpu_use_fusion_emitters": False}
FAST_COMPILE = " ".join(f"--{name}={str(value).lower()}" for name, value in COMPILER_OPTIONS.items())


def suite_xla_flags(inherited: str = "", host_devices: int = 0) -> str:
  """`inherited` XLA_FLAGS with FAST_COMPILE (once: a process started by the suite inherits it) and, when
  `host_devices` > 0, that many simulated CPU devices."""
  flags = inherited if FAST_COMPILE in inherited else f"{inherited} {FAST_COMPILE}"
  devices = f" --xla_force_host_platform_device_count={host_devices}" if host_devices else ""
  return (flags + devices).strip()
