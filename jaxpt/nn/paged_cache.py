"""A paged KV cache: one pool of fixed-size pages per layer, page tables per row, and a free list of page ids.

    key_pages[l], value_pages[l]   [kv_heads, num_pages + 1, page_size, head_dim]   (page 0: the sink, see below)
    free                           int32 [num_pages], a stack: free[0 .. free_count - 1] are the unused page ids

Page 0 is never handed out: it is the sink that rows without a page to write (an empty or waiting decode slot, a
prompt's unused table entries) write into and that no row reads but an idle one (whose output is discarded).
Everything has a static shape: a pop or push names at most a fixed number of pages, some of them masked off, so it
compiles once and runs inside a `lax.while_loop` (`jaxpt.rl.engine`). The attention over pages is
`jaxpt.nn.attention.PagedLayerCache`'s.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxpt.nn.attention import PagedLayerCache


@flax.struct.dataclass
class PagedKVCache:
  """The page pools of every layer and what this decode step writes and reads (`PagedLayerCache` per layer):
  page_table int32 [batch, n], write_page / write_offset / lengths int32 [batch]; buckets int32 [chunks] and the
  static widths: how many table entries each chunk of rows gathers (None: all); the static kernel (one of
  `jaxpt.nn.attention.PAGED_KERNELS`)."""

  key_pages: tuple
  value_pages: tuple
  page_table: jax.Array | None = None
  write_page: jax.Array | None = None
  write_offset: jax.Array | None = None
  lengths: jax.Array | None = None
  buckets: jax.Array | None = None
  widths: tuple = flax.struct.field(pytree_node=False, default=())
  kernel: str = flax.struct.field(pytree_node=False, default="gather")

  @classmethod
  def create(cls, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype,
             kernel: str = "gather"):
    """Zeroed pools of `num_pages` usable pages (+ the sink, page 0) per layer."""
    zeros = lambda: jnp.zeros((num_kv_heads, num_pages + 1, page_size, head_dim), dtype)
    return cls(key_pages=tuple(zeros() for _ in range(num_layers)),
               value_pages=tuple(zeros() for _ in range(num_layers)), kernel=kernel)

  @property
  def page_size(self) -> int:
    return self.key_pages[0].shape[2]

  def layer(self, layer: int) -> PagedLayerCache:
    return PagedLayerCache(self.key_pages[layer], self.value_pages[layer], self.page_table, self.write_page,
                           self.write_offset, self.lengths, self.buckets, self.widths, self.kernel)

  def write_pages(self, page_ids, keys, values) -> "PagedKVCache":
    """page_ids int [n] (0: dropped into the sink); keys, values: one [n, kv_heads, page_size, head_dim] per layer
    -> the pools with those pages overwritten (a prompt's K/V after its prefill)."""
    put = lambda pages, new: pages.at[:, page_ids].set(new.swapaxes(0, 1).astype(pages.dtype))
    return self.replace(key_pages=tuple(map(put, self.key_pages, keys)),
                        value_pages=tuple(map(put, self.value_pages, values)))

  def copy_page(self, source, target) -> "PagedKVCache":
    """source, target: int page ids -> every layer's pools with page `target` a copy of page `source` (target 0:
    into the sink, i.e. no copy)."""
    copy = lambda pages: pages.at[:, target].set(pages[:, source])
    return self.replace(key_pages=tuple(map(copy, self.key_pages)), value_pages=tuple(map(copy, self.value_pages)))


@flax.struct.dataclass
class FreeList:
  """The unused page ids 1 .. num_pages as a stack: `pages[:count]`."""

  pages: jax.Array
  count: jax.Array

  @classmethod
  def full(cls, num_pages: int) -> "FreeList":
    return cls(pages=jnp.arange(1, num_pages + 1, dtype=jnp.int32), count=jnp.int32(num_pages))

  @property
  def capacity(self) -> int:
    return self.pages.shape[0]

  def in_use(self):
    return self.capacity - self.count

  def pop(self, want):
    """want bool [n] -> (ids int32 [n]: a distinct page for each wanted entry, 0 elsewhere; the rest of the list).
    The caller checks that sum(want) <= count."""
    rank = jnp.cumsum(want.astype(jnp.int32))  # the k-th wanted entry takes the k-th page from the top
    ids = jnp.where(want, self.pages[jnp.clip(self.count - rank, 0, self.capacity - 1)], 0)
    return ids, self.replace(count=self.count - rank[-1])

  def push(self, ids, give):
    """ids int [n], give bool [n] (entries with give set must be distinct pages in use) -> the list with them."""
    ids, give = ids.reshape(-1), give.reshape(-1)
    at = jnp.where(give, self.count + jnp.cumsum(give.astype(jnp.int32)) - 1, self.capacity)
    return self.replace(pages=self.pages.at[at].set(ids.astype(jnp.int32), mode="drop"),
                        count=self.count + jnp.sum(give.astype(jnp.int32)))
