"""The rollout engine (`jaxpt.rl.engine`: continuous batching over a paged KV cache) against the static sampler
(`make_sampler`, shared-prompt prefill, every row holding its slot until the longest row ends) on issue 29's
realistic point, timed in alternation. Prints one JSON object.

    python -m benchmarks.engine [--prompts 32] [--group 8] [--min-prompt 64] [--max-prompt 256] [--median 100]
                                [--max-new 512] [--slots 64] [--page-size 16] [--rounds 3] [--model issue|small]

The rows: `prompts` random prompts, lengths uniform in [min-prompt, max-prompt], left-padded to max-prompt, each
repeated `group` times (the trainer's layout). Answer lengths are drawn once per row from a long tail (lognormal,
median `median`, sigma 0.9, clipped to 1 .. max-new) and forced as per-row token budgets (`budgets`, which both
systems honour: a row stops there as at an EOS), the same for both; sampled at temperature 1 with per-rollout keys
(`row_keys=True`), so both draw the same tokens up to rounding (`rows_same_tokens`, see `agreement`). Models: `issue` is
`benchmarks/train_step.py`'s (d_model 512, 8 layers, 8 heads / 4 KV, SwiGLU 2048, vocab 8192, tied); `small`
(d_model 256, 4 layers, 4 heads / 2 KV, SwiGLU 1024, vocab 8192, tied) keeps a run short on a shared CPU.

Each call is one compiled function (compile excluded), a fresh key each; a round times both once
(`benchmarks.common.alternating_seconds`, after an untimed round) and `speedup` is the median over rounds of that
round's static seconds / engine seconds. `tokens_per_sec` counts the rollout tokens (the sum of the budgets).
`useful_fraction`: rollout tokens decoded / slot-steps run (engine: its `EngineStats`; static: every row runs for
the longest row's steps). `peak_mib` is XLA's compiled memory analysis (arguments + outputs + temporaries -
aliased); `kv_mib` the KV storage each allocates (engine: its page pool; static: the shared prompt block and every
row's response buffers) and `kv_held_peak_mib` the engine's most pages in use at once.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import platform
import shlex
import statistics
import sys

import jax
import numpy as np

from benchmarks.common import alternating_seconds, median_ratio
from benchmarks.train_step import MODEL
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params
from jaxpt.parallel import compiled_memory
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.rollouts import repeat_prompts
from jaxpt.rl.sampler import SamplingConfig, make_sampler

MODELS = {"issue": MODEL, "small": dict(MODEL, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=1024)}
_MIB = 2 ** 20


def realistic_rows(args, vocab_size: int):
  """(tokens, mask [B, P] left-padded, budgets int32 [B]) of the point (see the module doc)."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(args.min_prompt, args.max_prompt + 1, args.prompts)
  mask = (np.arange(args.max_prompt)[None, :] >= args.max_prompt - lengths[:, None]).astype(np.int32)
  prompts = np.where(mask == 1, rng.integers(1, vocab_size, mask.shape), 0).astype(np.int32)
  tokens, mask, _ = repeat_prompts(prompts, mask, args.group)
  budgets = np.exp(np.log(args.median) + 0.9 * rng.standard_normal(len(tokens)))
  return tokens, mask, np.clip(np.round(budgets), 1, args.max_new).astype(np.int32)


