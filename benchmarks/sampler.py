"""KV-cache sampler throughput (new tokens/s) per residual scheme, beside HF `generate` and tunix's `Sampler`.

    python -m benchmarks.sampler [--schemes pre,siamese_post_pre] [--hf-python /tmp/hfref/bin/python]
                                 [--tunix-python /tmp/tunix/bin/python]

Configuration (the issue's): d_model 512, 8 layers, 8 heads (4 KV), SwiGLU 2048, vocab 8192 (tied), fp32;
batch 8, prompt 32, 128 new tokens sampled at temperature 1 with no EOS, so every row generates all 128 (HF:
`generate(do_sample=True, top_k=0, min_new_tokens=128)`). One timed call = prefill + 127 decode steps, compile
excluded; `prefill_ms` times the prefill (plus one sampling step) alone, `weights_matmul_ms` one pass over all
weight matrices as batch-8 matmuls (the bandwidth floor of a decode step). All of these, for every scheme, are
timed round-robin so they see the same machine load. Prints one JSON object.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import platform
import statistics
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import references
from benchmarks.common import alternating_seconds
from benchmarks.train_step import MODEL
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params, param_count
from jaxpt.rl.sampler import SamplingConfig, make_sampler

BATCH, PROMPT, NEW_TOKENS = 8, 32, 128


def sampler_run(cfg: ModelConfig, params, new_tokens: int) -> Callable[[], jax.Array]:
  """One compiled sampler call per `run()` (prompts without padding, all rows run to new_tokens, a fresh key each)."""
  sampler = make_sampler(cfg, SamplingConfig(max_new_tokens=new_tokens), PROMPT)
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (BATCH, PROMPT), dtype=np.int32)
  mask = np.ones_like(prompts)
  compiled = sampler.lower(params, prompts, mask, jax.random.PRNGKey(0)).compile()
  calls = iter(range(10 ** 6))
  return lambda: compiled(params, prompts, mask, jax.random.PRNGKey(next(calls))).tokens


def weights_matmul_run(params) -> Callable[[], object]:
  """One pass over every weight matrix as a batch-BATCH matmul (x [BATCH, rows] @ W [rows, cols]) per `run()`:
  the floor a decode step, which must read all weights once, is compared against."""
  def as_matrix(w):
    return w.reshape(-1, w.shape[-1]) if w.ndim == 3 and w.shape[0] < w.shape[-1] else w.reshape(w.shape[0], -1)

  matrices = [as_matrix(w) for w in jax.tree_util.tree_leaves(params) if w.ndim >= 2]
  inputs = [jnp.ones((BATCH, m.shape[0]), m.dtype) for m in matrices]
  one_pass = jax.jit(lambda ms, xs: [x @ m for m, x in zip(ms, xs)])
  return lambda: one_pass(matrices, inputs)


def scheme_runs(scheme: str, **overrides) -> tuple[dict, dict]:
  """(facts, runs): the full sampler call, the prefill alone (1 new token) and the weights pass of `scheme`."""
  cfg = ModelConfig(norm_scheme=scheme, **dict(MODEL, **overrides))
  params = init_params(cfg, jax.random.PRNGKey(0))
  runs = {"call": sampler_run(cfg, params, NEW_TOKENS), "prefill": sampler_run(cfg, params, 1),
          "weights_matmul": weights_matmul_run(params)}
  return {"params": param_count(params)}, runs


def summarise(facts: dict, seconds: dict) -> dict:
  """Per-scheme figures from median seconds of its call / prefill / weights pass."""
  decode_step = (seconds["call"] - seconds["prefill"]) / (NEW_TOKENS - 1)
  return dict(facts, weights_matmul_ms=round(seconds["weights_matmul"] * 1e3, 2),
              decode_step_vs_weights_matmul=round(decode_step / seconds["weights_matmul"], 2),
              call_ms=round(seconds["call"] * 1e3, 1), prefill_ms=round(seconds["prefill"] * 1e3, 1),
              decode_step_ms=round(decode_step * 1e3, 2),
              new_tokens_per_sec=round(BATCH * NEW_TOKENS / seconds["call"], 1),
              decode_tokens_per_sec=round(BATCH / decode_step, 1))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--schemes", default="pre,siamese_post_pre")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--no-scan", action="store_true", help="unroll the layers instead of nn.scan")
  references.add_arguments(parser)
  args = parser.parse_args(argv)

  facts, runs = {}, {}
  for scheme in args.schemes.split(","):
    facts[scheme], scheme_calls = scheme_runs(scheme, scan_layers=not args.no_scan)
    runs.update({(scheme, part): run for part, run in scheme_calls.items()})
  times = alternating_seconds(runs, args.repeats)
  schemes = {scheme: summarise(facts[scheme], {part: statistics.median(t) for (s, part), t in times.items()
                                               if s == scheme})
             for scheme in facts}
  report = {"benchmark": "sampler",
            "config": dict(MODEL, batch=BATCH, prompt=PROMPT, new_tokens=NEW_TOKENS, dtype="float32",
                           sampling="temperature 1, no top-k/top-p, no EOS", scan_layers=not args.no_scan,
                           host_allocator_reuse=allocator_reuse),
            "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "schemes": schemes}
  if "pre" in schemes:
    pre = schemes["pre"]["call_ms"]
    report["call_time_vs_pre"] = {s: round(r["call_ms"] / pre, 3) for s, r in schemes.items() if s != "pre"}
  for name, reference in references.run(args, MODEL["d_model"], MODEL["num_layers"]).items():
    generate = reference["generate_new_tokens_per_sec"]
    report[f"{name}_generate_new_tokens_per_sec"] = generate
    if generate:
      report[f"new_tokens_per_sec_vs_{name}"] = {s: round(r["new_tokens_per_sec"] / generate, 2)
                                                 for s, r in schemes.items()}
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
