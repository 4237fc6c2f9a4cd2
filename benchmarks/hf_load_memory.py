"""Peak host memory of loading a Hugging Face checkpoint onto 8 devices: jaxpt's streamed load vs whole-file reads.

    python -m benchmarks.hf_load_memory [--layers 8 --d-model 1024 --vocab 32000] [--devices 8]

Writes a random Llama checkpoint (fp32, safetensors, sharded at 200 MB like transformers' save_pretrained) into a
temporary directory, then in a fresh process per method (8 simulated CPU devices, FSDP x TP mesh 4 x 2):
- `jaxpt_streamed`: `jaxpt.models.hf.load_params` into the fsdp_tp shardings (each device's block read through
  safetensors' lazy slices by `jax.make_array_from_callback`);
- `whole_file_then_shard`: what a loader without slicing does: `safetensors.numpy.load_file` of every file (the
  whole model on the host), convert to jaxpt's layout, then `jax.device_put` into the same shardings.
Peak memory = the process's peak RSS (VmHWM) minus its RSS just before the load; `ratio` = that / the checkpoint's
bytes; `load_seconds` the wall time of the load. On CPU the "devices" live in host memory, so one shard set
(every device's block, what this host holds) is the whole model: a ratio of 1.0 is the floor, 1.5 the issue's
bound. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CHILD = r"""
import json, os, sys
import jax
import numpy as np
from jax.sharding import NamedSharding

def rss_kb(field):
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

from jaxpt.models import hf, hf_layout
from jaxpt.parallel import rules as rules_lib
from jaxpt.parallel.mesh import MeshConfig, make_mesh
path, method = sys.argv[1], sys.argv[2]
mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
config = hf.read_config(path)
jax.block_until_ready(jax.device_put(np.zeros(1)))  # the runtime is up before the baseline
with open("/proc/self/clear_refs", "w") as f:
  f.write("5")  # reset VmHWM to the current RSS
before = rss_kb("VmRSS")
import time
start = time.perf_counter()
if method == "jaxpt_streamed":
  params = hf.load_params(path, config, mesh=mesh, rules="fsdp_tp")
else:
  from safetensors.numpy import load_file
  import flax.linen as nn
  import jax.numpy as jnp
  from jaxpt.models.transformer import TransformerLM
  from jaxpt.parallel.sharding import param_shardings
  tensors = {}
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(path, name)))
  boxed = jax.eval_shape(lambda: TransformerLM(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32)))
  shardings = param_shardings(boxed["params"], mesh, rules_lib.get_rules("fsdp_tp"))
  abstract = nn.meta.unbox(boxed["params"])
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  arrays = []
  for (key_path, leaf), sharding in zip(leaves, treedef.flatten_up_to(shardings)):
    names = tuple(str(getattr(k, "key", k)) for k in key_path)
    source, stacked = hf_layout.hf_source(names, leaf.ndim)
    layer_shape = leaf.shape[1:] if stacked else leaf.shape
    whole = tuple(slice(None) for _ in layer_shape)
    if stacked:
      value = np.stack([hf_layout.read_slice(tensors[source.name.format(layer=l)], source, layer_shape, whole)
                        for l in range(leaf.shape[0])])
    else:
      value = hf_layout.read_slice(tensors[source.name], source, layer_shape, whole)
    arrays.append(jax.device_put(value, sharding))
  params = jax.tree_util.tree_unflatten(treedef, arrays)
jax.block_until_ready(params)
seconds = time.perf_counter() - start
peak = rss_kb("VmHWM")
leaf = jax.tree.leaves(params)[0]
print(json.dumps({"peak_increase_bytes": (peak - before) * 1024, "load_seconds": round(seconds, 2),
                  "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
                  "example_sharding": str(leaf.sharding.spec), "devices": len(leaf.sharding.device_set)}))
"""


def write_checkpoint(path: str, layers: int, d_model: int, vocab: int, shard_bytes: int = 200 * 2**20) -> int:
  """A random Llama checkpoint (GQA 2:1, mlp 4 d, untied) in transformers' layout; returns its tensor bytes."""
  from safetensors.numpy import save_file

  heads, kv_heads, mlp = d_model // 64, d_model // 128, 4 * d_model
  config = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=d_model,
                intermediate_size=mlp, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, max_position_embeddings=2048, rms_norm_eps=1e-5,
                tie_word_embeddings=False, rope_theta=10000.0, hidden_act="silu", dtype="float32")
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  rng = np.random.default_rng(0)
  shapes = {"model.embed_tokens.weight": (vocab, d_model), "model.norm.weight": (d_model,),
            "lm_head.weight": (vocab, d_model)}
  for l in range(layers):
    p = f"model.layers.{l}."
    shapes.update({
        p + "input_layernorm.weight": (d_model,), p + "post_attention_layernorm.weight": (d_model,),
        p + "self_attn.q_proj.weight": (heads * 64, d_model), p + "self_attn.k_proj.weight": (kv_heads * 64, d_model),
        p + "self_attn.v_proj.weight": (kv_heads * 64, d_model), p + "self_attn.o_proj.weight": (d_model, heads * 64),
        p + "mlp.gate_proj.weight": (mlp, d_model), p + "mlp.up_proj.weight": (mlp, d_model),
        p + "mlp.down_proj.weight": (d_model, mlp)})
  files, buffer, size, total = {}, {}, 0, 0
  for name, shape in shapes.items():
    array = rng.standard_normal(shape, dtype=np.float32) * 0.02
    if buffer and size + array.nbytes > shard_bytes:
      files[f"part{len(files)}"] = buffer
      buffer, size = {}, 0
    buffer[name] = array
    size += array.nbytes
    total += array.nbytes
  files[f"part{len(files)}"] = buffer
  weight_map = {}
  for i, (_, tensors) in enumerate(files.items()):
    file = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
    save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})
    weight_map.update({name: file for name in tensors})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
  return total


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=8)
  parser.add_argument("--d-model", type=int, default=1024)
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--devices", type=int, default=8)
  args = parser.parse_args()
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}", JAX_PLATFORMS="cpu")
  with tempfile.TemporaryDirectory() as path:
    checkpoint_bytes = write_checkpoint(path, args.layers, args.d_model, args.vocab)
    results = {"checkpoint_bytes": checkpoint_bytes, "devices": args.devices, "mesh": "fsdp=4 x tensor=2",
               "model": dict(layers=args.layers, d_model=args.d_model, vocab=args.vocab)}
    for method in ("jaxpt_streamed", "whole_file_then_shard"):
      out = subprocess.run([sys.executable, "-c", CHILD, path, method], env=env, capture_output=True, text=True,
                           check=True)
      row = json.loads(out.stdout.strip().splitlines()[-1])
      row["ratio"] = round(row["peak_increase_bytes"] / checkpoint_bytes, 3)
      results[method] = row
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
