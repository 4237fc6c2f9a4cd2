"""The rollout engine (`jaxpt.rl.engine`: continuous batching over a paged KV cache) against the static sampler
(`make_sampler`, shared-prompt prefill, every row holding its slot until the longest row ends) on issue 29's
realistic point, timed in alternation. Prints one JSON object.

    python -m benchmarks.engine [--prompts 32] [--group 8] [--min-prompt 64] [--max-prompt 256] [--median 100]
                                [--max-new 512] [--slots 64] [--page-size 16] [--rounds 3] [--model issue|small]
                                [--whole-tables] [--prefill-batch 8] [--spread 0.9]

The rows: `prompts` random prompts, lengths uniform in [min-prompt, max-prompt], left-padded to max-prompt, each
repeated `group` times (the trainer's layout). Answer lengths are drawn once per row from a long tail (lognormal,
median `median`, sigma `spread`, clipped to 1 .. max-new; spread 0: every row `median` tokens) and forced as
per-row token budgets (`budgets`, which both systems honour: a row stops there as at an EOS), the same for both;
sampled at temperature 1 with per-rollout keys (`row_keys=True`), so both draw the same tokens up to rounding
(`rows_same_tokens`, see `agreement`). Models: `issue` is
`benchmarks/train_step.py`'s (d_model 512, 8 layers, 8 heads / 4 KV, SwiGLU 2048, vocab 8192, tied); `small`
(d_model 256, 4 layers, 4 heads / 2 KV, SwiGLU 1024, vocab 8192, tied) keeps a run short on a shared CPU.

Each call is one compiled function (compile excluded), a fresh key each; a round times both once
(`benchmarks.common.alternating_seconds`, after the untimed calls whose outputs `agreement` compares) and `speedup`
is the median over rounds of that round's static seconds / engine seconds. `--whole-tables` adds a third system,
`engine_whole_tables`: the engine with every slot gathering its whole page table in each layer and step (one chunk,
one width: the attention before `jaxpt.nn.attention.paged_chunk_attention`), timed in the same rounds.
`tokens_per_sec` counts the rollout tokens (the sum of the budgets).
`useful_fraction`: rollout tokens decoded / slot-steps run (engine: its `EngineStats`; static: every row runs for
the longest row's steps). `peak_mib` is XLA's compiled memory analysis (arguments + outputs + temporaries -
aliased); `kv_mib` the KV storage each allocates (engine: its page pool; static: the shared prompt block and every
row's response buffers) and `kv_held_peak_mib` the engine's most pages in use at once.

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
import platform
import shlex
import statistics
import sys

import jax
import numpy as np

from benchmarks.common import alternating_seconds, median_ratio
from benchmarks.train_step import MODEL
from jaxpt.models import hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache, init_params
from jaxpt.parallel import compiled_memory
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.rollouts import repeat_prompts
from jaxpt.rl.sampler import SamplingConfig, decode_config_of, decode_params, make_sampler, prompt_layout
from jaxpt.trainers import plan

MODELS = {"issue": MODEL, "small": dict(MODEL, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=1024)}
_MIB = 2 ** 20


def realistic_rows(args, vocab_size: int):
  """(tokens, mask [B, P] left-padded, budgets int32 [B]) of the point (see the module doc)."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(args.min_prompt, args.max_prompt + 1, args.prompts)
  mask = (np.arange(args.max_prompt)[None, :] >= args.max_prompt - lengths[:, None]).astype(np.int32)
  prompts = np.where(mask == 1, rng.integers(1, vocab_size, mask.shape), 0).astype(np.int32)
  tokens, mask, _ = repeat_prompts(prompts, mask, args.group)
  return tokens, mask, answer_lengths(rng, len(tokens), args.median, args.max_new, args.spread)


class WholeTables(Engine):
  """The engine with every slot gathering its whole page table (see the module doc)."""

  attention_chunks, width_buckets = 1, 1


def answer_lengths(rng, rows: int, median: float, max_new: int, spread: float = 0.9):
  """Forced answer lengths int32 [rows]: lognormal (median, sigma spread) clipped to 1 .. max_new."""
  lengths = np.exp(np.log(median) + spread * rng.standard_normal(rows))
  return np.clip(np.round(lengths), 1, max_new).astype(np.int32)


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
  for name, default in (("prompts", 32), ("group", 8), ("min-prompt", 64), ("max-prompt", 256), ("median", 100),
                        ("max-new", 512), ("slots", 64), ("page-size", 16), ("rounds", 3)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--model", choices=sorted(MODELS), default="issue")
  parser.add_argument("--whole-tables", action="store_true")
  parser.add_argument("--prefill-batch", type=int, default=8)
  parser.add_argument("--spread", type=float, default=0.9)
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
  load_before = os.getloadavg()
  times = alternating_seconds(runs, args.rounds, warmup=0)  # the calls above were the warm-up
  load_after = os.getloadavg()
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
                "spread": args.spread, "slots": args.slots, "page_size": args.page_size, "pool_pages": engine.num_pages,
                "rounds": args.rounds},
      **agreement(engine_out, static_out),
      "same_lengths_as_budgets": bool(np.array_equal(engine_out.lengths, budgets)),
      "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
      "machine": platform.machine(),
      "load": {"note": "a CPU shared with other jobs: os.getloadavg() (1, 5, 15 min) before and after the timed "
                       "rounds", "before": [round(x, 2) for x in load_before],
               "after": [round(x, 2) for x in load_after]},
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
  if args.whole_tables:
    report["engine_whole_tables"].update(
        speedup=round(median_ratio(times["static"], times["engine_whole_tables"]), 2),
        same_tokens_as_engine=bool(np.array_equal(whole_out.tokens, engine_out.tokens)))
    report["engine"]["speedup_vs_whole_tables"] = round(median_ratio(times["engine_whole_tables"],
                                                                     times["engine"]), 2)
  report["static"].update(useful_fraction=round((rollout_tokens - rows) / (rows * (int(budgets.max()) - 1)), 3),
                          kv_mib=round(static_slots * kv_bytes_per_slot / _MIB, 1))
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
