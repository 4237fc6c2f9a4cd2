"""How GRPO's sampler should read a QLoRA policy, one JSON object on stdout: decode on the quantized base + adapters
(W~ dequantized inside every matmul of every token) or on a merged copy W~ + s A B made once per rollout step.

At the d512 benchmark size (4 layers, nf4 blocks of 64, rank 8), timed in alternation: one decode step of 8 rows
(1 new token, a 256-slot KV cache) of each model, and the merge; `break_even_tokens` = merge / (qlora step -
merged step), the decode steps per rollout beyond which merging is cheaper; and the bytes each holds. Then whole
rollouts as GRPO runs them (`lora.rollouts`): the compiled sampler (`make_sampler`, 8 rows, a 64-token prompt,
`NEW_TOKENS` greedy tokens) on the codes + unmerged adapters vs the merge + the sampler on the merged copy, timed in
alternation, and each compiled sampler's memory (arguments, temporaries: XLA's memory analysis).

  PYTHONPATH=. python3 benchmarks/qlora_sampler.py > benchmarks/results_qlora_sampler_cpu.json
"""

from __future__ import annotations

import json
import statistics
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks.common import alternating_seconds
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.quant import Quant
from jaxpt.parallel import compiled_memory
from jaxpt.rl.sampler import SamplingConfig, make_sampler

CONFIG = ModelConfig(vocab_size=8192, d_model=512, num_layers=4, num_heads=8, num_kv_heads=8, mlp_dim=1536,
                     max_seq_len=512)
ROWS, SLOTS, REPEATS = 8, 256, 15
PROMPT, NEW_TOKENS, ROLLOUT_REPEATS = 64, 16, 5


def nbytes(tree) -> int:
  return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def main() -> None:
  spec = lora_lib.LoRA(8, 2.0, quant=Quant("nf4", 64))
  qlora, plain = TransformerLM(CONFIG, lora=spec), TransformerLM(CONFIG)
  tokens = jnp.ones((ROWS, 1), jnp.int32)
  params = nn.meta.unbox(jax.jit(qlora.init)(jax.random.PRNGKey(0), tokens)["params"])
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: v + 0.01 if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
  merge = jax.jit(lambda p: lora_lib.merge_params(p, spec.scale, spec.quant))
  merged = merge(params)
  cache = init_cache(CONFIG, ROWS, SLOTS)

  def decoder(model):
    return jax.jit(lambda p, c: model.apply({"params": p}, tokens, cache=c, cache_index=SLOTS // 2)[0])

  qlora_step, merged_step = decoder(qlora), decoder(plain)
  times = alternating_seconds({"merge": lambda: merge(params), "qlora_decode_step": lambda: qlora_step(params, cache),
                               "merged_decode_step": lambda: merged_step(merged, cache)}, REPEATS, warmup=2)
  median = {name: statistics.median(t) for name, t in times.items()}
  gap = median["qlora_decode_step"] - median["merged_decode_step"]
  result = {"benchmark": "qlora_sampler", "backend": jax.default_backend(), "device": str(jax.devices()[0]),
            "config": {"d_model": 512, "num_layers": 4, "mlp_dim": 1536, "vocab": 8192, "rows": ROWS,
                       "kv_slots": SLOTS, "quant": "nf4", "block": 64, "rank": 8, "repeats": REPEATS},
            "median_s": median,
            "qlora_over_merged_step": median["qlora_decode_step"] / median["merged_decode_step"],
            "break_even_tokens": median["merge"] / gap if gap > 0 else None,
            "bytes": {"qlora_params": nbytes(params), "merged_params": nbytes(merged)},
            "rollout": rollouts(spec, params, merge)}
  json.dump(result, sys.stdout, indent=1)
  print()


def rollouts(spec, params, merge) -> dict:
  """Whole rollouts: the sampler on the codes vs merge + the sampler on the merged copy (see the module doc)."""
  sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True)
  prompts = jnp.ones((ROWS, PROMPT), jnp.int32)
  rng = jax.random.PRNGKey(0)
  codes = make_sampler(CONFIG, sampling, PROMPT, lora=spec).lower(params, prompts, prompts, rng).compile()
  merged_sampler = make_sampler(CONFIG, sampling, PROMPT).lower(merge(params), prompts, prompts, rng).compile()
  runs = {"codes": lambda: codes(params, prompts, prompts, rng).tokens,
          "merge_then_merged": lambda: merged_sampler(merge(params), prompts, prompts, rng).tokens}
  times = alternating_seconds(runs, ROLLOUT_REPEATS, warmup=1)
  median = {name: statistics.median(t) for name, t in times.items()}
  return {"rows": ROWS, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "repeats": ROLLOUT_REPEATS, "median_s": median,
          "codes_over_merged": median["codes"] / median["merge_then_merged"],
          "compiled_mib": {"codes": compiled_memory(codes), "merged": compiled_memory(merged_sampler)}}


if __name__ == "__main__":
  main()
