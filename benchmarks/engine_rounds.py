"""DAPO's refill rounds through the rollout engine: R generation rounds of issue 29's realistic point (each round
its own prompts and answer lengths, `benchmarks/realistic.py`) streamed through one engine (`Engine.rounds`: round
r + 1's rollouts take the slots round r's tail leaves free) against one engine call per round, timed in
alternation; and the stream stopped after round 0 (no refill needed) against one call, what starting round 1 early
costs when it is thrown away. Prints one JSON object.

    python -m benchmarks.engine_rounds [--refill-rounds 2] [--rounds 2] [--model small] [realistic point flags]

`speedup` is the median over timed rounds of (calls' seconds / stream's seconds) for all R rounds, and
`round0_overhead` of (stream stopped after round 0 / one call). Both systems draw the same rollouts (per-rollout
keys; `same_rollouts` checks the tokens of every round); decode steps and useful slot-steps from the engine's stats.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import shlex
import sys

import jax
import numpy as np

from benchmarks.common import alternating_seconds, machine_info, median_ratio
from benchmarks.realistic import MODELS, add_flags, realistic_rows
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.sampler import SamplingConfig


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_flags(parser)
  parser.add_argument("--refill-rounds", type=int, default=2, help="R generation rounds a step (DAPO's max_rounds)")
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds")
  args = parser.parse_args(argv)
  cfg = ModelConfig(**MODELS[args.model])
  params = init_params(cfg, jax.random.PRNGKey(0))
  rows = [realistic_rows(args, cfg.vocab_size, seed) for seed in range(args.refill_rounds)]
  tokens, mask, budgets = ([r[i] for r in rows] for i in range(3))
  engine = Engine(cfg, SamplingConfig(max_new_tokens=args.max_new), args.max_prompt,
                  EngineConfig(num_slots=args.slots, page_size=args.page_size), group_size=args.group)
  R, seeds = args.refill_rounds, iter(range(1, 10 ** 6))

  def keys(seed: int) -> list:  # round 0's key, then fold_in(key, r) as DAPO draws round r
    key = jax.random.PRNGKey(seed)
    return [key] + [jax.random.fold_in(key, r) for r in range(1, R)]

  def per_round(count: int, seed: int) -> list:
    ks = keys(seed)
    return [engine.run(params, tokens[r], mask[r], ks[r], budgets[r]) for r in range(count)]

  def stream(count: int, seed: int) -> list:
    it = engine.rounds(params, tokens, mask, keys(seed), budgets)
    return [next(it) for _ in range(count)]

  separate, streamed = per_round(R, 0), stream(R, 0)  # the warm-up (both compile), compared
  same = all(np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens)) for (a, _), (b, _) in zip(separate, streamed))
  runs = {"calls": lambda: per_round(R, next(seeds)), "stream": lambda: stream(R, next(seeds)),
          "call_round0": lambda: per_round(1, next(seeds)), "stream_round0": lambda: stream(1, next(seeds))}
  load_before = os.getloadavg()
  times = alternating_seconds(runs, args.rounds, warmup=0)
  load_after = os.getloadavg()
  steps_calls = sum(int(stats.steps) for _, stats in separate)
  final = streamed[-1][1]
  report = {
      "benchmark": "engine_rounds", "config": dict(MODELS[args.model], model=args.model,
                                                   sampling="temperature 1, per-rollout keys",
                                                   host_allocator_reuse=allocator_reuse),
      "point": {"refill_rounds": args.refill_rounds, "prompts": args.prompts, "group": args.group,
                "rows_per_round": len(budgets[0]), "slots": args.slots, "page_size": args.page_size,
                "rollout_tokens_per_round": [int(b.sum()) for b in budgets],
                "new_tokens_max": int(max(b.max() for b in budgets)), "timed_rounds": args.rounds},
      "same_rollouts": bool(same),
      "decode_steps": {"calls": steps_calls, "stream": int(final.steps),
                       "stream_after_round0": int(streamed[0][1].steps), "call_round0": int(separate[0][1].steps)},
      "useful_fraction": {"calls": round(sum(int(s.useful) for _, s in separate) / (steps_calls * args.slots), 3),
                          "stream": round(int(final.useful) / (int(final.steps) * args.slots), 3)},
      "seconds": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
      "speedup": round(median_ratio(times["calls"], times["stream"]), 3),
      "round0_overhead": round(median_ratio(times["stream_round0"], times["call_round0"]), 3),
      **machine_info(),
      "load": {"note": "os.getloadavg() (1, 5, 15 min) before and after the timed rounds",
               "before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
      "command": "python -m benchmarks.engine_rounds " + shlex.join(sys.argv[1:] if argv is None else argv)}
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
