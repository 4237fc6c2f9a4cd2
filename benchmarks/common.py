"""Timing helpers shared by the benchmarks: every figure is a median over repeated, synchronised runs; `Peer`, a
persistent reference process timed in alternation with jaxpt's calls."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from typing import Callable

import jax
import jax.extend
import jax.numpy as jnp


def machine_info() -> dict:
  """What every benchmark JSON records of where it ran: the device, jax's version, the CPU count and machine, and
  the CPU's model and vector extensions (the project's machine changes between sessions: two runs compare only on
  the same CPU)."""
  return {"device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
          "machine": platform.machine(), **cpu_model()}


CPU_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> dict:
  """{"cpu_model": the first processor's model name, "cpu_id": its family/model/stepping (a virtual machine's model
  name can be just "Intel(R) Xeon(R) Processor"), "cpu_extensions": which of CPU_EXTENSIONS it lists} from Linux's
  cpuinfo; {} where there is none (another OS)."""
  try:
    with open(cpuinfo) as f:
      text = f.read()
  except OSError:
    return {}
  fields = {}
  for line in text.splitlines():
    if not line.strip():
      break  # the first processor's block only
    key, _, value = line.partition(":")
    fields[key.strip()] = value.strip()
  flags = set(fields.get("flags", "").split())
  return {"cpu_model": fields.get("model name", ""),
          "cpu_id": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
          "cpu_extensions": [x for x in CPU_EXTENSIONS if x in flags]}


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (its outputs are blocked on), after `warmup` untimed calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def alternating_seconds(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                        peers: dict[str, Callable[[int], float]] | None = None) -> dict[str, list[float]]:
  """Wall times of each `runs[name]()` (outputs blocked on), timed round-robin: every round calls each once, so
  a drifting machine load reaches all of them alike. `warmup` untimed rounds first. `peers[name](round)` (round
  1, 2, ...) are calls that time themselves and return their seconds, e.g. a persistent process's
  `Peer.seconds`: every timed round calls each once after `runs` (they warm up on their own,
  so not in the warm-up rounds). `times[name][r]` all come from round r."""
  for _ in range(warmup):
    for fn in runs.values():
      jax.block_until_ready(fn())
  peers = peers or {}
  times = {name: [] for name in [*runs, *peers]}
  for r in range(repeats):
    for name, fn in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
    for name, seconds in peers.items():
      times[name].append(seconds(r + 1))
  return times


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
  """The median over rounds of numerators[r] / denominators[r] (each ratio within one round, so a load swing
  between rounds cancels out of it)."""
  assert len(numerators) == len(denominators), (len(numerators), len(denominators))
  return statistics.median([n / d for n, d in zip(numerators, denominators)])


def matmul_gflops(m: int, k: int, n: int, repeats: int = 5, dtype=jnp.float32) -> float:
  """Measured GFLOP/s of a jitted [m, k] x [k, n] matmul (2 m k n FLOPs) on the default device."""
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (k, n), dtype)
  matmul = jax.jit(jnp.matmul)
  seconds = median_seconds(lambda: matmul(a, b), repeats, warmup=2)
  return 2.0 * m * k * n / seconds / 1e9


def traced_dots(fn: Callable, *args) -> list[tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct, dict]]:
  """Every `dot_general` that `fn(*args)` runs, read from its jaxpr with the jaxprs nested in it (jit, remat,
  custom derivatives; a scan's body once per iteration, a cond's every branch, a while loop's body once):
  (lhs, rhs, params) each. Of a function taking gradients, the backward pass's dots too."""
  dots = []

  def visit(jaxpr, times: int) -> None:
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        lhs, rhs = (jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars)
        dots.extend([(lhs, rhs, dict(eqn.params))] * times)
      repeat = times * eqn.params.get("length", 1) if eqn.primitive.name == "scan" else times
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            visit(sub.jaxpr, repeat)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            visit(sub, repeat)

  visit(jax.make_jaxpr(fn)(*args).jaxpr, 1)
  return dots


def dots_json(dots: list[tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct, dict]]) -> list:
  """`traced_dots` as JSON for a peer process: [lhs shape, rhs shape, [[lhs contracting, rhs contracting], [lhs
  batch, rhs batch]], [lhs dtype, rhs dtype]] per dot (`train_peers.py hf_dot_pass`)."""
  return [[list(lhs.shape), list(rhs.shape), [[list(axes) for axes in pair] for pair in params["dimension_numbers"]],
           [jnp.dtype(lhs.dtype).name, jnp.dtype(rhs.dtype).name]] for lhs, rhs, params in dots]


