"""Reward-model train-step throughput: Bradley-Terry vs DIR (K inner estimator steps), side by side.

    python -m benchmarks.rm_step [--pairs 8] [--seq 256] [--inner-steps 5] [--repeats 5]

Configuration (the issue's): d_model 512, 8 layers, 8 heads (4 KV), SwiGLU 2048, vocab 8192 (tied), fp32, AdamW;
a batch of `pairs` chosen/rejected pairs of `seq` tokens (2 x pairs sequences through one backbone forward).
DIR adds the CLUB estimator (Linear(512, 1024) -> ReLU -> Linear(1024, 2), its K AdamW steps on the same batch)
and the CLUB term. The two steps are timed alternately, round by round, so that both see the same load on a
shared machine. Prints one JSON object; the target is DIR step time <= 1.15x BT's.
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

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import alternating_seconds, compiled_step
from benchmarks.train_step import MODEL, OPTIM
from jaxpt.models.config import ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import param_count
from jaxpt.trainers import rm
from jaxpt.engine.optim import make_optimizer
from jaxpt.engine.state import TrainState


def random_pairs(pairs: int, seq: int, vocab_size: int) -> dict:
  """A flattened preference batch: full-length rows (last index seq - 1), a 0/1 length label."""
  rng = np.random.default_rng(0)
  batch = {f"{side}_{key}": value for side in ("chosen", "rejected") for key, value in (
      ("tokens", jnp.asarray(rng.integers(1, vocab_size, (pairs, seq)), jnp.int32)),
      ("last", jnp.full((pairs,), seq - 1, jnp.int32)),
      ("response_len", jnp.asarray(rng.integers(1, seq, pairs), jnp.int32)))}
  batch["weights"] = jnp.ones((pairs,), jnp.float32)
  batch[rm.BIAS_PREFIX + "length"] = (batch["chosen_response_len"] > batch["rejected_response_len"]).astype(jnp.int32)
  return batch


def compile_step(loss: str, pairs: int, seq: int, inner_steps: int) -> tuple[dict, Callable[[], jax.Array]]:
  """(facts, run): `run()` does one train step of `loss` on a fixed batch (the state carried between calls)."""
  cfg = ModelConfig(norm_scheme="pre", **MODEL)
  settings = rm.RMConfig(loss=loss, inner_steps=inner_steps)
  model = RewardModel(cfg, settings.objective.num_scores)
  init = jax.jit(lambda key: nn.meta.unbox(model.init(key, jnp.zeros((1, seq), jnp.int32),
                                                      jnp.zeros((1,), jnp.int32))["params"]))
  params = init(jax.random.PRNGKey(0))
  optimizer, schedule = make_optimizer(OPTIM, total_steps=1000)
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(1),
                            aux=rm.init_estimator(settings, cfg.d_model, jax.random.PRNGKey(2)))
  step = jax.jit(rm.make_rm_train_step(model, settings, optimizer, schedule), donate_argnums=0)
  batch = random_pairs(pairs, seq, cfg.vocab_size)
  memory, run = compiled_step(step, state, batch)
  return {"params": param_count(params), "memory": memory}, run


def bench(pairs: int, seq: int, inner_steps: int, repeats: int) -> dict:
  """BT and DIR steps timed alternately (BT, DIR, BT, DIR, ...), so both see the same machine load."""
  steps = {loss: compile_step(loss, pairs, seq, inner_steps) for loss in ("bt", "dir")}
  times = alternating_seconds({loss: run for loss, (_, run) in steps.items()}, repeats)
  results = {}
  for loss, (facts, _) in steps.items():
    seconds = statistics.median(times[loss])
    results[loss] = dict(facts, step_ms=round(seconds * 1e3, 1), step_ms_all=[round(t * 1e3, 1) for t in times[loss]],
                         pairs_per_sec=round(pairs / seconds, 3), tokens_per_sec=round(2 * pairs * seq / seconds, 1))
  ratios = [d / b for d, b in zip(times["dir"], times["bt"])]
  return {"losses": results, "dir_over_bt_step_time": round(results["dir"]["step_ms"] / results["bt"]["step_ms"], 3),
          "dir_over_bt_per_round_median": round(statistics.median(ratios), 3)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=8)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--inner-steps", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  results = bench(args.pairs, args.seq, args.inner_steps, args.repeats)
  report = {"benchmark": "rm_step",
            "config": dict(MODEL, pairs=args.pairs, seq=args.seq, dtype="float32", dir_inner_steps=args.inner_steps,
                           estimator_hidden=rm.RMConfig().estimator_hidden, host_allocator_reuse=allocator_reuse),
            "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), **results, "target_dir_over_bt": 1.15}
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
