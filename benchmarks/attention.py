"""Causal attention forward + backward side by side for several query chunk sizes.

    python -m benchmarks.attention [--repeats 10]

Shapes (the train-step benchmark's): batch 8, 8 query heads sharing 4 KV heads, head_dim 64, fp32.
`grouped_attention` forward + backward (grads of q, k, v) at seq 256 for `query_chunk` 0 (all queries at once),
32, 64 and 128 (chunk c reads keys < (c + 1) * chunk only), timed round-robin (`alternating_seconds`). Prints
one JSON object with median ms and the ratios to query_chunk 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import jax
import jax.numpy as jnp

from benchmarks.common import alternating_seconds
from jaxpt.nn.attention import attention_mask, grouped_attention

BATCH, HEADS, KV_HEADS, HEAD_DIM = 8, 8, 4, 64
SEQ = 256
CHUNKS = (0, 32, 64, 128)


def chunk_runs() -> dict:
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (BATCH, SEQ, HEADS, HEAD_DIM))
  k, v = (jax.random.normal(key, (BATCH, KV_HEADS, SEQ, HEAD_DIM)) for key in keys[1:])
  mask = attention_mask(SEQ)
  runs = {}
  for chunk in CHUNKS:
    loss = lambda q, k, v, chunk=chunk: jnp.sum(grouped_attention(q, k, v, mask, chunk) ** 2)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    runs[f"query_chunk_{chunk}"] = lambda step=step: step(q, k, v)
  return runs


def summarise(times: dict) -> dict:
  medians = {name: statistics.median(t) for name, t in times.items()}
  first = next(iter(medians.values()))
  return {"ms": {name: round(m * 1e3, 3) for name, m in medians.items()},
          "time_vs_first": {name: round(m / first, 3) for name, m in medians.items()}}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args(argv)
  report = {"benchmark": "attention", "device": str(jax.devices()[0]), "jax": jax.__version__,
            "shapes": dict(batch=BATCH, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, seq=SEQ),
            "fwd_bwd": summarise(alternating_seconds(chunk_runs(), args.repeats))}
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
