"""Multi-head self-attention (causal or bidirectional) with grouped KV heads, RoPE and optional per-head Q/K/V RMSNorm.

    q, k, v = x W_q, x W_k, x W_v                 q: [B, S, H, D]   k, v: [B, S, H_kv, D]
    (optional) q, k, v += b_q, b_k, b_v           `qkv_bias` (Qwen2)
    (optional) q, k, v <- RMSNorm_head(q, k, v)   per head, over D (before RoPE)
    q, k <- RoPE(q, k; positions)                 optionally Llama-3-scaled (`jaxpt.nn.rope`); off with rope=False
    A = softmax(q k^T / sqrt(D) + mask) v         query head h reads KV head h // (H / H_kv)
    out = A W_o (+ b_o with `out_bias`)           [B, S, d_model]

The mask is causal (by index; `causal=False`: bidirectional, every token reads every token, as in ViT/DiT) and,
when `segment_ids` are given, block-diagonal over packed documents. Vision models add their positions to the
inputs (`jaxpt.nn.vision`) and run with `causal=False, rope=False`.

Decoding: with a layer's `LayerCache` the call first writes the new tokens' K/V into the layer's preallocated
buffers at slots index .. index + n - 1 (dynamic_update_slice, in place), then attends over the whole buffer:
query i (slot index + i) reads slot j iff j <= index + i and slot j holds a token of the query's segment
(empty slots have segment 0). Prefill is the same call with the whole prompt at index 0; decode one token a call.

Shared prefix (`KVCache.prefix`, the sampler's shared-prompt prefill): a cache of B rows may also read a block of
K/V held once for each group of G = B / P consecutive rows ([P, kv_heads, L, head_dim]: row b reads prefix row
b // G). Its slots come before every slot of the per-row buffers (a prompt, then each row's own response), so a
query reads prefix slot j iff it holds the query's segment; the softmax runs over the prefix and the row's own
slots together (`grouped_attention`'s `prefix`).

Paged decoding (`PagedLayerCache`, the rollout engine's cache, `jaxpt.rl.engine`): a layer's K/V live in a pool of
fixed-size pages shared by all rows, laid out head-major [kv_heads, num_pages, page_size, head_dim] (the layout of
JAX's Pallas paged attention kernel); each row names its pages in a page table and holds its tokens contiguously:
token j of row b at slot j % page_size of page page_table[b, j // page_size] (rows may share a prompt's full pages;
its last, partly filled page is copied into each row's own). The call writes the one new token's K/V into page
write_page[b] at offset write_offset[b] (a scatter, in place), then attends over the row's first lengths[b] slots:
by one of JAX's Pallas kernels (TPU, GPU), which read the pages in place (`pallas_paged_attention`), or by gathering
the pages in table order (the pure-JAX gather path). Gathering costs what it copies, so a cache may also split its
rows into chunks that each gather only a prefix of their tables (`widths`, `buckets`: `paged_chunk_attention`); the
rollout engine sorts its slots by the pages they need, so that a chunk of short rows does not gather a long row's
width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from jaxpt.nn.dense import Dense
from jaxpt.nn.lora import LoRA
from jaxpt.nn.norms import RMSNorm
from jaxpt.nn.rope import Llama3Scaling, apply_rope


def attention_mask(seq_len: int, segment_ids=None, causal: bool = True):
  """Boolean mask `[batch or 1, q, k]`: True where query q may attend to key k (k <= q when `causal`)."""
  mask = jnp.ones((seq_len, seq_len), dtype=bool)
  mask = (jnp.tril(mask) if causal else mask)[None]
  if segment_ids is None:
    return mask
  return mask & (segment_ids[:, :, None] == segment_ids[:, None, :])


def _bias(mask, groups: int):
  """bool [B or 1, n, S] -> float32 [B or 1, 1, n*G, S]: 0 where allowed, else the most negative float (additive:
  its gradient is free, unlike a select)."""
  return jnp.where(jnp.repeat(mask, groups, axis=1), 0.0, jnp.finfo(jnp.float32).min)[:, None]


def _attend(rows, k, v, mask, groups: int, prefix=None):
  """rows: [B, H_kv, n*G, D] (pre-scaled queries, row i*G + g = query i of group g); k, v: [B, H_kv, S, D];
  mask: bool [B or 1, n, S] -> softmax(rows k^T + bias) v  [B, H_kv, n*G, D] (see `_bias`).

  With `prefix` = (k_p, v_p [P, H_kv, L, D], mask_p bool [B, n, L]): row b also reads the L slots of prefix row
  b // (B / P), placed before its own S: one softmax over [prefix scores, own scores], and the values of each
  block summed (each prefix row is read once for its B / P rows: the queries of a group are one matmul)."""
  scores = jnp.einsum("bhqd,bhkd->bhqk", rows, k, preferred_element_type=jnp.float32) + _bias(mask, groups)
  if prefix is None:
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)  # float32 result: XLA:CPU reads a bf16 v as it is
    return out.astype(v.dtype)
  k_p, v_p, mask_p = prefix
  batch, _, width, _ = rows.shape
  shared, length = k_p.shape[0], k_p.shape[2]
  group = batch // shared

  def to_groups(x):  # [B, h, W, X] -> [P, h, G*W, X]: a group's rows as the queries of one matmul per prompt
    return x.reshape((shared, group) + x.shape[1:]).swapaxes(1, 2).reshape(shared, x.shape[1], group * width, -1)

  def to_rows(x):  # the inverse: [P, h, G*W, X] -> [B, h, W, X]
    return x.reshape(shared, x.shape[1], group, width, -1).swapaxes(1, 2).reshape(batch, x.shape[1], width, -1)

  prefix_scores = jnp.einsum("bhqd,bhkd->bhqk", to_groups(rows), k_p, preferred_element_type=jnp.float32)
  prefix_scores = prefix_scores + to_groups(_bias(mask_p, groups))
  probs = jax.nn.softmax(jnp.concatenate([prefix_scores, to_groups(scores)], axis=-1), axis=-1).astype(v.dtype)
  out = to_rows(jnp.einsum("bhqk,bhkd->bhqd", probs[..., :length], v_p, preferred_element_type=jnp.float32))
  out = out + jnp.einsum("bhqk,bhkd->bhqd", to_rows(probs[..., length:]), v, preferred_element_type=jnp.float32)
  return out.astype(v.dtype)


def grouped_attention(q, k, v, mask, query_chunk: int = 0, prefix=None):
  """q: [B, n, H, D]; k, v: head-major [B, H_kv, S, D]; mask: bool [B or 1, n, S] -> [B, n, H, D].
  Query head h reads KV head h // G, G = H / H_kv. `prefix` (decoding, no query_chunk): a shared block of K/V read
  before k, v (`_attend`).

  Computed head-major, the G query heads of a KV head stacked as rows of one matmul. With `query_chunk` > 0 the
  mask must be causal with n == S: queries are taken `query_chunk` at a time and chunk c reads only keys
  < (c + 1) * query_chunk, skipping the blocks above the diagonal (forward + backward at seq 256 on CPU: 0.56x
  the time of query_chunk 0 for chunks of 64, `benchmarks/attention.py`)."""
  batch, seq, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[1]
  groups = num_heads // num_kv_heads
  rows = (q * jnp.asarray(head_dim ** -0.5, q.dtype)).reshape(batch, seq, num_kv_heads, groups, head_dim)
  rows = rows.transpose(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, seq * groups, head_dim)
  if prefix is not None and query_chunk > 0:
    raise ValueError("grouped_attention: a shared prefix is read by decoding, without query chunks")
  if query_chunk <= 0 or seq <= query_chunk:
    out = _attend(rows, k, v, mask, groups, prefix)
  else:
    chunks = []
    for start in range(0, seq, query_chunk):
      stop = min(start + query_chunk, seq)
      chunks.append(_attend(rows[:, :, start * groups:stop * groups], k[:, :, :stop], v[:, :, :stop],
                            mask[:, start:stop, :stop], groups))
    out = jnp.concatenate(chunks, axis=2)
  out = out.reshape(batch, num_kv_heads, seq, groups, head_dim).transpose(0, 2, 1, 3, 4)
  return out.reshape(batch, seq, num_heads, head_dim)


def gather_pages(pages, page_table):
  """pages [H_kv, num_pages, page_size, D], page_table int [B, n] -> [B, H_kv, n * page_size, D]: row b's pages in
  the order of its table (a page id may appear in several rows: a prompt's pages shared by its rollouts)."""
  rows = jnp.take(pages, page_table, axis=1)  # [H_kv, B, n, page_size, D]
  heads, batch, count, size, dim = rows.shape
  return rows.swapaxes(0, 1).reshape(batch, heads, count * size, dim)


def paged_attention(q, k_pages, v_pages, page_table, lengths):
  """Attention of new tokens over a paged KV cache, the pure-JAX gather path.

  q: [B, n, H, D] the queries of each row's last n tokens, whose K/V are already in its pages; k_pages, v_pages:
  [H_kv, num_pages, page_size, D]; page_table int [B, pages_per_row] (a row's unused entries may name any page);
  lengths int [B]: the tokens row b holds (its new ones included), at slots 0 .. lengths[b] - 1 of its pages in
  table order (so rows may share a prompt's full pages; its last, partly filled page is copied into each row's
  own). Query i of row b sits at slot lengths[b] - n + i and reads the slots up to it -> [B, n, H, D]."""
  k, v = gather_pages(k_pages, page_table), gather_pages(v_pages, page_table)
  num_new = q.shape[1]
  query_slots = jnp.reshape(lengths, (-1, 1)) - num_new + jnp.arange(num_new)  # [B, n]
  mask = jnp.arange(k.shape[2])[None, None, :] <= query_slots[:, :, None]
  return grouped_attention(q, k, v, mask)


def chunk_bounds(batch: int, chunks: int) -> list[int]:
  """Row boundaries of `chunks` near-equal consecutive chunks of a batch: chunk j is rows bounds[j] .. bounds[j+1]-1."""
  return [batch * j // chunks for j in range(chunks + 1)]


def paged_chunk_attention(q, k_pages, v_pages, page_table, lengths, buckets, widths: tuple):
  """`paged_attention` of one new token per row, chunk by chunk of rows.

  q: [B, 1, H, D]; k_pages, v_pages: [H_kv, num_pages, page_size, D]; page_table int [B, n]; lengths int [B];
  buckets int [C]: rows `chunk_bounds(B, C)[j] ..` gather only their tables' first widths[buckets[j]] entries (a
  `lax.switch` over the static `widths`, each <= n), which must hold their lengths -> [B, 1, H, D], the same
  attention as over whole tables (the slots left out have weight 0)."""
  def attend(width):
    def branch(q, table, lengths):
      return paged_attention(q, k_pages, v_pages, table[:, :width], lengths)
    return branch

  bounds = chunk_bounds(q.shape[0], buckets.shape[0])
  outs = [lax.switch(buckets[j], [attend(width) for width in widths], q[lo:hi], page_table[lo:hi], lengths[lo:hi])
          for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))]
  return jnp.concatenate(outs, axis=0)