def agreement(engine_out, static_out) -> dict:
  """How far both systems drew the same rollouts: the fraction of rows with identical tokens, and the largest
  log-prob difference before a row's first differing token (a draw at temperature 1 from a random model's nearly
  flat distribution flips when a rounding difference of the two attention sums moves a CDF step past the uniform;
  from there the row's continuation differs)."""
  tokens, other = np.asarray(engine_out.tokens), np.asarray(static_out.tokens)
  differs = tokens != other
  before = np.cumsum(differs, axis=1) == 0  # columns before the row's first differing token
  diff = np.abs(np.asarray(engine_out.logprobs) - np.asarray(static_out.logprobs))
  return {"rows_same_tokens": round(float(np.mean(~differs.any(axis=1))), 3),
          "max_logprob_diff_before_divergence": float(np.max(np.where(before, diff, 0.0)))}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name, default in (("prompts", 32), ("group", 8), ("min-prompt", 64), ("max-prompt", 256), ("median", 100),
                        ("max-new", 512), ("slots", 64), ("page-size", 16), ("rounds", 3)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--model", choices=sorted(MODELS), default="issue")
  args = parser.parse_args(argv)
  cfg = ModelConfig(**MODELS[args.model])
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens, mask, budgets = realistic_rows(args, cfg.vocab_size)
  sampling = SamplingConfig(max_new_tokens=args.max_new)
  engine = Engine(cfg, sampling, args.max_prompt, EngineConfig(num_slots=args.slots, page_size=args.page_size),
                  group_size=args.group)
  static = make_sampler(cfg, sampling, args.max_prompt, group_size=args.group, row_keys=True)
  key = jax.random.PRNGKey(0)
  compiled = {"engine": engine.jitted.lower(params, tokens, mask, key, budgets).compile(),
              "static": static.lower(params, tokens, mask, key, budgets).compile()}
  calls = iter(range(1, 10 ** 6))
  runs = {name: (lambda fn=fn: fn(params, tokens, mask, jax.random.PRNGKey(next(calls)), budgets))
          for name, fn in compiled.items()}
  engine_out, stats = compiled["engine"](params, tokens, mask, key, budgets)
  static_out = compiled["static"](params, tokens, mask, key, budgets)
  times = alternating_seconds(runs, args.rounds)
  rows, rollout_tokens = len(tokens), int(budgets.sum())
  kv_bytes_per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.resolved_head_dim * 4
  static_slots = args.prompts * args.max_prompt + rows * (args.max_new - 1)
  report = {
      "benchmark": "engine", "config": dict(MODELS[args.model], model=args.model, norm_scheme=cfg.norm_scheme,
                                            sampling="temperature 1, no top-k/top-p, per-rollout keys",
                                            host_allocator_reuse=allocator_reuse),
      "point": {"prompts": args.prompts, "group": args.group, "rows": rows, "prompt_len": [args.min_prompt,
                                                                                             args.max_prompt],
                "new_tokens_median": float(np.median(budgets)), "new_tokens_max": int(budgets.max()),
                "new_tokens_mean": round(float(budgets.mean()), 1), "rollout_tokens": rollout_tokens,
                "slots": args.slots, "page_size": args.page_size, "pool_pages": engine.num_pages,
                "rounds": args.rounds},
      **agreement(engine_out, static_out),
      "same_lengths_as_budgets": bool(np.array_equal(engine_out.lengths, budgets)),
      "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
      "machine": platform.machine(), "load": "measured on a CPU shared with other jobs (under load)",
      "command": "python -m benchmarks.engine " + shlex.join(sys.argv[1:] if argv is None else argv)}
  for name in compiled:
    seconds = statistics.median(times[name])
    report[name] = {"call_s": round(seconds, 2), "tokens_per_sec": round(rollout_tokens / seconds, 1),
                    "peak_mib": compiled_memory(compiled[name]).get("peak_mib")}
  report["engine"].update(
      speedup=round(median_ratio(times["static"], times["engine"]), 2), steps=int(stats.steps),
      useful_fraction=round(int(stats.useful) / (int(stats.steps) * args.slots), 3), waits=int(stats.waits),
      kv_mib=round((engine.num_pages + 1) * args.page_size * kv_bytes_per_slot / _MIB, 1),
      kv_held_peak_mib=round(int(stats.peak_pages) * args.page_size * kv_bytes_per_slot / _MIB, 1))
  report["static"].update(useful_fraction=round((rollout_tokens - rows) / (rows * (int(budgets.max()) - 1)), 3),
                          kv_mib=round(static_slots * kv_bytes_per_slot / _MIB, 1))
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