def dot_flops(lhs: jax.ShapeDtypeStruct, rhs: jax.ShapeDtypeStruct, params: dict) -> int:
  """2 x (output elements) x (contracted length) of one `dot_general`."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = params["dimension_numbers"]
  contracted = math.prod(lhs.shape[d] for d in lhs_contract)
  batch = math.prod(lhs.shape[d] for d in lhs_batch)
  free = lambda x, used: math.prod(n for d, n in enumerate(x.shape) if d not in used)  # noqa: E731
  return 2 * batch * contracted * free(lhs, (*lhs_contract, *lhs_batch)) * free(rhs, (*rhs_contract, *rhs_batch))


def dot_pass(dots: list[tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct, dict]]) -> tuple[float, Callable]:
  """(GFLOP, run) of `dots` (`traced_dots`) alone: `run()` computes each of them once, one jitted program with
  nothing else in it, on random operands (one array per shape and dtype, passed to each dot as its own argument,
  so XLA merges no two dots). A step's time over its dot pass's is what the step adds to its matmuls."""
  pool = {}
  for lhs, rhs, _ in dots:
    for x in (lhs, rhs):
      if (x.shape, x.dtype) not in pool:
        key = jax.random.PRNGKey(len(pool))
        pool[x.shape, x.dtype] = jax.random.normal(key, x.shape, jnp.float32).astype(x.dtype)
  operands = [(pool[lhs.shape, lhs.dtype], pool[rhs.shape, rhs.dtype]) for lhs, rhs, _ in dots]

  @jax.jit
  def all_dots(operands):
    return [jax.lax.dot_general(a, b, **params) for (a, b), (_, _, params) in zip(operands, dots)]

  return sum(dot_flops(*dot) for dot in dots) / 1e9, lambda: all_dots(operands)


def compiled_memory(compiled) -> dict:
  """XLA's compiled memory analysis in MiB: arguments, outputs, temporaries and their peak sum."""
  analysis = compiled.memory_analysis()
  mib = lambda n: round(n / 2 ** 20, 2)
  args, out = analysis.argument_size_in_bytes, analysis.output_size_in_bytes
  temp, alias = analysis.temp_size_in_bytes, analysis.alias_size_in_bytes
  return {"argument_mib": mib(args), "output_mib": mib(out), "temp_mib": mib(temp),
          "peak_mib": mib(args + out + temp - alias)}


def ratios_vs_pre(schemes: dict) -> dict:
  """{scheme: {step_time, peak_memory}}: each scheme's median step time and compiled peak memory over Pre-Norm's
  (`schemes[s]` holds `step_ms` and `memory.peak_mib`; empty without a `pre` entry)."""
  if "pre" not in schemes:
    return {}
  pre = schemes["pre"]
  return {s: {"step_time": round(r["step_ms"] / pre["step_ms"], 3),
              "peak_memory": round(r["memory"]["peak_mib"] / pre["memory"]["peak_mib"], 3)}
          for s, r in schemes.items() if s != "pre"}


def compiled_step(step, state, batch, compiler_options: dict | None = None) -> tuple[dict, Callable[[], jax.Array]]:
  """(compiled memory, run) of a jitted train step (compiled with XLA's `compiler_options`, if any): `run()` does
  one step on `batch`, the state carried between calls, and returns its loss."""
  compiled = step.lower(state, batch).compile(compiler_options=compiler_options)
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    return metrics["loss"]

  return compiled_memory(compiled), run


class Peer:
  """A persistent peer process (`argv`, e.g. `sampler_peers.py` or `train_peers.py`, speaking the protocol of
  `sampler_peers.serve`): `wait_ready()` waits for its `ready <params> <setting>` line; `seconds(seed)` runs one
  call there and returns its time. `stderr`: where the process's stderr goes (a file to keep it, None: ours)."""

  def __init__(self, name: str, argv: list[str], stderr=subprocess.DEVNULL):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", OMP_WAIT_POLICY="PASSIVE")
    self.name = name
    self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                 env=env)
    self.params, self.setting = None, ""

  def wait_ready(self) -> None:
    words = self._line("ready").split()
    self.params, self.setting = int(words[1]), " ".join(words[2:])

  def _line(self, word: str) -> str:
    for line in self.proc.stdout:
      if line.startswith(word + " "):
        return line
    raise RuntimeError(f"peer {self.name} ended (exit {self.proc.wait()}) before printing {word!r}")

  def seconds(self, seed: int) -> float:
    self.proc.stdin.write(f"run {seed}\n")
    self.proc.stdin.flush()
    return float(self._line("seconds").split()[1])

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=60)


def ready_peers(argvs: dict[str, list[str]], **kwargs) -> list[Peer]:
  """Starts the peer `name` on `argvs[name]` (`Peer(name, argv, **kwargs)`) and waits for its ready line, one peer
  after the other and before the caller builds anything of jaxpt's: each warms up (and HF picks its torch threads)
  while the others only wait on their stdin. A peer that fails to get ready closes the ones already started."""
  peers = []
  try:
    for name, argv in argvs.items():
      peers.append(Peer(name, argv, **kwargs))
      peers[-1].wait_ready()
  except BaseException:
    for peer in peers:
      peer.close()
    raise
  return peers