PALLAS_BLOCK_SLOTS = 512  # the TPU kernel: the most KV slots one block reads (pages_per_compute_block * page_size)
PALLAS_GPU_SPLITS, PALLAS_GPU_BLOCK_PAGES = 16, 8  # the GPU kernel's defaults: k_splits, pages_per_compute_block
PAGED_KERNELS = ("gather", "pallas_tpu", "pallas_gpu")


def power_of_two_at_most(n: int) -> int:
  """The largest power of two <= n (n >= 1)."""
  return 1 << (max(1, n).bit_length() - 1)


def pallas_blocks(kernel: str, table_width: int, page_size: int) -> tuple[int, int, int]:
  """-> (splits, pages per block, padded table width) of a Pallas kernel for tables of `table_width` pages: the GPU
  kernel's k_splits partitions of blocks of a power of two pages (Triton loads power-of-two shapes) up to its
  defaults; the TPU kernel one partition of the fewest blocks of at most PALLAS_BLOCK_SLOTS slots. The width is padded
  up to a multiple of splits x block (the padding names the sink, page 0, and lies past every row's length)."""
  if kernel == "pallas_gpu":
    block = power_of_two_at_most(min(PALLAS_GPU_BLOCK_PAGES, table_width))
    splits = min(PALLAS_GPU_SPLITS, -(-table_width // block))
  else:  # as few blocks as hold the table, as even as can be
    blocks = -(-table_width // max(1, PALLAS_BLOCK_SLOTS // page_size))
    block, splits = -(-table_width // blocks), 1
  return splits, block, -(-table_width // (splits * block)) * splits * block


def pallas_paged_attention(q, k_pages, v_pages, page_table, lengths, kernel: str = "pallas_tpu",
                           interpret: bool | None = None):
  """`paged_attention` of one new token per row by one of JAX's Pallas paged attention kernels, which read each
  row's first lengths[b] slots in place (blocks of pages, an online softmax) instead of gathering them; q:
  [B, 1, H, D], the rest as `paged_attention` -> [B, 1, H, D]. The table is padded to the kernel's blocks
  (`pallas_blocks`).

  "pallas_tpu": `jax.experimental.pallas.ops.tpu.paged_attention` (Mosaic); off TPU it runs in Pallas's TPU
  interpret mode, whose matmuls take the TPU's default precision (bf16 products), as on the chip. "pallas_gpu":
  `jax.experimental.pallas.ops.gpu.paged_attention` (Triton: page_size and head_dim must be powers of two); off GPU
  in Pallas's interpret mode, in float32. Interpret mode is how the tests check both here: slow, not for use.
  `interpret` (None: off the kernel's own backend) decides it explicitly: False lowers the kernel for its chip from
  anywhere (`jax.export` for TPU or CUDA from a CPU, as tests/test_kernels_lowering.py does)."""
  from jax.experimental.pallas import tpu as pltpu  # imported on first use: most runs never need Pallas
  from jax.experimental.pallas.ops.gpu import paged_attention as gpu
  from jax.experimental.pallas.ops.tpu import paged_attention as tpu

  if kernel not in PAGED_KERNELS[1:]:
    raise ValueError(f"kernel={kernel!r}: must be one of {PAGED_KERNELS[1:]}")
  scaled = q[:, 0] * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)  # the kernels do not scale their queries
  splits, block, width = pallas_blocks(kernel, page_table.shape[1], k_pages.shape[2])
  table = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, width - page_table.shape[1])))
  lengths = lengths.astype(jnp.int32)
  if interpret is None:
    interpret = jax.default_backend() != kernel.removeprefix("pallas_")
  if kernel == "pallas_gpu":
    return gpu.paged_attention(scaled, k_pages, v_pages, table, lengths, k_splits=splits,
                               pages_per_compute_block=block, interpret=interpret)[:, None]
  call = lambda: tpu.paged_attention(scaled, k_pages, v_pages, lengths, table, pages_per_compute_block=block)
  if not interpret:
    return call()[:, None]
  with pltpu.force_tpu_interpret_mode():
    return call()[:, None]


def library_attention(q, k, v, segment_ids=None, causal: bool = True):
  """q: [B, S, H, D]; k, v: [B, S, H_kv, D] (sequence-major) -> [B, S, H, D] by `jax.nn.dot_product_attention`:
  softmax(q k^T / sqrt(D) + mask) v with the causal mask and, given segment_ids [B, S], attention only within a
  segment. On an NVIDIA GPU, in bf16 or fp16, without segments: cuDNN's fused attention (which skips the blocks
  above the diagonal); anywhere else XLA's (jax's default, `implementation=None`, is XLA's everywhere)."""
  if segment_ids is None:
    mask = None
  else:
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  fused = cudnn_attention_applies(q.dtype, segment_ids is not None)
  return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal,
                                      implementation="cudnn" if fused else "xla")


