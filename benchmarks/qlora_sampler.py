"""How GRPO's sampler should read a QLoRA policy, one JSON object on stdout: decode on the quantized base + adapters
(W~ dequantized inside every matmul of every token) or on a merged copy W~ + s A B made once per rollout step.

At the d512 benchmark size (4 layers, nf4 blocks of 64, rank 8), timed in alternation: one decode step of 8 rows
(1 new token, a 256-slot KV cache) of each model, and the merge; `break_even_tokens` = merge / (qlora step -
merged step), the decode steps per rollout beyond which merging is cheaper; and the bytes each holds.

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

CONFIG = ModelConfig(vocab_size=8192, d_model=512, num_layers=4, num_heads=8, num_kv_heads=8, mlp_dim=1536,
                     max_seq_len=512)
ROWS, SLOTS, REPEATS = 8, 256, 15


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
            "bytes": {"qlora_params": nbytes(params), "merged_params": nbytes(merged)}}
  json.dump(result, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  main()
