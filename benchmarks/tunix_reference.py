"""Reference numbers from tunix (google-tunix 0.1.7): its JAX/Flax NNX Llama3 model and its `Sampler`, on CPU.

    /tmp/tunix/bin/python benchmarks/tunix_reference.py [d_model] [num_layers]      (defaults 512 8)

The tunix counterpart of ../shared/bench/hf_reference.py, at the sizes of benchmarks/train_step.py and
benchmarks/sampler.py: d_model 512, 8 layers, 8 heads (4 KV, head_dim d_model / 8), SwiGLU 4 * d_model, vocab 8192,
tied embeddings (`weight_tying=True`), fp32, random init: `tunix_model.llama3`. A one-shot program, run by hand
(benchmarks/train_step.py times the same train step, `tunix_model.train_step`, in a persistent peer process,
`train_peers.py`, in alternation with jaxpt's). Prints plain text lines:
  params <N>
  train step <ms> ms  tokens/s <N>   -- one jitted AdamW (optax) step, next-token cross-entropy on a fixed random
                                        batch 8 x 256, median of 5 after 2 warm-up steps (compile excluded)
  generate: <N> new tokens/s (batch 8, 128 new)   -- `tunix.generate.sampler.Sampler.__call__` on 8 prompts of 32
                                        random tokens, 128 new tokens each sampled at temperature 1 over the full
                                        vocab (top_p 1.0, no top-k); the EOS id is -1, never sampled, so every row
                                        generates all 128; median of 3 calls after a warm-up call (compile excluded)
The sampler takes strings, so a minimal tokenizer maps space-separated integer ids to ids and back. Its pad id is
-1 too (never a token), so no prompt or generated token is masked as padding.
"""

import statistics
import sys
import time

import numpy as np
from tunix.generate.sampler import CacheConfig, Sampler

from tunix_model import HEADS, KV_HEADS, VOCAB, IdTokenizer, llama3, train_step  # beside this script

d, L = (int(sys.argv[i]) if len(sys.argv) > i else default for i, default in ((1, 512), (2, 8)))
B, T, PROMPT, NEW = 8, 256, 32, 128
model, params = llama3(tied=True, d_model=d, layers=L)
print("params", params)

# --- train step ---
step = train_step(model, B, T)
times = []
for _ in range(7):
  t = time.perf_counter()
  loss = step()
  times.append(time.perf_counter() - t)
dt = statistics.median(times[2:])
print(f"train step {dt * 1000:.1f} ms  tokens/s {B * T / dt:.0f}  (loss {float(loss):.3f})")


# --- sampler ---
sampler = Sampler(model, IdTokenizer(), CacheConfig(cache_size=PROMPT + NEW, num_layers=L, num_kv_heads=KV_HEADS,
                                                     head_dim=d // HEADS))
prompts = [" ".join(map(str, row)) for row in np.random.default_rng(1).integers(0, VOCAB, (B, PROMPT))]


def generate(seed):
  out = sampler(prompts, max_generation_steps=NEW, max_prompt_length=PROMPT, temperature=1.0, top_p=1.0,
                seed=seed)
  assert all(len(row) == NEW for row in out.tokens), [len(row) for row in out.tokens]


generate(0)  # warm-up (compiles prefill and decode)
times = []
for seed in (1, 2, 3):
  t = time.perf_counter()
  generate(seed)
  times.append(time.perf_counter() - t)
print(f"generate: {B * NEW / statistics.median(times):.0f} new tokens/s (batch {B}, {NEW} new)")