def cudnn_attention_applies(dtype, packed: bool, backend: str | None = None) -> bool:
  """Whether cuDNN's fused attention serves a call: an NVIDIA GPU (`backend`, default jax's), bf16 or fp16, and no
  packed segments (its mask would be dense)."""
  backend = backend or jax.default_backend()
  return backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and not packed


def write_slots(buffer, new, index, axis: int):
  """dynamic_update_slice of `new` into `buffer` (batch on axis 0) at `index` along `axis`: int scalar shared by the
  batch, or int [batch], one per row."""
  new = new.astype(buffer.dtype)
  index = jnp.asarray(index, jnp.int32)
  if index.ndim == 0:
    return lax.dynamic_update_slice_in_dim(buffer, new, index, axis)
  row = lambda b, n, i: lax.dynamic_update_slice_in_dim(b, n, i, axis - 1)
  return jax.vmap(row)(buffer, new, index)


@flax.struct.dataclass
class KVCache:
  """Preallocated keys and values for decoding.

  key, value:  one buffer per layer, [batch, kv_heads, max_len, head_dim] each (keys after RoPE). Head-major, so
               the attention matmuls read a buffer in place (batch dims lead), and one buffer per layer, so an
               unrolled stack updates and reads each in place, with no slicing of a stacked array.
  segment_ids: int32 [batch, max_len], the segment of the token held in each slot; 0 marks an empty slot (and
               padding), so a query of segment s >= 1 reads exactly the filled slots of its segment.
  prefix:      None, or a `KVCache` of P rows (P divides batch) read before these slots by every row: row b reads
               prefix row b // (batch / P) (a prompt prefilled once for its G = batch / P rollouts; see the module
               doc). It is only read: new tokens go into the per-row buffers.
  """

  key: tuple
  value: tuple
  segment_ids: jax.Array
  prefix: "KVCache | None" = None

  @classmethod
  def create(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype):
    """Empty buffers, laid out (under a mesh's activation rules) batch-split with KV heads over `tensor`."""
    zeros = lambda: nn.with_logical_constraint(jnp.zeros((batch, num_kv_heads, max_len, head_dim), dtype),
                                               ("batch", "kv_heads", "length", "kv"))
    segment_ids = nn.with_logical_constraint(jnp.zeros((batch, max_len), jnp.int32), ("batch", "length"))
    return cls(key=tuple(zeros() for _ in range(num_layers)), value=tuple(zeros() for _ in range(num_layers)),
               segment_ids=segment_ids)

  @property
  def max_len(self) -> int:
    return self.segment_ids.shape[1]

  def grow(self, max_len: int) -> "KVCache":
    """The same cache with empty slots (segment 0, zero K/V) appended up to `max_len` slots (a copy).

    Attention reads a layer's whole buffer, so a decode loop that keeps the cache only as long as the slots it
    has filled reads no empty ones: the sampler grows it between segments of its loop. (Reading a static prefix
    of a longer buffer instead made XLA:CPU copy every buffer in each step of the loop.)"""
    pad = max_len - self.max_len
    if pad < 0:
      raise ValueError(f"cannot shrink a cache of {self.max_len} slots to {max_len}")
    slots = lambda b: jnp.pad(b, [(0, 0), (0, 0), (0, pad), (0, 0)])
    return KVCache(key=tuple(map(slots, self.key)), value=tuple(map(slots, self.value)),
                   segment_ids=jnp.pad(self.segment_ids, [(0, 0), (0, pad)]), prefix=self.prefix)

  def layer(self, layer: int, index) -> "LayerCache":
    """What layer `layer` reads, its first new token at slot `index`."""
    prefix = self.prefix
    return LayerCache(self.key[layer], self.value[layer], self.segment_ids, index,
                      *(() if prefix is None else (prefix.key[layer], prefix.value[layer], prefix.segment_ids)))


