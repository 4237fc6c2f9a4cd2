"""The rollout engine (`jaxpt.rl.engine`: continuous batching over a paged KV cache) against the static sampler
(`make_sampler`, shared-prompt prefill, every row holding its slot until the longest row ends) on issue 29's
realistic point, timed in alternation. Prints one JSON object.

    python -m benchmarks.engine [--prompts 32] [--group 8] [--min-prompt 64] [--max-prompt 256] [--median 100]
                                [--max-new 512] [--slots 64] [--page-size 16] [--rounds 3] [--model issue|small|tiny]
                                [--whole-tables] [--prefill-batch 8] [--spread 0.9]

The rows, their forced answer lengths, the models (`--model issue|small|tiny`) and the figures (`useful_fraction`,
`peak_mib`, `kv_mib`, `kv_held_peak_mib`) are `benchmarks/realistic.py`'s. The lengths are per-row token budgets
(`budgets`, which both systems honour: a row stops there as at an EOS), the same for both; sampled at temperature 1
with per-rollout keys (`row_keys=True`), so both draw the same tokens up to rounding (`rows_same_tokens`, see
`agreement`).

Each call is one compiled function (compile excluded), a fresh key each; a round times both once
(`benchmarks.common.alternating_seconds`, after the untimed calls whose outputs `agreement` compares) and `speedup`
is the median over rounds of that round's static seconds / engine seconds. `--whole-tables` adds a third system,
`engine_whole_tables`: the engine with every slot gathering its whole page table in each layer and step (one chunk,
one width: the attention before `jaxpt.nn.attention.paged_chunk_attention`), timed in the same rounds.
`tokens_per_sec` counts the rollout tokens (the sum of the budgets).

`prefill`: the distinct prompts' prefills as the engine runs them (one [1, P] call each, `prompt_len` columns)
against `--prefill-batch` prompts a call, timed alone in alternation (3 rounds), and their share of an engine call.
`capacity`: `jaxpt.trainers.plan.rollout_capacity` for a Qwen2.5-1.5B-shaped model (its config.json,
tests/assets/qwen2_5_1_5b_shape) at prompt 512 + 2048 new tokens, G = 8, on a 16 GiB device in bf16, with
`held_new_tokens` the mean response tokens a row holds per decode step when this point's answer lengths are scaled
to 2048 (median --median * 2048 / --max-new, the same tail).
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import shlex
import statistics
import sys

import jax
import numpy as np

from benchmarks.common import alternating_seconds, machine_info, median_ratio
from benchmarks.realistic import MODELS, add_flags, answer_lengths, call_figures, jaxpt_figures, jaxpt_systems
from benchmarks.realistic import point_facts, realistic_rows
from jaxpt.models import hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache, init_params
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.sampler import SamplingConfig, decode_config_of, decode_params, prompt_layout
from jaxpt.trainers import plan


class WholeTables(Engine):
  """The engine with every slot gathering its whole page table (see the module doc)."""

  attention_chunks, width_buckets = 1, 1


def prefill_seconds(cfg, sampling, tokens, mask, group: int, batch: int, rounds: int = 3) -> dict:
  """Seconds to prefill the distinct prompts (rows tokens[::group]) as the engine does (one per call) and `batch`
  per call (the cache and last logits the engine keeps), timed in alternation: the median over rounds."""
  dcfg = decode_config_of(cfg, sampling)
  params = decode_params(init_params(cfg, jax.random.PRNGKey(0)), cfg, dcfg)
  model = TransformerLM(dcfg)
  prompts, prompt_mask = tokens[::group], mask[::group]

  @jax.jit
  def prefill(params, tokens, mask):
    segment_ids, positions, _ = prompt_layout(mask)
    return model.apply({"params": params}, tokens, positions, segment_ids, return_hidden=True,
                       cache=init_cache(dcfg, tokens.shape[0], tokens.shape[1]), cache_index=0, last_logits_only=True)

  def run(size):
    return lambda: [prefill(params, prompts[i:i + size], prompt_mask[i:i + size])
                    for i in range(0, len(prompts), size)]

  times = alternating_seconds({"one": run(1), "batched": run(batch)}, rounds)
  return {name: statistics.median(seconds) for name, seconds in times.items()}


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
  add_flags(parser)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--whole-tables", action="store_true")
  parser.add_argument("--prefill-batch", type=int, default=8)
  args = parser.parse_args(argv)
  cfg = ModelConfig(**MODELS[args.model])
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens, mask, budgets = realistic_rows(args, cfg.vocab_size)
  sampling = SamplingConfig(max_new_tokens=args.max_new)
  engine, compiled = jaxpt_systems(cfg, args, params, tokens, mask, budgets, sampling)
  key = jax.random.PRNGKey(0)
  if args.whole_tables:
    whole = WholeTables(cfg, sampling, args.max_prompt, EngineConfig(num_slots=args.slots, page_size=args.page_size),
                        group_size=args.group)
    compiled["engine_whole_tables"] = whole.jitted.lower(params, tokens, mask, key, budgets).compile()
    whole_out, _ = compiled["engine_whole_tables"](params, tokens, mask, key, budgets)
  calls = iter(range(1, 10 ** 6))
  runs = {name: (lambda fn=fn: fn(params, tokens, mask, jax.random.PRNGKey(next(calls)), budgets))
          for name, fn in compiled.items()}
  engine_out, stats = compiled["engine"](params, tokens, mask, key, budgets)
  static_out = compiled["static"](params, tokens, mask, key, budgets)
  # the warm-up calls finish before the clock starts (dispatch is asynchronous: unblocked, they ran inside the first
  # timed call, which is what made the engine's first timed call 4-5x its others in earlier runs)
  jax.block_until_ready((engine_out, static_out, whole_out if args.whole_tables else None))
  load_before = os.getloadavg()
  times = alternating_seconds(runs, args.rounds, warmup=0)  # the calls above were the warm-up
  load_after = os.getloadavg()
  report = {
      "benchmark": "engine", "config": dict(MODELS[args.model], model=args.model, norm_scheme=cfg.norm_scheme,
                                            sampling="temperature 1, no top-k/top-p, per-rollout keys",
                                            host_allocator_reuse=allocator_reuse),
      "point": point_facts(args, budgets, engine, args.rounds),
      **agreement(engine_out, static_out),
      "same_lengths_as_budgets": bool(np.array_equal(engine_out.lengths, budgets)),
      **machine_info(),
      "load": {"note": "a CPU shared with other jobs: os.getloadavg() (1, 5, 15 min) before and after the timed "
                       "rounds", "before": [round(x, 2) for x in load_before],
               "after": [round(x, 2) for x in load_after]},
      "command": "python -m benchmarks.engine " + shlex.join(sys.argv[1:] if argv is None else argv),
      **jaxpt_figures(cfg, args, engine, compiled, times, stats, budgets)}
  report["engine"]["speedup"] = round(median_ratio(times["static"], times["engine"]), 2)
  if args.whole_tables:
    report["engine_whole_tables"] = dict(
        call_figures(times["engine_whole_tables"], int(budgets.sum()), compiled["engine_whole_tables"]),
        speedup=round(median_ratio(times["static"], times["engine_whole_tables"]), 2),
        same_tokens_as_engine=bool(np.array_equal(whole_out.tokens, engine_out.tokens)))
    report["engine"]["speedup_vs_whole_tables"] = round(median_ratio(times["engine_whole_tables"],
                                                                     times["engine"]), 2)
  prefill = prefill_seconds(cfg, sampling, tokens, mask, args.group, args.prefill_batch)
  report["prefill"] = {"one_per_call_s": round(prefill["one"], 3), "batched_s": round(prefill["batched"], 3),
                       "batch": args.prefill_batch, "speedup": round(prefill["one"] / prefill["batched"], 2),
                       "share_of_engine_call": round(prefill["one"] / report["engine"]["call_s"], 3)}
  held = answer_lengths(np.random.default_rng(0), 100_000, args.median * 2048 / args.max_new, 2048).astype(float)
  qwen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "assets", "qwen2_5_1_5b_shape")
  qwen = ModelConfig(**hf_config.config_fields(hf_config.read_hf_json(qwen)))
  report["capacity"] = dict(
      model="Qwen2.5-1.5B shape", prompt=512, new_tokens=2048, group=8, page_size=16, device_gib=16, dtype="bfloat16",
      held_new_tokens=round(float(np.sum(held * (held + 1) / 2) / np.sum(held)), 1),
      **plan.rollout_capacity(qwen, 512, 2048, 16, group_size=8, page_size=16,
                              held_new_tokens=float(np.sum(held * (held + 1) / 2) / np.sum(held))))
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
