"""ViT and DiT train-step time and compiled peak memory per residual scheme, and their ratios to Pre-Norm.

    python -m benchmarks.vit_step [--model vit|dit] [--schemes pre,siamese_post_pre,...] [--d-model 192
                                   --layers 6 --heads 3 --image-size 32 --patch-size 4 --batch 32 --repeats 5]

Default: DeiT-T's width (d_model 192, 3 heads, MLP 768, LayerNorm eps 1e-6, erf GELU, biases, class token) at 6
layers on 32x32x3 images in 4x4 patches (65 tokens), 10 classes, batch 32, fp32, AdamW, layers unrolled. The
schemes' steps are timed round-robin (`benchmarks.common.alternating_seconds`), so all see the same load on a shared
machine; peak memory is XLA's compiled memory analysis of the whole step. Prints one JSON object.
`benchmarks/results_vit_step_cpu.json` is `python -m benchmarks.vit_step` (the defaults) on this project's 2-core CPU
machine at load ~9 from other jobs: read its ratios, not its absolute times.

`--model dit`: the class-conditional DiT (`jaxpt.models.dit`, adaLN-Zero; schemes pre and siamese_post_pre) at the
same width with DiT's block settings (LayerNorm eps 1e-6, tanh GELU, biases), 32x32x3 images in 4x4 patches (64
tokens), one diffusion-loss step (T = 1000, class dropout 0.1). `benchmarks/results_dit_step_cpu.json` is
`python -m benchmarks.vit_step --model dit --schemes pre,siamese_post_pre` on the quiet 2-core CPU machine:
siamese_post_pre takes 1.04x the step time and 1.35x the compiled peak memory of Pre-Norm.
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

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import alternating_seconds, compiled_step, ratios_vs_pre
from jaxpt.losses.noise_schedule import NoiseSchedule
from jaxpt.models.config import ModelConfig
from jaxpt.models.dit import DiT, DiTConfig, init_dit_params
from jaxpt.models.transformer import param_count
from jaxpt.models.vit import ViT, ViTConfig, init_vit_params
from jaxpt.engine.optim import OptimConfig, make_optimizer
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import make_train_step
from jaxpt.trainers.dit import make_dit_loss_fn
from jaxpt.trainers.vit import make_vit_loss_fn

DEIT = dict(norm_type="layernorm", norm_eps=1e-6, mlp_type="gelu_exact", mlp_bias=True, qkv_bias=True,
            attn_out_bias=True, causal=False, rope=False, scan_layers=False)
DIT = dict(DEIT, mlp_type="gelu")
OPTIM = OptimConfig(learning_rate=1e-3, warmup_steps=10, weight_decay=0.05, grad_clip=1.0)


def compile_scheme(scheme: str, model: dict, image: ViTConfig | DiTConfig,
                   batch: int) -> tuple[dict, Callable[[], jax.Array]]:
  """(facts, run): `run()` does one train step of `scheme` (a ViT for a ViTConfig, else a DiT) on a fixed batch (the
  state carried between calls)."""
  if isinstance(image, ViTConfig):
    cfg = ModelConfig(norm_scheme=scheme, **DEIT, **model)
    params, loss_fn = init_vit_params(cfg, image, jax.random.PRNGKey(0)), make_vit_loss_fn(ViT(cfg, image), 0.1)
  else:
    cfg = ModelConfig(norm_scheme=scheme, **DIT, **model)
    params = init_dit_params(cfg, image, jax.random.PRNGKey(0))
    loss_fn = make_dit_loss_fn(DiT(cfg, image), NoiseSchedule.linear())
  optimizer, schedule = make_optimizer(OPTIM, total_steps=1000)
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(1))
  step = jax.jit(make_train_step(loss_fn, optimizer, schedule, weight_key="num_examples"), donate_argnums=0)
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (batch, image.image_size, image.image_size, image.channels)).astype(np.float32)
  data = {"images": jnp.asarray(images), "labels": jnp.asarray(rng.integers(0, image.num_classes, batch), jnp.int32),
          "weights": jnp.ones((batch,), jnp.float32)}
  memory, run = compiled_step(step, state, data)
  return {"params": param_count(params), "memory": memory}, run


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("vit", "dit"), default="vit")
  parser.add_argument("--schemes", default="pre,post,hybrid,siamese_post_pre,siamese_hybrid_pre")
  parser.add_argument("--d-model", type=int, default=192)
  parser.add_argument("--layers", type=int, default=6)
  parser.add_argument("--heads", type=int, default=3)
  parser.add_argument("--image-size", type=int, default=32)
  parser.add_argument("--patch-size", type=int, default=4)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)

  model = dict(d_model=args.d_model, num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.heads,
               mlp_dim=4 * args.d_model)
  image_config = ViTConfig if args.model == "vit" else DiTConfig
  image = image_config(image_size=args.image_size, patch_size=args.patch_size, channels=3, num_classes=10)
  compiled = {s: compile_scheme(s, model, image, args.batch) for s in args.schemes.split(",")}
  times = alternating_seconds({s: run for s, (_, run) in compiled.items()}, args.repeats)
  schemes = {}
  for scheme, (facts, _) in compiled.items():
    seconds = statistics.median(times[scheme])
    schemes[scheme] = dict(facts, step_ms=round(seconds * 1e3, 1), images_per_sec=round(args.batch / seconds, 1))
  report = {"benchmark": f"{args.model}_step", "config": dict(model, **(DEIT if args.model == "vit" else DIT),
                                                              image_size=image.image_size,
                                                              patch_size=image.patch_size,
                                                              tokens=image.grid ** 2 + (args.model == "vit"),
                                                    batch=args.batch, dtype="float32", repeats=args.repeats,
                                                    host_allocator_reuse=allocator_reuse),
            "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "schemes": schemes}
  if "pre" in schemes:
    report["ratios_vs_pre"] = ratios_vs_pre(schemes)
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