@flax.struct.dataclass
class LayerCache:
  """What one attention layer reads when decoding: its key/value buffers `[batch, kv_heads, max_len, head_dim]`
  (stacked `[layers, ...]` when handed to `nn.scan`), the cache's segment ids `[batch, max_len]` with the new
  tokens' already written, and `index` (int scalar or int [batch]): the slot of the first new token; with a shared
  prefix (`KVCache.prefix`) its key/value buffers `[P, kv_heads, L, head_dim]` and segment ids `[P, L]`."""

  key: jax.Array
  value: jax.Array
  segment_ids: jax.Array
  index: jax.Array
  prefix_key: jax.Array | None = None
  prefix_value: jax.Array | None = None
  prefix_segment_ids: jax.Array | None = None

  def mask(self, num_new: int, segment_ids):
    """Boolean `[batch or 1, num_new, max_len]`: new token i (slot index + i, segment segment_ids[:, i]) reads
    slot j iff j <= index + i and slot j holds its segment."""
    query_slots = jnp.reshape(self.index, (-1, 1)) + jnp.arange(num_new)  # [batch or 1, n]
    causal = jnp.arange(self.segment_ids.shape[1])[None, None, :] <= query_slots[:, :, None]
    same_segment = segment_ids[:, :, None] == self.segment_ids[:, None, :]
    return causal & same_segment

  def prefix_mask(self, segment_ids):
    """Boolean `[batch, num_new, L]`: new token i of row b reads slot j of its prefix row b // G iff the slot holds
    its segment (every prefix slot comes before the row's own)."""
    rows = segment_ids.shape[0] // self.prefix_segment_ids.shape[0]
    prefix_segments = jnp.repeat(self.prefix_segment_ids, rows, axis=0)
    return segment_ids[:, :, None] == prefix_segments[:, None, :]


