"""Peak host memory of a QLoRA run's start from a jaxpt run (`init_from=WORKDIR`), one JSON object on stdout: the
float base restored whole and then quantized (how `Training.init_state` did it) vs restored one projection at a time,
each kernel quantized before the next is read (`init_from.run_params(each=builder.stream_quantizer(...))`, what it
does now).

The model of benchmarks/qlora_hf_load.py (d 1024, 4 layers, mlp 2816, vocab 4096: 201 MB of float32 kernels that
QLoRA quantizes, 34 MB of embeddings; layers scanned, so a kernel holds all 4 layers: the largest, wi_gate / wi_up /
wo, 46 MB) with random weights is saved once as a run's checkpoint in a temporary directory; each way runs in its own
fresh process (alternating, `ROUNDS` each) and samples its anonymous resident memory as that benchmark does; the
figure is the peak above the level just before the load, in MB. Both ways end with the same codes (checked here;
bitwise in tests/test_qlora.py).

  PYTHONPATH=. python3 benchmarks/qlora_run_load.py > benchmarks/results_qlora_run_load_cpu.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.qlora_hf_load import BLOCK, CONFIG, QUANT, ROUNDS, measured


def write_run(workdir: str) -> None:
  import jax
  import optax

  from jaxpt.engine.checkpoint import Checkpointer
  from jaxpt.engine.state import TrainState
  from jaxpt.models.config import ModelConfig
  from jaxpt.models.transformer import init_params

  checkpointer = Checkpointer(workdir, async_save=False)
  params = init_params(ModelConfig(**CONFIG), jax.random.PRNGKey(0))
  checkpointer.save(TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(0)))
  checkpointer.close()


def load(workdir: str, way: str) -> dict:
  """In this (fresh) process: the QLoRA params of the run's checkpoint, one `way`; the peak RssAnon above the
  start."""
  import jax
  import jax.numpy as jnp

  from jaxpt.engine.builder import lifted, stream_quantizer
  from jaxpt.engine.init_from import run_params
  from jaxpt.models.config import ModelConfig
  from jaxpt.models.transformer import TransformerLM, init_params
  from jaxpt.nn import lora as lora_lib
  from jaxpt.nn.quant import Quant

  config, spec = ModelConfig(**CONFIG), lora_lib.LoRA(8, 2.0, quant=Quant(QUANT, BLOCK))
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = lambda lora: jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=one),
      jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), model=TransformerLM(config, lora=lora))))
  template, floats = shapes(spec), shapes(None)
  adapters = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), lora_lib.adapter_params(template))
  quantize = jax.jit(lambda p: lora_lib.quantize_params(p, spec.quant))
  jax.block_until_ready(adapters)

  def run():
    if way == "whole":
      return quantize(lora_lib.with_adapters(run_params(workdir, config, floats), adapters))
    each = stream_quantizer(template, spec.quant, jnp.float32)
    return lora_lib.with_adapters(lifted(run_params(workdir, config, floats, each=each)), adapters)

  return measured(run)


def main() -> None:
  if len(sys.argv) == 3:  # a child: one load
    print(json.dumps(load(sys.argv[1], sys.argv[2])))
    return
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
  with tempfile.TemporaryDirectory() as workdir:
    write_run(workdir)
    runs = {"whole": [], "streamed": []}
    for _ in range(ROUNDS):
      for way in runs:
        done = subprocess.run([sys.executable, __file__, workdir, way], capture_output=True, text=True, check=True,
                              env=env)
        runs[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
  median = {way: statistics.median(r["peak_mb"] for r in rows) for way, rows in runs.items()}
  seconds = {way: statistics.median(r["seconds"] for r in rows) for way, rows in runs.items()}
  checksums = {r["codes_checksum"] for rows in runs.values() for r in rows}
  result = {"benchmark": "qlora_run_load", "config": {**CONFIG, "quant": QUANT, "block": BLOCK, "rounds": ROUNDS},
            "peak_rss_anon_mb": median, "streamed_over_whole": median["streamed"] / median["whole"],
            "seconds": seconds, "same_codes": len(checksums) == 1, "runs": runs}
  json.dump(result, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  main()
