"""tunix 0.1.7's Llama3 at the benchmarks' d512 sizes, shared by the peer scripts that run in the peer venv
(`sampler_peers.py`, `tunix_grpo_update.py`; imports no jaxpt): 8 layers, d_model 512, 8 heads with 4 KV heads of
64, SwiGLU 2048, vocab 8192, fp32, random init (tunix initialises the SwiGLU kernels to zeros: they get random
values like every other weight); and the id tokenizer tunix's Sampler is fed with (also `tunix_reference.py`'s)."""

from __future__ import annotations

D_MODEL, LAYERS, HEADS, KV_HEADS, MLP, VOCAB = 512, 8, 8, 4, 2048, 8192


def d512_llama3(tied: bool):
  """-> (tunix Llama3 with `weight_tying=tied`, its parameter count)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from tunix.models.llama3.model import Llama3, ModelConfig

  cfg = ModelConfig(num_layers=LAYERS, vocab_size=VOCAB, embed_dim=D_MODEL, hidden_dim=MLP, num_heads=HEADS,
                    head_dim=D_MODEL // HEADS, num_kv_heads=KV_HEADS, rope_theta=10_000, norm_eps=1e-6,
                    weight_tying=tied)
  model = Llama3(cfg, rngs=nnx.Rngs(0))
  keys = iter(jax.random.split(jax.random.PRNGKey(1), 3 * LAYERS))
  for layer in model.layers:
    for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
      proj.kernel[...] = 0.02 * jax.random.normal(next(keys), proj.kernel.shape, jnp.float32)
  return model, sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


class IdTokenizer:
  """Space-separated integer ids <-> ids; no BOS (bos_id 0 is falsy to the sampler), pad and EOS -1 (never a token)."""

  def encode(self, text, **_):
    return [int(x) for x in text.split()]

  def decode(self, ids, **_):
    return " ".join(map(str, ids))

  def bos_id(self):
    return 0

  def eos_id(self):
    return -1

  def pad_id(self):
    return -1
