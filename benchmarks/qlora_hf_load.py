"""Peak host memory of a QLoRA run's start from an `hf:` checkpoint, one JSON object on stdout: the float base read
whole and then quantized (how `Training.init_state` did it) vs each kernel quantized as it streams in
(`builder.stream_quantizer`, what it does now).

A Llama-shaped checkpoint with random weights (d 1024, 4 layers, mlp 2816, vocab 4096: 201 MB of float32 kernels
that QLoRA quantizes, 34 MB of embeddings) is written to a temporary directory once; each way runs in its own fresh
process (alternating, `ROUNDS` each), which samples its anonymous resident memory (RssAnon, /proc/self/status:
safetensors' memory-mapped file pages are not counted) every millisecond while the checkpoint loads; the figure is
the peak above the level just before the load (taken after `malloc_trim`, so that memory the set-up freed and the
load reuses counts), in MB. Both ways end with the same codes (checked here; bitwise in
tests/test_qlora.py).

  PYTHONPATH=. python3 benchmarks/qlora_hf_load.py > benchmarks/results_qlora_hf_load_cpu.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CONFIG = dict(vocab_size=4096, d_model=1024, num_layers=4, num_heads=8, num_kv_heads=8, mlp_dim=2816,
              max_seq_len=256, norm_scheme="pre", tie_embeddings=False)
QUANT, BLOCK, ROUNDS = "nf4", 64, 3


def rss_anon_kb() -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def write_checkpoint(directory: str) -> None:
  import jax

  from jaxpt.models.config import ModelConfig
  from jaxpt.models.hf_export import save_hf
  from jaxpt.models.transformer import init_params

  config = ModelConfig(**CONFIG)
  save_hf(init_params(config, jax.random.PRNGKey(0)), config, directory, format="transformers")


def load(directory: str, way: str) -> dict:
  """In this (fresh) process: the QLoRA params of the checkpoint, one `way`; the peak RssAnon above the start."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from jaxpt.engine.builder import lifted, stream_quantizer
  from jaxpt.models import hf
  from jaxpt.models.transformer import TransformerLM
  from jaxpt.nn import lora as lora_lib
  from jaxpt.nn.quant import Quant

  config = hf.read_config(directory)
  spec = lora_lib.LoRA(8, 2.0, quant=Quant(QUANT, BLOCK))
  template = nn.meta.unbox(jax.jit(TransformerLM(config, lora=spec).init)(jax.random.PRNGKey(1),
                                                                           jnp.zeros((1, 1), jnp.int32))["params"])
  quantize = jax.jit(lambda p: lora_lib.quantize_params(p, spec.quant))
  jax.block_until_ready(template)

  def run():
    if way == "whole":
      return quantize(lora_lib.with_adapters(hf.load_params(directory, config), template))
    each = stream_quantizer(template, spec.quant, jnp.float32)
    return lora_lib.with_adapters(lifted(hf.load_params(directory, config, each=each)), template)

  return measured(run)


def measured(run) -> dict:
  """Runs `run()` (-> QLoRA params) sampling RssAnon every millisecond: {peak_mb above the level before, seconds,
  codes_checksum (of every `kernel_q`), params_mb}."""
  import ctypes

  import jax
  import numpy as np

  ctypes.CDLL("libc.so.6").malloc_trim(0)  # the start level without the set-up's freed memory (it may fall below)
  peak, start, done = [0], rss_anon_kb(), threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], rss_anon_kb())
      time.sleep(0.001)

  sampler = threading.Thread(target=sample)
  sampler.start()
  began = time.perf_counter()
  params = jax.block_until_ready(run())
  seconds = time.perf_counter() - began
  done.set()
  sampler.join()
  codes = [np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
           if jax.tree_util.keystr(path).endswith("['kernel_q']")]
  return {"peak_mb": (max(peak[0], rss_anon_kb()) - start) / 1e3, "seconds": seconds,
          "codes_checksum": int(sum(int(c.astype(np.int64).sum()) for c in codes)),
          "params_mb": sum(leaf.nbytes for leaf in jax.tree.leaves(params)) / 1e6}


def main() -> None:
  if len(sys.argv) == 3:  # a child: one load
    print(json.dumps(load(sys.argv[1], sys.argv[2])))
    return
  with tempfile.TemporaryDirectory() as directory:
    write_checkpoint(directory)
    size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)) / 1e6
    runs = {"whole": [], "streamed": []}
    for _ in range(ROUNDS):
      for way in runs:
        done = subprocess.run([sys.executable, __file__, directory, way], capture_output=True, text=True, check=True)
        runs[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
  median = {way: statistics.median(r["peak_mb"] for r in rows) for way, rows in runs.items()}
  checksums = {r["codes_checksum"] for rows in runs.values() for r in rows}
  result = {"benchmark": "qlora_hf_load", "config": {**CONFIG, "quant": QUANT, "block": BLOCK, "rounds": ROUNDS},
            "checkpoint_mb": size, "peak_rss_anon_mb": median,
            "streamed_over_whole": median["streamed"] / median["whole"],
            "same_codes": len(checksums) == 1, "runs": runs}
  json.dump(result, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  main()
