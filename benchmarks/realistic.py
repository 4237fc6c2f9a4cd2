"""Issue 29's realistic rollout point, shared by `benchmarks/engine.py` and `benchmarks/sampler.py --points
realistic`: its flags, its rows and forced answer lengths, and jaxpt's two systems on it (the rollout engine and the
static sampler, both given the lengths as per-row token budgets) with their figures.

The rows: `prompts` random prompts (tokens 1 .. vocab - 1, so id 0 can be the peers' EOS and pad), lengths uniform
in [min-prompt, max-prompt], left-padded with 0 to max-prompt, each repeated `group` times (the trainer's layout).
Answer lengths are drawn once per row from a long tail (lognormal, median `median`, sigma `spread`, clipped to
1 .. max-new; spread 0: every row `median` tokens); a length counts the answer's last token (its EOS).

`useful_fraction`: rollout tokens decoded / slot-steps run, prefill's first token excluded on both sides (engine:
its `EngineStats`; a static batch: every row steps until the longest row ends, (sum(L) - rows) / (rows *
(max(L) - 1))). `peak_mib` is XLA's compiled memory analysis (arguments + outputs + temporaries - aliased);
`kv_mib` the KV storage each allocates (engine: its page pool; static: the shared prompt block and every row's
response buffers) and `kv_held_peak_mib` the engine's most pages in use at once.
"""

from __future__ import annotations

import statistics

import jax
import numpy as np

from benchmarks.train_step import MODEL
from jaxpt.models.config import ModelConfig
from jaxpt.parallel import compiled_memory
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.rollouts import repeat_prompts
from jaxpt.rl.sampler import SamplingConfig, make_sampler

MODELS = {"issue": MODEL, "small": dict(MODEL, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=1024),
          "tiny": dict(MODEL, d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, mlp_dim=256)}
FLAGS = (("prompts", 32), ("group", 8), ("min-prompt", 64), ("max-prompt", 256), ("median", 100), ("max-new", 512),
         ("slots", 64), ("page-size", 16))
EOS = 0  # the peers' EOS (and pad) id at the point: never a prompt token
_MIB = 2 ** 20


def add_flags(parser) -> None:
  """The point's sizes (`--prompts` .. `--page-size`, `--spread`) and `--model` (issue: d_model 512, 8 layers, 8
  heads / 4 KV, SwiGLU 2048, vocab 8192, tied; small: d256, 4 layers, 4 / 2 heads; tiny: d64, 2 layers, 2 / 1)."""
  for name, default in FLAGS:
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--spread", type=float, default=0.9)
  parser.add_argument("--model", choices=sorted(MODELS), default="issue")


def realistic_rows(args, vocab_size: int, seed: int = 0):
  """(tokens, mask [B, P] left-padded, budgets int32 [B]) of the point (see the module doc); another `seed`: other
  prompts and answer lengths from the same distributions."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(args.min_prompt, args.max_prompt + 1, args.prompts)
  mask = (np.arange(args.max_prompt)[None, :] >= args.max_prompt - lengths[:, None]).astype(np.int32)
  prompts = np.where(mask == 1, rng.integers(1, vocab_size, mask.shape), 0).astype(np.int32)
  tokens, mask, _ = repeat_prompts(prompts, mask, args.group)
  return tokens, mask, answer_lengths(rng, len(tokens), args.median, args.max_new, args.spread)


def answer_lengths(rng, rows: int, median: float, max_new: int, spread: float = 0.9):
  """Forced answer lengths int32 [rows]: lognormal (median, sigma spread) clipped to 1 .. max_new."""
  lengths = np.exp(np.log(median) + spread * rng.standard_normal(rows))
  return np.clip(np.round(lengths), 1, max_new).astype(np.int32)


def static_useful_fraction(lengths) -> float:
  """Useful decode slot-steps of a static batch that steps every row until its longest one ends (see the module
  doc): (sum(L) - rows) / (rows * (max(L) - 1)); 1 where no row needs a decode step."""
  lengths = np.asarray(lengths, np.int64)
  steps = int(lengths.max()) - 1
  return round(float(lengths.sum() - len(lengths)) / (len(lengths) * steps), 3) if steps else 1.0


def jaxpt_systems(cfg: ModelConfig, args, params, tokens, mask, budgets, sampling: SamplingConfig | None = None,
                  compiled_one=lambda name: None):
  """(engine, {"engine", "static"}: compiled calls (params, tokens, mask, key, budgets)) at the point: the engine
  with `--slots` slots of `--page-size` pages, the static sampler with per-rollout keys, both `--max-new` tokens.
  `compiled_one(name)` is called as each compile ends (the device check times them one by one)."""
  sampling = sampling or SamplingConfig(max_new_tokens=args.max_new)
  engine = Engine(cfg, sampling, args.max_prompt, EngineConfig(num_slots=args.slots, page_size=args.page_size),
                  group_size=args.group)
  static = make_sampler(cfg, sampling, args.max_prompt, group_size=args.group, row_keys=True)
  key, compiled = jax.random.PRNGKey(0), {}
  for name, jitted in (("engine", engine.jitted), ("static", static)):
    compiled[name] = jitted.lower(params, tokens, mask, key, budgets).compile()
    compiled_one(name)
  return engine, compiled


def point_facts(args, budgets, engine: Engine, rounds: int) -> dict:
  """The point's sizes and its answer lengths' summary."""
  return {"prompts": args.prompts, "group": args.group, "rows": len(budgets),
          "prompt_len": [args.min_prompt, args.max_prompt], "new_tokens_median": float(np.median(budgets)),
          "new_tokens_max": int(budgets.max()), "new_tokens_mean": round(float(budgets.mean()), 1),
          "rollout_tokens": int(budgets.sum()), "spread": args.spread, "slots": args.slots,
          "page_size": args.page_size, "pool_pages": engine.num_pages, "rounds": rounds}


def call_figures(seconds: list[float], rollout_tokens: int, compiled=None) -> dict:
  """A system's median call seconds, rollout tokens/s (sum of the forced lengths / call seconds), every timed
  round's seconds and, for a compiled call, its compiled peak MiB."""
  call = statistics.median(seconds)
  figures = {"call_s": round(call, 2), "tokens_per_sec": round(rollout_tokens / call, 1),
             "seconds": [round(s, 2) for s in seconds]}
  if compiled is not None:
    figures["peak_mib"] = compiled_memory(compiled).get("peak_mib")
  return figures


def jaxpt_figures(cfg: ModelConfig, args, engine: Engine, compiled: dict, times: dict, stats, budgets) -> dict:
  """{"engine", "static"}: `call_figures` of each, their useful slot-step fractions and KV MiB (see the module doc);
  the engine's decode steps, pool waits and most KV held."""
  rows, rollout_tokens = len(budgets), int(budgets.sum())
  kv_bytes_per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.resolved_head_dim * 4
  static_slots = args.prompts * args.max_prompt + rows * (args.max_new - 1)
  figures = {name: call_figures(times[name], rollout_tokens, compiled[name]) for name in ("engine", "static")}
  figures["engine"].update(
      steps=int(stats.steps), useful_fraction=round(int(stats.useful) / (int(stats.steps) * args.slots), 3),
      waits=int(stats.waits), kv_mib=round((engine.num_pages + 1) * args.page_size * kv_bytes_per_slot / _MIB, 1),
      kv_held_peak_mib=round(int(stats.peak_pages) * args.page_size * kv_bytes_per_slot / _MIB, 1))
  figures["static"].update(useful_fraction=static_useful_fraction(budgets),
                           kv_mib=round(static_slots * kv_bytes_per_slot / _MIB, 1))
  return figures
