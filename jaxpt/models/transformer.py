"""Decoder-only transformer LM over any residual scheme.

    streams_0 = (E[tokens],) * num_streams                     [batch, seq, d_model] each (1, 2 siamese, n HC)
    streams_L = blocks_{L-1} o ... o blocks_0 (streams_0)      (nn.scan over layers, c_l scanned along)
    hidden    = OutputMerge(streams_L)                          final-norm hidden states
    logits    = hidden E^T (tied) or hidden W_head              [batch, seq, vocab], float32

Parameters carry logical axis names (`vocab`, `embed`, `mlp`, `heads`, `kv_heads`, `kv`, `layers`, `expert`);
`init_params` returns them unboxed. With `num_experts > 0` the MLPs are routed experts that sow their auxiliary
losses into the `losses` collection: `apply(..., mutable=["losses"])` returns them (stacked [layers] under nn.scan;
`jaxpt.nn.moe.aux_losses` averages them over the layers); without `mutable` they are dropped.

Decoding (`jaxpt.rl.sampler`): called with a `KVCache` (`init_cache`) and a `cache_index`, the model writes the new
tokens' segment ids and, layer by layer, K/V into slots cache_index .. + seq - 1 (dynamic_update_slice), attends
over the cache's filled slots (and its shared `prefix`, if any: read, never written) and returns the updated cache
as its last output. Prefill is one such call with the whole prompt on an empty cache, decode one per token. With a
`PagedKVCache` instead (`jaxpt.rl.engine`), one token per row is written into each layer's page pool and attends
over the row's pages (positions given, cache_index unused). Remat
settings are ignored when decoding. Unrolled layers read their weights and cache buffers in place; scanned layers
slice both out of stacked arrays every step (copies), so the sampler decodes with unrolled layers
(`unstack_layers`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.models.config import ModelConfig
from jaxpt.nn.attention import KVCache, LayerCache, write_slots
from jaxpt.nn.paged_cache import PagedKVCache
from jaxpt.models.blocks import BLOCKS, RESIDUAL_AXES, OutputMerge
from jaxpt.nn.dense import Dense, matmul
from jaxpt.nn.lora import LoRA
from jaxpt.registry import Registry

CHECKPOINT_POLICIES = {  # the jax.checkpoint policy of each ModelConfig.remat mode but "none" (no remat)
    "full": None,  # save nothing, recompute the whole block
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class DecoderStack(nn.Module):
  """`num_layers` blocks of the configured scheme: streams -> streams.

  `blocks` maps the scheme to its block class: the LM's `BLOCKS`, or DiT's adaLN-Zero blocks
  (`jaxpt.models.dit`), whose second input is the conditioning c [batch, d_model] where the LM's blocks read
  `positions`: every layer reads it unchanged.
  With `cache` (a `KVCache`) and `cache_index`: -> (streams, cache with the new tokens' K/V and segment ids written
  at slots cache_index ..); `segment_ids` [batch, seq] default to 1. `lora`: every block's adapters (None: none).
  """

  config: ModelConfig
  deterministic: bool = True
  blocks: Registry = BLOCKS
  lora: LoRA | None = None

  @nn.compact
  def __call__(self, streams, positions, segment_ids=None, cache: KVCache | None = None, cache_index=None):
    cfg = self.config
    block = self.blocks.get(cfg.norm_scheme)
    if cache is None:
      if cfg.remat != "none":
        block = nn.remat(block, policy=CHECKPOINT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
      return self.stack(block, streams, positions, segment_ids)
    if isinstance(cache, PagedKVCache):  # one token per row over page pools (jaxpt.rl.engine): unrolled layers only
      if cfg.scan_layers:
        raise ValueError("DecoderStack: a paged cache decodes with unrolled layers (scan_layers=False)")
      streams, (key, value) = self.stack(block, streams, positions, segment_ids,
                                         [cache.layer(layer) for layer in range(cfg.num_layers)])
      return streams, cache.replace(key_pages=tuple(key), value_pages=tuple(value))
    if segment_ids is None:
      segment_ids = jnp.ones(streams[0].shape[:2], jnp.int32)
    cache_index = jnp.asarray(cache_index, jnp.int32)
    cache = cache.replace(segment_ids=write_slots(cache.segment_ids, segment_ids, cache_index, axis=1))
    if cfg.scan_layers:  # the per-layer buffers go through the scan stacked: a copy each call
      layers = [cache.layer(layer, cache_index) for layer in range(cfg.num_layers)]
      layers = jax.tree.map(lambda *leaves: jnp.stack(leaves), *layers)
      layers = layers.replace(segment_ids=cache.segment_ids, index=cache_index, prefix_segment_ids=(
          None if cache.prefix is None else cache.prefix.segment_ids))
    else:
      layers = [cache.layer(layer, cache_index) for layer in range(cfg.num_layers)]
    streams, (key, value) = self.stack(block, streams, positions, segment_ids, layers)
    return streams, cache.replace(key=tuple(key), value=tuple(value))

  def stack(self, block, streams, positions, segment_ids, cache=None):
    """-> streams, or (streams, (keys, values)) with one entry per layer when `cache` (a stacked `LayerCache` for
    scanned layers, a list of them for unrolled ones) is given."""
    cfg = self.config
    adapters = {} if self.lora is None else {"lora": self.lora}  # DiT's blocks take none
    if cfg.scan_layers:
      cache_axes = nn.broadcast if cache is None else LayerCache(0, 0, nn.broadcast, nn.broadcast, 0, 0, nn.broadcast)
      scanned = nn.scan(block, variable_axes={"params": 0, "losses": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(0, nn.broadcast, nn.broadcast, cache_axes), length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      streams, kv = scanned(cfg, self.deterministic, name="layers", **adapters)(
          streams, jnp.arange(cfg.num_layers), positions, segment_ids, cache)
      return streams if cache is None else (streams, kv)
    kvs = []
    for layer in range(cfg.num_layers):
      streams, kv = block(cfg, self.deterministic, name=f"layers_{layer}", **adapters)(
          streams, jnp.asarray(layer), positions, segment_ids, None if cache is None else cache[layer])
      kvs.append(kv)
    return streams if cache is None else (streams, tuple(zip(*kvs)))


def init_cache(config: ModelConfig, batch: int, max_len: int) -> KVCache:
  """An empty `KVCache` for `max_len` positions of `batch` rows, in the compute dtype."""
  return KVCache.create(config.num_layers, batch, max_len, config.num_kv_heads, config.resolved_head_dim,
                        jnp.dtype(config.dtype))


class TransformerLM(nn.Module):
  """The LM of the module docstring; `lora` (`jaxpt.nn.lora.LoRA`) adds adapters to the projections it targets
  (the same model with lora=None reads the base params, adapters off: `jaxpt.nn.lora.base_params`)."""

  config: ModelConfig
  lora: LoRA | None = None

  @nn.compact
  def __call__(self, tokens, positions=None, segment_ids=None, deterministic: bool = True,
               return_hidden: bool = False, cache: KVCache | None = None, cache_index=None,
               last_logits_only: bool = False):
    """tokens, positions, segment_ids: int [batch, seq] -> logits float32 [batch, seq, vocab]
    (and the final-norm hidden states [batch, seq, d_model] when `return_hidden`). With `last_logits_only` the
    logits are those of the last column alone, [batch, 1, vocab] (a prefill needs no others; hidden stays whole).

    Decoding: with `cache` (`init_cache`) and `cache_index` (int scalar, or int [batch]: the slot of the first new
    token) the output gains the updated cache as its last element; segment_ids default to 1 and positions to
    cache_index + 0 .. seq - 1.
    """
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    if positions is None:
      start = 0 if cache is None else jnp.reshape(jnp.asarray(cache_index, jnp.int32), (-1, 1))
      positions = jnp.broadcast_to(start + jnp.arange(tokens.shape[1]), tokens.shape)
    embedding = self.param("embedding",
                           nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
                           (cfg.vocab_size, cfg.d_model), jnp.dtype(cfg.param_dtype))
    x = jnp.take(embedding, tokens, axis=0).astype(dtype)
    x = nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)
    x = nn.with_logical_constraint(x, RESIDUAL_AXES)
    streams = (x,) * cfg.num_streams
    if cache is None:
      streams = DecoderStack(cfg, deterministic, lora=self.lora, name="decoder")(streams, positions, segment_ids)
    else:
      streams, cache = DecoderStack(cfg, deterministic, lora=self.lora, name="decoder")(
          streams, positions, segment_ids, cache, cache_index)
    hidden = OutputMerge(cfg, name="output")(streams)
    projected = hidden[:, -1:] if last_logits_only else hidden
    if cfg.tie_embeddings:  # one 2-D matmul [tokens, d] x [d, vocab] (see jaxpt.nn.dense)
      flat = projected.reshape(-1, cfg.d_model)
      logits = matmul(flat, embedding.astype(dtype).T, jnp.float32)
      logits = logits.reshape(projected.shape[:-1] + (cfg.vocab_size,))
    else:
      logits = Dense((cfg.vocab_size,), ("embed", "vocab"), dtype=dtype, param_dtype=jnp.dtype(cfg.param_dtype),
                     name="head")(projected)
    logits = nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))
    outputs = (logits, hidden) if return_hidden else (logits,)
    outputs += () if cache is None else (cache,)
    return outputs if len(outputs) > 1 else logits


def init_params(config: ModelConfig, rng, seq_len: int = 8, model: TransformerLM | None = None):
  """Unboxed float parameters of `TransformerLM(config)` (or of `model`, e.g. one with LoRA) (a pytree of arrays)."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return nn.meta.unbox((model or TransformerLM(config)).init(rng, tokens)["params"])


def param_count(params) -> int:
  return sum(int(p.size) for p in jax.tree_util.tree_leaves(params))


def unstack_layers(params, num_layers: int):
  """Parameters of a `scan_layers=True` model (`decoder/layers`, leaves `[layers, ...]`) in the unrolled layout
  (`decoder/layers_{l}`) that the same model with `scan_layers=False` reads."""
  stacked = params["decoder"]["layers"]
  layers = {f"layers_{l}": jax.tree_util.tree_map(lambda leaf, l=l: leaf[l], stacked) for l in range(num_layers)}
  return dict(params, decoder=layers)
