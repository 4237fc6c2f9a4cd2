"""Reference numbers from tunix (google-tunix 0.1.7): its JAX/Flax NNX Llama3 model and its `Sampler`, on CPU.

    /tmp/tunix/bin/python benchmarks/tunix_reference.py [d_model] [num_layers]      (defaults 512 8)

The tunix counterpart of ../shared/bench/hf_reference.py, at the sizes of benchmarks/train_step.py and
benchmarks/sampler.py: d_model 512, 8 layers, 8 heads (4 KV, head_dim d_model / 8), SwiGLU 4 * d_model, vocab 8192,
tied embeddings (`weight_tying=True`), fp32, random init. Prints plain text lines:
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

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.generate.sampler import CacheConfig, Sampler
from tunix.models.llama3.model import Llama3, ModelConfig

from tunix_model import IdTokenizer  # beside this script

d, L = (int(sys.argv[i]) if len(sys.argv) > i else default for i, default in ((1, 512), (2, 8)))
H, KV, V, B, T, PROMPT, NEW = 8, 4, 8192, 8, 256, 32, 128
cfg = ModelConfig(num_layers=L, vocab_size=V, embed_dim=d, hidden_dim=4 * d, num_heads=H, head_dim=d // H,
                  num_kv_heads=KV, rope_theta=10_000, norm_eps=1e-6, weight_tying=True)
model = Llama3(cfg, rngs=nnx.Rngs(0))
# tunix initialises the SwiGLU kernels to zeros; give them random values like every other weight.
keys = iter(jax.random.split(jax.random.PRNGKey(1), 3 * L))
for layer in model.layers:
  for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
    proj.kernel[...] = 0.02 * jax.random.normal(next(keys), proj.kernel.shape, jnp.float32)
graphdef, params = nnx.split(model, nnx.Param)
print("params", sum(x.size for x in jax.tree.leaves(params)))

# --- train step ---
optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                        optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (B, T + 1), dtype=np.int32))
inputs, targets = tokens[:, :-1], tokens[:, 1:]
positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
causal = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), jnp.bool_)), (B, T, T))


def loss_fn(p):
  logits, _ = nnx.merge(graphdef, p)(inputs, positions, None, causal)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@jax.jit
def train_step(p, opt_state):
  loss, grads = jax.value_and_grad(loss_fn)(p)
  updates, opt_state = optimizer.update(grads, opt_state, p)
  return optax.apply_updates(p, updates), opt_state, loss


train_params, opt_state = jax.tree.map(jnp.copy, params), optimizer.init(params)
times = []
for i in range(7):
  t = time.perf_counter()
  train_params, opt_state, loss = train_step(train_params, opt_state)
  loss.block_until_ready()
  times.append(time.perf_counter() - t)
dt = statistics.median(times[2:])
print(f"train step {dt * 1000:.1f} ms  tokens/s {B * T / dt:.0f}  (loss {float(loss):.3f})")


# --- sampler ---
sampler = Sampler(model, IdTokenizer(), CacheConfig(cache_size=PROMPT + NEW, num_layers=L, num_kv_heads=KV,
                                                     head_dim=d // H))
prompts = [" ".join(map(str, row)) for row in np.random.default_rng(1).integers(0, V, (B, PROMPT))]


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
