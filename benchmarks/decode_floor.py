"""How fast can this machine stream a decoder's weights? The floors under a batch-8 decode step, side by side.

    python -m benchmarks.decode_floor [--repeats 20]

A decode step of the sampler benchmark's model (d_model 512, 8 layers, SwiGLU 2048) must read every weight once;
its MLP alone is 16 [512, 2048] and 8 [2048, 512] fp32 matrices (96 MiB) met by batch-8 activations. Timed
round-robin, one pass over those matrices as:
- `xla_f32`: jitted x @ W (what the sampler runs);
- `xla_bf16_weights`: jitted, weights in bf16, f32 accumulation;
- `numpy_f32`: numpy's BLAS (OpenBLAS in the wheel), same matmuls;
- `numpy_read`: a plain sum over the same bytes (the memory read floor).
Prints one JSON object with median ms, achieved GB/s of weights read, and times relative to `xla_f32`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import alternating_seconds

BATCH, D_MODEL, MLP_DIM, LAYERS = 8, 512, 2048, 8


def matrices(rng: np.random.Generator) -> list[np.ndarray]:
  shapes = [(D_MODEL, MLP_DIM)] * (2 * LAYERS) + [(MLP_DIM, D_MODEL)] * LAYERS
  return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def runs(weights: list[np.ndarray], rng: np.random.Generator) -> dict:
  inputs = [rng.standard_normal((BATCH, w.shape[0]), dtype=np.float32) for w in weights]
  one_pass = jax.jit(lambda ws, xs: [jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32)
                                     for w, x in zip(ws, xs)])
  f32 = [jnp.asarray(w) for w in weights]
  bf16 = [w.astype(jnp.bfloat16) for w in f32]
  xs = [jnp.asarray(x) for x in inputs]
  flat = np.concatenate([w.ravel() for w in weights])
  return {"xla_f32": lambda: one_pass(f32, xs), "xla_bf16_weights": lambda: one_pass(bf16, xs),
          "numpy_f32": lambda: [x @ w for w, x in zip(weights, inputs)], "numpy_read": lambda: flat.sum()}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  weights = matrices(rng)
  f32_bytes = sum(w.nbytes for w in weights)
  times = {name: statistics.median(t) for name, t in alternating_seconds(runs(weights, rng), args.repeats).items()}
  bytes_read = {name: f32_bytes // 2 if "bf16" in name else f32_bytes for name in times}
  report = {"benchmark": "decode_floor", "device": str(jax.devices()[0]), "jax": jax.__version__,
            "weights_mib_f32": round(f32_bytes / 2 ** 20, 1),
            "ms": {name: round(t * 1e3, 2) for name, t in times.items()},
            "gb_per_sec": {name: round(bytes_read[name] / t / 1e9, 1) for name, t in times.items()},
            "time_vs_xla_f32": {name: round(t / times["xla_f32"], 2) for name, t in times.items()}}
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
