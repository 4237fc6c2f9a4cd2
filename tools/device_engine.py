"""`tools/device_check`'s `engine` section: the rollout engine (continuous batching over a paged KV cache) against
the static sampler at issue 29's realistic point (`benchmarks/realistic.py`: 256 rollouts, prompts 64-256,
long-tailed answers up to 512 tokens, d512), bf16 rollouts, timed in alternation as `benchmarks/engine.py` times
them. A section of its own, so that the sampler section's HF peers, if cut at the deadline, cannot take the engine's
figures with them (as they did in the fourth H200 run).

On a GPU a third system joins the rounds: the engine with `engine.attention = "pallas_gpu"` (JAX's Pallas GPU paged
attention kernel reading the pages in place, against the default gather path): `pallas_gpu` in the report, with
`pallas_gpu_speedup` (median of gather-engine seconds / kernel-engine seconds) and whether its first call's tokens
equal the gather engine's (`pallas_gpu_same_tokens`, the fraction of equal tokens; bf16 rollouts, so not exact);
a kernel that fails to compile is reported (`pallas_gpu_error`) and the rest goes on.

On the H200 the 64-slot engine took 1.40 s against the static sampler's 0.35 s (fifth run): 946 decode steps of
1.5 ms against 512 of 0.7 ms. So, while the budget lasts, the section then looks for where that goes: the
`VARIANTS`, each against the static sampler in rounds of their own (`<name>`, `<name>_speedup`), then a trace of
one engine call (`trace`: the device ops' time against the call's, `engine_trace.json.gz`). The trace comes last
and the report so far is written first: in the fifth run the profiler had not returned from one engine call after
250 s, and the hard stop took the section's figures with it.

Each stage prints its seconds as it ends (`engine: <stage> <s> s`; each system's compile apart: the three took
237-252 s together on the H200), so a call cut short still says where the time went. The first round always runs;
later rounds stop once the budget is spent; `speedup` is the median over timed rounds of static seconds / engine
seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from typing import TYPE_CHECKING

import jax

from benchmarks.common import median_ratio
from benchmarks.engine import WholeTables
from benchmarks.realistic import (FLAGS, MODELS, call_figures, jaxpt_figures, jaxpt_systems, point_facts,
                                  realistic_rows)
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params
from jaxpt.rl.engine import Engine
from jaxpt.rl.sampler import SamplingConfig
from tools.device_traces import perfetto_trace, trace_kernel_times

if TYPE_CHECKING:
  from tools.device_check import Budget, Sizes


# After the rounds, while the budget lasts, engines that each change one thing, timed against the static sampler in
# rounds of their own: (name, class, EngineConfig changes as functions of the point's rollout count, GPU kernel only).
# - whole_tables: every slot gathers its whole page table (no `lax.switch` over table widths in each layer and step:
#   on a GPU each is a predicate read back by the host). H200, fifth run: 0.89 s against the engine's 1.40 s.
# - pallas_all_slots: JAX's Pallas GPU kernel reading the pages in place, with a slot per rollout (no streaming: the
#   static sampler's 512 steps, each reading only the pages held). The gather path with a slot per rollout took
#   3.53 s on the H200 (its gathers grow with the slots); the kernel engine with 64 slots 0.72 s.
VARIANTS = (("whole_tables", WholeTables, {}, False),
            ("pallas_all_slots", Engine, {"attention": lambda rows: "pallas_gpu", "num_slots": lambda rows: rows},
             True))


def point_args(overrides: dict) -> argparse.Namespace:
  """The realistic point's flags (`benchmarks/realistic.py` defaults, model `issue`) with `overrides` (flag names
  with '_' for '-')."""
  args = {name.replace("-", "_"): default for name, default in FLAGS}
  return argparse.Namespace(**{**args, "spread": 0.9, "model": "issue", **overrides})


class Stages:
  """Seconds of each named stage, printed as it ends."""

  def __init__(self):
    self.seconds, self._start = {}, time.perf_counter()

  def done(self, name: str) -> None:
    now = time.perf_counter()
    self.seconds[name] = round(now - self._start, 2)
    self._start = now
    print(f"engine: {name} {self.seconds[name]} s", flush=True)


def realistic_engine(sizes: Sizes, budget: Budget) -> dict:
  """The engine and the static sampler at the point (`sizes.engine_point`), `sizes.rounds` rounds (at least one,
  however long the compiles took); then, while the budget lasts, the VARIANTS and a trace of one engine call."""
  args = point_args(sizes.engine_point)
  report = {"model": dict(MODELS[args.model], name=args.model), "rollout_dtype": "bfloat16",
            "sampling": "temperature 1, no top-k/top-p, per-rollout keys, forced answer lengths"}
  if budget.spent():
    return dict(report, skipped=["all"])
  stages = Stages()
  cfg = ModelConfig(**MODELS[args.model])
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens, mask, budgets = realistic_rows(args, cfg.vocab_size)
  sampling = SamplingConfig(max_new_tokens=args.max_new, rollout_dtype="bfloat16")
  engine, compiled = jaxpt_systems(cfg, args, params, tokens, mask, budgets, sampling,
                                   compiled_one=lambda name: stages.done(f"compile {name}"))

  def compile_engine(name, kind=Engine, **changes):
    variant = kind(cfg, sampling, args.max_prompt, dataclasses.replace(engine.engine, **changes),
                   group_size=args.group)
    compiled[name] = variant.jitted.lower(params, tokens, mask, jax.random.PRNGKey(0), budgets).compile()
    stages.done(f"compile {name}")

  kernel = jax.default_backend() == "gpu"
  if kernel:
    try:  # a kernel that does not lower costs its own figures, not the others'
      compile_engine("pallas_gpu", attention="pallas_gpu")
    except Exception as error:  # noqa: BLE001 -- reported, not raised
      report["pallas_gpu_error"], kernel = f"{type(error).__name__}: {error}"[:2000], False
  calls = iter(range(10 ** 6))

  def call(name, key=None):
    key = jax.random.PRNGKey(next(calls)) if key is None else key
    return jax.block_until_ready(compiled[name](params, tokens, mask, key, budgets))

  first, stats = call("engine", jax.random.PRNGKey(10 ** 6))
  stages.done("first engine call")
  call("static")
  stages.done("first static call")
  times = {"engine": [], "static": []}
  if kernel:
    same = call("pallas_gpu", jax.random.PRNGKey(10 ** 6))[0].tokens == first.tokens
    report["pallas_gpu_same_tokens"] = round(float(same.mean()), 4)
    stages.done("first pallas_gpu call")
    times["pallas_gpu"] = []
  timed_rounds(times, call, sizes.rounds, budget, stages, report)
  report.update(point=point_facts(args, budgets, engine, len(times["engine"])), stages_s=stages.seconds)
  report.update(jaxpt_figures(cfg, args, engine, compiled, times, stats, budgets))
  report["speedup"] = round(median_ratio(times["static"], times["engine"]), 2)
  if kernel:
    report["pallas_gpu"] = call_figures(times["pallas_gpu"], int(budgets.sum()), compiled["pallas_gpu"])
    report["pallas_gpu_speedup"] = round(median_ratio(times["engine"], times["pallas_gpu"]), 2)
  for name, kind, changes, needs_kernel in VARIANTS:
    if budget.spent() or (needs_kernel and not kernel):
      report.setdefault("skipped", []).append(name)
      continue
    compile_engine(name, kind, **{k: v(len(budgets)) for k, v in changes.items()})
    variant_times = {name: [], "static": []}
    call(name)
    stages.done(f"first {name} call")
    timed_rounds(variant_times, call, sizes.rounds, budget, stages, report, label=f"{name} round")
    report[name] = call_figures(variant_times[name], int(budgets.sum()), compiled[name])
    report[f"{name}_speedup"] = round(median_ratio(variant_times["static"], variant_times[name]), 2)
  if sizes.trace_dir and not budget.spent():
    with open(os.path.join(sizes.trace_dir, "engine.json"), "w") as f:  # kept if the trace never returns
      json.dump(dict(report, partial="written before the trace"), f, indent=1)
    report["trace"] = engine_trace(lambda: call("engine"), sizes.trace_dir, statistics.median(times["engine"]))
    stages.done("trace")
  return report


def engine_trace(run, trace_dir: str, call_s: float) -> dict:
  """A Perfetto trace of one engine call (`engine_trace.json.gz`), its 30 longest device ops, and the device ops'
  summed time against the call's median seconds: a small `device_busy_fraction` says the loop waits on the host
  (each `lax.while_loop` / `lax.cond` / `lax.switch` predicate that an XLA:GPU loop reads back), not on the GPU."""
  path = os.path.join(trace_dir, "engine_trace.json.gz")
  perfetto_trace(run, path)
  ops = trace_kernel_times(path)
  busy_ms = sum(op["total_ms"] for op in ops.values())
  return {"file": os.path.basename(path), "device_ops": sum(op["calls"] for op in ops.values()),
          "device_busy_ms": round(busy_ms, 1), "device_busy_fraction": round(busy_ms / (call_s * 1e3), 3),
          "device_ops_top30": dict(list(ops.items())[:30])}


def timed_rounds(times: dict, call, rounds: int, budget: Budget, stages: Stages, report: dict,
                 label: str = "round") -> None:
  """Up to `rounds` rounds, each calling every system in `times` once in turn and appending its seconds; the first
  round always runs, later ones only while the budget lasts (`skipped_<label>s` in `report` counts the rest)."""
  for r in range(rounds):
    if r and budget.spent():
      report[f"skipped_{label.replace(' ', '_')}s"] = rounds - r
      return
    for name in times:
      start = time.perf_counter()
      call(name)
      times[name].append(time.perf_counter() - start)
    stages.done(f"{label} {r + 1}")
