"""`tools/device_check`'s `engine` section: the rollout engine (continuous batching over a paged KV cache) against
the static sampler at issue 29's realistic point (`benchmarks/realistic.py`: 256 rollouts, prompts 64-256,
long-tailed answers up to 512 tokens, d512), bf16 rollouts, timed in alternation as `benchmarks/engine.py` times
them. A section of its own, so that the sampler section's HF peers, if cut at the deadline, cannot take the engine's
figures with them (as they did in the fourth H200 run).

On a GPU a third system joins the rounds: the engine with `engine.attention = "pallas_gpu"` (JAX's Pallas GPU paged
attention kernel reading the pages in place, against the default gather path): `pallas_gpu` in the report, with
`pallas_gpu_speedup` (median of gather-engine seconds / kernel-engine seconds) and whether its first call's tokens
equal the gather engine's (`pallas_gpu_same_tokens`, the fraction of equal tokens; bf16 rollouts, so not exact);
a kernel that fails to compile is reported (`pallas_gpu_error`) and the rest goes on. Then, while the budget lasts,
the engine with one slot per rollout (`all_slots`, `all_slots_speedup` over the static sampler, in rounds of their
own): on the H200 the 64-slot engine's first call took 1.7 s against the static sampler's 0.4 s, and a decode step
of this model costs about the same at batch 64 as at 256 there, so the slot count is the first suspect.

Each stage prints its seconds as it ends (`engine: <stage> <s> s`; each system's compile apart: the three took
237-252 s together on the H200), so a call cut short still says where the time went. The first round always runs;
later rounds stop once the budget is spent; `speedup` is the median over timed rounds of static seconds / engine
seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING

import jax

from benchmarks.common import median_ratio
from benchmarks.realistic import (FLAGS, MODELS, call_figures, jaxpt_figures, jaxpt_systems, point_facts,
                                  realistic_rows)
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params
from jaxpt.rl.engine import Engine
from jaxpt.rl.sampler import SamplingConfig

if TYPE_CHECKING:
  from tools.device_check import Budget, Sizes


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
  however long the compiles took); then, while the budget lasts, the engine with a slot for every rollout."""
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

  def compile_engine(name, **changes):
    variant = Engine(cfg, sampling, args.max_prompt, dataclasses.replace(engine.engine, **changes),
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
  if budget.spent():
    report["skipped"] = ["all_slots"]
    return report
  # One slot per rollout: no streaming, so every row's slot is held to the end, as in the static batch. Where a
  # decode step costs about the same at any batch (an accelerator at this size), fewer slots mean more steps.
  compile_engine("all_slots", num_slots=len(budgets))
  call("all_slots")
  stages.done("first all_slots call")
  slots_times = {"all_slots": [], "static": []}
  timed_rounds(slots_times, call, sizes.rounds, budget, stages, report, label="all_slots round")
  report["all_slots"] = call_figures(slots_times["all_slots"], int(budgets.sum()), compiled["all_slots"])
  report["all_slots_speedup"] = round(median_ratio(slots_times["static"], slots_times["all_slots"]), 2)
  report["stages_s"] = stages.seconds
  return report


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