@flax.struct.dataclass
class PagedLayerCache:
  """What one attention layer reads when decoding one token per row over a paged KV cache (see the module doc).

  key_pages, value_pages: [kv_heads, num_pages, page_size, head_dim], the layer's page pool (keys after RoPE).
  page_table:   int32 [batch, n], row b's pages in table order (entries past its tokens may name any page).
  write_page, write_offset: int32 [batch], where the new token's K/V go (page id, slot within the page).
  lengths:      int32 [batch], the slots row b's new token reads: 0 .. lengths[b] - 1 of its pages in table order
                (its own slot included, since it is written first).
  buckets, widths: None (every row gathers its whole table), or int32 [chunks] and a static tuple of table widths:
                the rows in chunk j (`chunk_bounds`) gather only their first widths[buckets[j]] table entries
                (`paged_chunk_attention`). The gather path only.
  kernel:       "gather" (the pure-JAX gather path), "pallas_tpu" or "pallas_gpu" (`pallas_paged_attention`).
  """

  key_pages: jax.Array
  value_pages: jax.Array
  page_table: jax.Array
  write_page: jax.Array
  write_offset: jax.Array
  lengths: jax.Array
  buckets: jax.Array | None = None
  widths: tuple = flax.struct.field(pytree_node=False, default=())
  kernel: str = flax.struct.field(pytree_node=False, default="gather")

  def write(self, k, v):
    """k, v: [batch, 1, kv_heads, head_dim] (sequence-major) -> the pools with row b's at (:, write_page[b],
    write_offset[b], :)."""
    put = lambda pages, new: pages.at[:, self.write_page, self.write_offset].set(
        new[:, 0].swapaxes(0, 1).astype(pages.dtype))
    return put(self.key_pages, k), put(self.value_pages, v)

  def attend(self, q, k_pages, v_pages):
    """q: [batch, 1, heads, head_dim] over the pools (as `write` left them) -> [batch, 1, heads, head_dim]."""
    if self.kernel != "gather":
      return pallas_paged_attention(q, k_pages, v_pages, self.page_table, self.lengths, self.kernel)
    if self.buckets is None:
      return paged_attention(q, k_pages, v_pages, self.page_table, self.lengths)
    return paged_chunk_attention(q, k_pages, v_pages, self.page_table, self.lengths, self.buckets, self.widths)


