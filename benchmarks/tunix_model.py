"""tunix 0.1.7's Llama3 at the benchmarks' sizes, shared by the scripts that run in a tunix venv
(`sampler_peers.py`, `train_peers.py`, `tunix_grpo_update.py`, `tunix_ppo_update.py`, `tunix_reference.py`;
imports no jaxpt): by default 8 layers, d_model 512, 8 heads with 4 KV heads of 64, SwiGLU 2048 (4 * d_model),
vocab 8192, fp32, random init (tunix initialises the SwiGLU kernels to zeros: they get random values like every
other weight); its train step (`train_step`); and the id tokenizer tunix's Sampler is fed with."""

from __future__ import annotations

D_MODEL, LAYERS, HEADS, KV_HEADS, MLP, VOCAB = 512, 8, 8, 4, 2048, 8192


def llama3(tied: bool, d_model: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS, kv_heads: int = KV_HEADS):
  """-> (tunix Llama3 with `weight_tying=tied`, its parameter count); head_dim d_model / heads, SwiGLU
  4 * d_model."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from tunix.models.llama3.model import Llama3, ModelConfig

  cfg = ModelConfig(num_layers=layers, vocab_size=VOCAB, embed_dim=d_model, hidden_dim=4 * d_model,
                    num_heads=heads, head_dim=d_model // heads, num_kv_heads=kv_heads, rope_theta=10_000,
                    norm_eps=1e-6, weight_tying=tied)
  model = Llama3(cfg, rngs=nnx.Rngs(0))
  keys = iter(jax.random.split(jax.random.PRNGKey(1), 3 * layers))
  for layer in model.layers:
    for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
      proj.kernel[...] = 0.02 * jax.random.normal(next(keys), proj.kernel.shape, jnp.float32)
  return model, sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def train_step(model, batch: int = 8, seq: int = 256):
  """-> step(): one jitted AdamW (optax: global-norm clip 1.0, lr 1e-3, b2 0.95, weight decay 0.1) step of
  `model`'s params on next-token cross-entropy over a fixed random `batch` x `seq` batch per call, the params and
  optimizer state carried between calls (fp32, a copy: `model` is left as it is); returns the loss, blocked on."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx

  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (batch, seq + 1), dtype=np.int32))
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((seq, seq), jnp.bool_)), (batch, seq, seq))

  def loss_fn(p):
    logits, _ = nnx.merge(graphdef, p)(inputs, positions, None, causal)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  @jax.jit
  def update(p, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, loss

  state = {"params": jax.tree.map(jnp.copy, params), "opt": optimizer.init(params)}

  def step():
    state["params"], state["opt"], loss = update(state["params"], state["opt"])
    return loss.block_until_ready()

  return step


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
