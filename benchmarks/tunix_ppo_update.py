"""tunix 0.1.7's PPO update of one minibatch, a persistent peer of `benchmarks/ppo_step.py` (same protocol as
`benchmarks/sampler_peers.py`: `ready <params>`, then `run <seed>` -> `seconds <s>`).

    PEER_PYTHON benchmarks/tunix_ppo_update.py ROWS PROMPT COMPLETION D_MODEL LAYERS HEADS KV_HEADS

One update = what `PPOLearner` (`tunix.rl.ppo.ppo_learner`) has its two trainers do for one minibatch, each in its
own `nnx.jit` step, the body of tunix's `PeftTrainer._train_step`: `nnx.value_and_grad` of the loss, the
gradient's global norm, an optimizer update (`nnx.Optimizer`):
- actor step: the registered `ppo` policy loss (`algo_core.ppo_policy_loss_fn`: teacher-forced per-token
  log-probs of the completion, ratio to the old log-probs clipped at 0.2 on the per-token GAE advantages, token
  mean; no entropy term; its in-loss KL is off, as `PPOConfig` has no `kl_coef`: tunix puts the KL in the
  rewards, as jaxpt does), AdamW lr 1e-5 after a global-norm clip at 1.0;
- critic step: the registered `ppo` value loss (`algo_core.ppo_value_loss_fn`: `common.compute_score`'s per-token
  values, clipped at 0.2 around the old values, 0.5 x the token mean of the larger squared error to the returns),
  AdamW lr 1e-4 after a global-norm clip at 1.0.
A call runs the actor step, then the critic step (the learner's order: `update_actor`, then `update_critic`), and
blocks on both. The advantages, returns, old values and old / reference log-probs are fixed random arrays (inputs,
as the learner's GAE hands them over). The models: the actor is tunix's Llama3 (`tunix_model.llama3`, tied
embeddings as jaxpt's policy) at D_MODEL, LAYERS, HEADS, KV_HEADS; the critic is what tunix builds a critic with,
`tunix.rl.utils.create_critic_model` (a copy of an untied Llama3 of that size whose `lm_head` becomes a bias-free
[d, 1] value head), called through `dropping_segment_ids`: tunix 0.1.7's `compute_score` always passes `segment_ids`
(the non-pad mask), which its Llama3 does not take (`TypeError`); the same mask is in the attention mask it gets.
Imports no jaxpt.
"""

from __future__ import annotations

import sys
import time

FIELDS = ("ROWS", "PROMPT", "COMPLETION", "D_MODEL", "LAYERS", "HEADS", "KV_HEADS")


def parse(argv: list[str]) -> dict[str, int]:
  """The positional sizes, each a positive int, D_MODEL divisible by HEADS and HEADS by KV_HEADS (raised before
  tunix is imported)."""
  if len(argv) != len(FIELDS):
    raise SystemExit(f"tunix_ppo_update.py: expected {' '.join(FIELDS)}, got {len(argv)} arguments")
  sizes = {}
  for name, text in zip(FIELDS, argv):
    if not text.isdigit() or int(text) < 1:
      raise SystemExit(f"tunix_ppo_update.py: {name} must be a positive integer, not {text!r}")
    sizes[name] = int(text)
  if sizes["D_MODEL"] % sizes["HEADS"] or sizes["HEADS"] % sizes["KV_HEADS"]:
    raise SystemExit("tunix_ppo_update.py: D_MODEL must be divisible by HEADS, and HEADS by KV_HEADS")
  return sizes


def dropping_segment_ids(model):
  """`model` (an nnx.Module) behind a module whose call drops a `segment_ids` keyword (see the module doc)."""
  from flax import nnx

  class Dropped(nnx.Module):

    def __init__(self, inner):
      self.inner = inner

    def __call__(self, *args, segment_ids=None, **kwargs):
      del segment_ids  # the attention mask carries the same non-pad positions
      return self.inner(*args, **kwargs)

  return Dropped(model)


def main(argv: list[str]) -> None:
  size = parse(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx
  from tunix.rl.algo_core import ppo_policy_loss_fn, ppo_value_loss_fn
  from tunix.rl.ppo.ppo_learner import PPOConfig, TrainExample
  from tunix.rl.utils import create_critic_model

  from tunix_model import VOCAB, llama3  # beside this script

  rows, prompt, completion = size["ROWS"], size["PROMPT"], size["COMPLETION"]
  dims = dict(d_model=size["D_MODEL"], layers=size["LAYERS"], heads=size["HEADS"], kv_heads=size["KV_HEADS"])
  actor, actor_params = llama3(tied=True, **dims)
  critic = dropping_segment_ids(create_critic_model(llama3(tied=False, **dims)[0]))
  critic_params = sum(x.size for x in jax.tree.leaves(nnx.state(critic, nnx.Param)))
  clipped_adamw = lambda lr: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=0.0))
  actor_opt = nnx.Optimizer(actor, clipped_adamw(1e-5), wrt=nnx.Param)
  critic_opt = nnx.Optimizer(critic, clipped_adamw(1e-4), wrt=nnx.Param)
  algo = PPOConfig(epsilon=0.2, clip_range_value=0.2, entropy_coef=None)
  rng = np.random.default_rng(0)
  per_token = lambda lo, hi: jnp.asarray(rng.uniform(lo, hi, (rows, completion)), jnp.float32)
  example = TrainExample(
      prompt_ids=jnp.asarray(rng.integers(1, VOCAB, (rows, prompt)), jnp.int32),
      prompt_mask=jnp.ones((rows, prompt), jnp.int32),
      completion_ids=jnp.asarray(rng.integers(1, VOCAB, (rows, completion)), jnp.int32),
      completion_mask=jnp.ones((rows, completion), jnp.int32),
      advantages=jnp.asarray(rng.normal(size=(rows, completion)), jnp.float32),
      ref_per_token_logps=per_token(-12, -5), old_per_token_logps=per_token(-12, -5),
      returns=per_token(-1, 1), old_values=per_token(-1, 1))

  def train_step(loss_fn, **inputs):
    """tunix's `PeftTrainer._train_step` (no LoRA) with the learner's `gen_model_input_fn` inputs."""

    @nnx.jit
    def step(model, optimizer, example):
      (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, train_example=example, **inputs)
      grad_norm = optax.global_norm(grads)
      optimizer.update(model, grads)
      return loss, grad_norm

    return step

  actor_step = train_step(ppo_policy_loss_fn, algo_config=algo, pad_id=0, eos_id=VOCAB)
  critic_step = train_step(ppo_value_loss_fn, clip_range_value=algo.clip_range_value, pad_id=0, eos_id=VOCAB)

  def update():
    return jax.block_until_ready((actor_step(actor, actor_opt, example), critic_step(critic, critic_opt, example)))

  update()
  print("ready", actor_params + critic_params, f"actor={actor_params} critic={critic_params}", flush=True)
  for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
      break
    start = time.perf_counter()
    update()
    print("seconds", time.perf_counter() - start, flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
