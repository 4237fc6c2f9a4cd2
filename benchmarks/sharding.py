"""Per-device memory of the compiled train step under each sharding preset, on an 8-device CPU mesh.

    python -m benchmarks.sharding [--devices 8] [--presets dp,fsdp,tp,fsdp_tp] [--remat none,full,dots]

Compiles (does not run) the AdamW train step of a d_model-512, 4-layer LM (vocab 8192, SwiGLU 2048, batch
16 x 256, fp32) with `jaxpt.engine.sharded.shard_training` and reports XLA's `memory_analysis()` per device, next to
the train state's own bytes per device (params + AdamW moments, from the shardings). FSDP splits the state over
the `fsdp` axis, so its state per device is about 1/devices of DP's. The remat rows repeat FSDP with each
`model.remat` policy (activation memory: temp). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import sys


def _set_devices(argv) -> None:
  """XLA reads the host device count when its backend starts: set it before importing jax."""
  count = 8
  for i, arg in enumerate(argv):
    if arg.startswith("--devices"):
      count = int(arg.split("=", 1)[1] if "=" in arg else argv[i + 1])
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"


_set_devices(sys.argv[1:])

import json  # noqa: E402
import math  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxpt import parallel  # noqa: E402
from jaxpt.models.config import ModelConfig  # noqa: E402
from jaxpt.models.transformer import TransformerLM  # noqa: E402
from jaxpt.trainers.lm import make_lm_loss_fn  # noqa: E402
from jaxpt.engine.optim import OptimConfig, decay_mask, make_optimizer  # noqa: E402
from jaxpt.engine.sharded import shard_training  # noqa: E402
from jaxpt.engine.state import TrainState  # noqa: E402
from jaxpt.engine.step import make_train_step  # noqa: E402

BATCH, SEQ = 16, 256
MODEL = dict(vocab_size=8192, d_model=512, num_layers=4, num_heads=8, num_kv_heads=8, mlp_dim=2048,
             max_seq_len=SEQ)
MESHES = {"dp": dict(data=-1), "fsdp": dict(data=1, fsdp=-1), "tp": dict(data=-1, tensor=2),
          "fsdp_tp": dict(data=1, fsdp=-1, tensor=2)}


def state_mib_per_device(training) -> float:
  """Bytes of the train state one device holds (its shard of every leaf), in MiB."""
  abstract = jax.eval_shape(training.init_state)
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(abstract), jax.tree.leaves(training.state_sharding)):
    total += math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
  return round(total / 2 ** 20, 3)


def compile_step(preset: str, remat: str) -> dict:
  config = ModelConfig(**MODEL, remat=remat)
  model = TransformerLM(config)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(0))
  dummy = jnp.zeros((1, SEQ), jnp.int32)
  boxed = jax.eval_shape(model.init, init_rng, dummy)["params"]
  optimizer, schedule = make_optimizer(OptimConfig(), 1000, mask=decay_mask(boxed))

  def init_fn():
    return TrainState.create(nn.meta.unbox(model.init(init_rng, dummy)["params"]), optimizer, train_rng)

  mesh_config = parallel.MeshConfig(**MESHES[preset], rules=preset)
  mesh = parallel.make_mesh(mesh_config)
  parallel.check_global_batch(BATCH, mesh)
  step_fn = make_train_step(make_lm_loss_fn(model, z_loss=1e-4), optimizer, schedule)
  shapes = {k: jax.ShapeDtypeStruct((BATCH, SEQ), dtype) for k, dtype in
            (("inputs", jnp.int32), ("targets", jnp.int32), ("positions", jnp.int32), ("segment_ids", jnp.int32),
             ("weights", jnp.float32))}
  training = shard_training(init_fn, step_fn, boxed, optimizer, mesh, mesh_config.logical_rules, shapes)
  return {"preset": preset, "remat": remat, "mesh": dict(mesh.shape),
          "state_mib_per_device": state_mib_per_device(training), **training.memory}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8, help="simulated host devices (read before jax starts)")
  parser.add_argument("--presets", default="dp,fsdp")
  parser.add_argument("--remat", default="none,full,dots", help="remat policies to compare under fsdp")
  args = parser.parse_args(argv)
  rows = [compile_step(preset, "none") for preset in args.presets.split(",")]
  remat_rows = [compile_step("fsdp", remat) for remat in args.remat.split(",") if remat]
  by_preset = {row["preset"]: row for row in rows}
  result = {"devices": jax.device_count(), "platform": jax.default_backend(), "model": MODEL,
            "batch": [BATCH, SEQ], "param_count": None, "per_device": rows, "fsdp_remat": remat_rows}
  config = ModelConfig(**MODEL)
  result["param_count"] = sum(math.prod(x.shape) for x in jax.tree.leaves(
      jax.eval_shape(TransformerLM(config).init, jax.random.PRNGKey(0), jnp.zeros((1, SEQ), jnp.int32))))
  if "dp" in by_preset and "fsdp" in by_preset:
    dp, fsdp = by_preset["dp"], by_preset["fsdp"]
    result["fsdp_over_dp"] = {key: round(fsdp[key] / dp[key], 4) for key in
                              ("state_mib_per_device", "argument_mib", "peak_mib")}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
