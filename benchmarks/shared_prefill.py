"""Shared-prompt prefill (issue 29, item 1): the GRPO-shaped rollout call with each prompt prefilled once and its G
rows decoding over that shared K/V, against the same rows prefilled one by one, timed in alternation. Prints one
JSON object.

    python -m benchmarks.shared_prefill [--prompts 8] [--group 8] [--prompt-len 256] [--new-tokens 128]
                                        [--rounds 3] [--dtypes float32] [--scheme pre] [--before 3de1b81]

Model: `benchmarks/train_step.py`'s (d_model 512, 8 layers, 8 heads / 4 KV, SwiGLU 2048, vocab 8192, tied), random
init. The rows: `prompts` random prompts of `prompt_len` tokens (no padding), each repeated `group` times (the
trainer's layout, `jaxpt.rl.rollouts.repeat_prompts`), sampled at temperature 1 with no EOS, so every row
generates every token. Variants, each one compiled `make_sampler` call, compile excluded:
- `shared`: `make_sampler(..., group_size=group)`: prompts/G prefills, the prompt K/V read once per group;
- `repeated`: the same sampler with group_size 1 on the same rows (G prefills of each prompt, G copies of its K/V:
  the design before, in today's code);
- `before`: the sampler as it was at git revision `--before` (its source read with `git show`; it runs on today's
  model code, whose cache without a prefix is the one it used), skipped with `--before ''` or outside a git checkout.
A round times every variant once, one after the other (`benchmarks.common.alternating_seconds`, after an untimed
round); `speedup_vs_<v>` is the median over rounds of that round's v seconds / shared seconds. `prefill_ms` is each
variant with 1 new token (a prefill and one draw), so decode_step_ms = (call - prefill) / (new - 1). `peak_mib` is
XLA's compiled memory analysis of the call (arguments + outputs + temporaries - aliased), the KV cache included.
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
import subprocess
import sys
import types
from typing import Callable

import jax
import numpy as np

from benchmarks.common import alternating_seconds, median_ratio
from benchmarks.train_step import MODEL
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params
from jaxpt.parallel import compiled_memory
from jaxpt.rl import sampler as sampler_module
from jaxpt.rl.rollouts import repeat_prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sampler_before(revision: str) -> types.ModuleType | None:
  """`jaxpt/rl/sampler.py` as it was at `revision`, loaded as a module (None without git or that revision)."""
  try:
    source = subprocess.run(["git", "show", f"{revision}:jaxpt/rl/sampler.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  module = types.ModuleType(f"sampler_at_{revision}")
  sys.modules[module.__name__] = module  # (its dataclasses look their module up)
  exec(compile(source, f"{revision}:jaxpt/rl/sampler.py", "exec"), module.__dict__)
  return module


def variant_run(make: Callable, cfg: ModelConfig, params, tokens, mask, new_tokens: int, dtype: str,
                **kwargs) -> tuple[Callable[[], jax.Array], dict]:
  """(one compiled call per `run()`, a fresh key each; its compiled memory) of `make(cfg, sampling, ...)`."""
  sampling = sampler_module.SamplingConfig(max_new_tokens=new_tokens, rollout_dtype=dtype)
  compiled = make(cfg, sampling, tokens.shape[1], **kwargs).lower(params, tokens, mask,
                                                                   jax.random.PRNGKey(0)).compile()
  calls = iter(range(10 ** 6))
  return (lambda: compiled(params, tokens, mask, jax.random.PRNGKey(next(calls))).tokens), compiled_memory(compiled)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--prompt-len", type=int, default=256)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--dtypes", default="float32")
  parser.add_argument("--scheme", default="pre")
  parser.add_argument("--before", default="3de1b81", help="git revision of the sampler before shared prefill")
  args = parser.parse_args(argv)
  cfg = ModelConfig(norm_scheme=args.scheme, **MODEL)
  params = init_params(cfg, jax.random.PRNGKey(0))
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.prompts, args.prompt_len), dtype=np.int32)
  tokens, mask, _ = repeat_prompts(prompts, np.ones_like(prompts), args.group)
  makers = {"shared": (sampler_module.make_sampler, {"group_size": args.group}),
            "repeated": (sampler_module.make_sampler, {})}
  before = sampler_before(args.before) if args.before else None
  if before is not None:
    makers["before"] = (before.make_sampler, {})
  runs, memory = {}, {}
  for dtype in args.dtypes.split(","):
    for name, (make, kwargs) in makers.items():
      for new, part in ((args.new_tokens, "call"), (1, "prefill")):
        runs[(dtype, name, part)], mem = variant_run(make, cfg, params, tokens, mask, new, dtype, **kwargs)
        if part == "call":
          memory[(dtype, name)] = mem
  times = alternating_seconds(runs, args.rounds)
  rows = args.prompts * args.group
  results = {}
  for dtype in args.dtypes.split(","):
    point = {}
    for name in makers:
      call, prefill = (statistics.median(times[(dtype, name, part)]) for part in ("call", "prefill"))
      point[name] = {"call_ms": round(1e3 * call, 1), "prefill_ms": round(1e3 * prefill, 1),
                     "decode_step_ms": round(1e3 * (call - prefill) / max(args.new_tokens - 1, 1), 2),
                     "new_tokens_per_sec": round(rows * args.new_tokens / call, 1),
                     "peak_mib": memory[(dtype, name)].get("peak_mib")}
    for name in makers:
      if name != "shared":
        ratio = median_ratio(times[(dtype, name, "call")], times[(dtype, "shared", "call")])
        point["shared"][f"speedup_vs_{name}"] = round(ratio, 2)
    results[dtype] = point
  report = {"benchmark": "shared_prefill", "config": dict(MODEL, norm_scheme=args.scheme, cache_segments=4,
                                                          sampling="temperature 1, no top-k/top-p, no EOS",
                                                          host_allocator_reuse=allocator_reuse),
            "point": {"prompts": args.prompts, "group": args.group, "rows": rows, "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "rounds": args.rounds},
            "before": args.before if before is not None else None,
            "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "command": "python -m benchmarks.shared_prefill " + shlex.join(
                sys.argv[1:] if argv is None else argv), **results}
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
