"""tunix 0.1.7's GRPO policy update, a persistent peer of `benchmarks/grpo_step.py` (same protocol as
`benchmarks/sampler_peers.py`: `ready <params>`, then `run <seed>` -> `seconds <s>`).

    PEER_PYTHON benchmarks/tunix_grpo_update.py ROWS PROMPT COMPLETION

One update = tunix's registered `grpo_loss_fn` (`tunix.rl.algo_core`: teacher-forced per-token log-probs of the
completion, clipped ratio against old log-probs, KL to the reference with beta 0.001, token-mean aggregation)
under `nnx.value_and_grad`, then an AdamW step (`nnx.Optimizer`), all in one `nnx.jit`, on ROWS rows of PROMPT
prompt + COMPLETION completion tokens. The model is tunix's Llama3 at the benchmarks' d512 sizes (8 layers, 8
heads with 4 KV heads, SwiGLU 2048, vocab 8192) with tied embeddings, jaxpt's parameter count; random init
(the SwiGLU kernels, zeros in tunix, get random values). Imports no jaxpt.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.rl.algo_core import grpo_loss_fn
from tunix.rl.grpo.grpo_learner import GRPOConfig, TrainExample

from tunix_model import VOCAB, llama3  # beside this script


def main() -> None:
  rows, prompt, completion = map(int, sys.argv[1:4])
  model, params = llama3(tied=True)
  optimizer = nnx.Optimizer(model, optax.adamw(1e-6), wrt=nnx.Param)
  algo = GRPOConfig(num_generations=8, beta=0.001, epsilon=0.2, loss_agg_mode="token-mean")
  algo.temperature = 1.0  # read by grpo_loss_fn (set by the learner from the rollout config)
  rng = np.random.default_rng(0)
  example = TrainExample(
      prompt_ids=jnp.asarray(rng.integers(1, VOCAB, (rows, prompt)), jnp.int32),
      prompt_mask=jnp.ones((rows, prompt), jnp.int32),
      completion_ids=jnp.asarray(rng.integers(1, VOCAB, (rows, completion)), jnp.int32),
      completion_mask=jnp.ones((rows, completion), jnp.int32),
      advantages=jnp.asarray(rng.normal(size=rows), jnp.float32),
      ref_per_token_logps=jnp.asarray(-rng.uniform(5, 12, (rows, completion)), jnp.float32),
      old_per_token_logps=jnp.asarray(-rng.uniform(5, 12, (rows, completion)), jnp.float32))

  @nnx.jit
  def update(model, optimizer, example):
    loss_fn = lambda m: grpo_loss_fn(m, example, algo, pad_id=0, eos_id=VOCAB)
    (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss

  jax.block_until_ready(update(model, optimizer, example))
  print("ready", params, flush=True)
  for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
      break
    start = time.perf_counter()
    jax.block_until_ready(update(model, optimizer, example))
    print("seconds", time.perf_counter() - start, flush=True)


if __name__ == "__main__":
  main()