class Attention(nn.Module):
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  qk_norm: bool = False
  v_norm: bool = False
  norm_eps: float = 1e-5
  query_chunk: int = 0
  impl: str = "auto"  # attention without a cache: "jaxpt" (grouped_attention) | "jax" (library_attention) | "auto"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  qkv_bias: bool = False
  out_bias: bool = False
  rope_scaling: Llama3Scaling | None = None
  causal: bool = True
  rope: bool = True
  lora: LoRA | None = None  # adapters on the projections it targets (q, k, v, o; `jaxpt.nn.lora`)

  @nn.compact
  def __call__(self, x, positions, segment_ids=None, cache: LayerCache | PagedLayerCache | None = None):
    """x: [batch, seq, d_model]; positions, segment_ids: [batch, seq] -> [batch, seq, d_model] (positions are
    read only by RoPE: None is allowed with rope=False).

    With `cache` -> (out, (key, value)): the layer's buffers (or page pools, with a `PagedLayerCache`) with the new
    tokens' K/V written in (see the module doc); `segment_ids` (default 1) must match those already written into
    `cache.segment_ids` (a paged cache reads its `mask` instead).
    """
    d_model = x.shape[-1]

    def projection(heads, axes, name, target):
      return Dense((heads, self.head_dim), axes, dtype=self.dtype, param_dtype=self.param_dtype,
                   use_bias=self.qkv_bias, lora=self.adapter(target), name=name)(x)

    def head_norm(t, name):
      return RMSNorm(eps=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, axis_name="kv",
                     name=name)(t)

    q = projection(self.num_heads, ("embed", "heads", "kv"), "query", "q")
    k = projection(self.num_kv_heads, ("embed", "kv_heads", "kv"), "key", "k")
    v = projection(self.num_kv_heads, ("embed", "kv_heads", "kv"), "value", "v")
    if self.qk_norm:
      q, k = head_norm(q, "query_norm"), head_norm(k, "key_norm")
    if self.v_norm:
      v = head_norm(v, "value_norm")
    if self.rope:
      q = apply_rope(q, positions, self.rope_theta, self.rope_scaling)
      k = apply_rope(k, positions, self.rope_theta, self.rope_scaling)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
    k = nn.with_logical_constraint(k, ("batch", "length", "kv_heads", "kv"))
    v = nn.with_logical_constraint(v, ("batch", "length", "kv_heads", "kv"))
    fused = self.impl == "auto" and cudnn_attention_applies(q.dtype, segment_ids is not None)
    if cache is None and (self.impl == "jax" or fused):
      out = library_attention(q, k, v, segment_ids, self.causal)
    elif cache is None:
      head_major = lambda t: t.swapaxes(1, 2)
      out = grouped_attention(q, head_major(k), head_major(v), attention_mask(x.shape[1], segment_ids, self.causal),
                              self.query_chunk if self.causal else 0)
    elif isinstance(cache, PagedLayerCache):
      if x.shape[1] != 1 or not self.causal:
        raise ValueError("Attention: a paged cache decodes one causal token per row")
      k, v = cache.write(k, v)
      out = cache.attend(q, k, v)
    else:
      if not self.causal:
        raise ValueError("Attention: a KV cache decodes causally; causal=False has no cache")
      if segment_ids is None:
        segment_ids = jnp.ones(x.shape[:2], jnp.int32)
      k = write_slots(cache.key, k.swapaxes(1, 2), cache.index, axis=2)
      v = write_slots(cache.value, v.swapaxes(1, 2), cache.index, axis=2)
      mask = cache.mask(x.shape[1], segment_ids)
      prefix = None
      if cache.prefix_key is not None:
        prefix = (cache.prefix_key, cache.prefix_value, cache.prefix_mask(segment_ids))
      out = grouped_attention(q, k, v, mask, prefix=prefix)
    out = Dense((d_model,), ("heads", "kv", "embed"), num_in_axes=2, dtype=self.dtype,
                param_dtype=self.param_dtype, use_bias=self.out_bias, lora=self.adapter("o"), name="out")(out)
    return out if cache is None else (out, (k, v))

  def adapter(self, target: str) -> LoRA | None:
    return None if self.lora is None else self.lora.at(target)
