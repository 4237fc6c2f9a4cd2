"""The paged KV cache's pure-JAX gather path (`jaxpt.nn.attention.paged_attention`, issue 29): the same attention as
a contiguous cache holding each row's tokens, with the pages scattered in any order and a prompt's full pages shared
by the rows of its group (its last, partly filled page copied into each row's own first page, then the response)."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.nn.attention import gather_pages, grouped_attention, paged_attention

H, H_KV, D, PAGE = 4, 2, 8, 4


def test_gather_pages_puts_each_rows_pages_in_table_order():
  pages = jnp.arange(5 * H_KV * PAGE * D, dtype=jnp.float32).reshape(H_KV, 5, PAGE, D)
  got = gather_pages(pages, jnp.asarray([[3, 0], [1, 1]]))
  np.testing.assert_array_equal(got[0], np.concatenate([pages[:, 3], pages[:, 0]], axis=1))
  np.testing.assert_array_equal(got[1], np.concatenate([pages[:, 1], pages[:, 1]], axis=1))


def test_paged_attention_equals_the_contiguous_cache_with_shared_prompt_pages():
  rng = np.random.default_rng(0)
  prompts, responses, num_new, width = [9, 6, 3], [[2, 5], [4, 1], [6, 3]], 2, 4 * PAGE
  k_pages = np.zeros((H_KV, 40, PAGE, D), np.float32)
  v_pages = np.zeros_like(k_pages)
  free = iter(rng.permutation(k_pages.shape[1]))
  tables, lengths, keys, values = [], [], [], []
  for prompt, group in zip(prompts, responses):
    prompt_kv = rng.normal(size=(2, H_KV, prompt, D)).astype(np.float32)
    shared = [next(free) for _ in range(prompt // PAGE)]  # the prompt's full pages, held once
    for p, page in enumerate(shared):
      k_pages[:, page], v_pages[:, page] = prompt_kv[:, :, p * PAGE:(p + 1) * PAGE]
    for response in group:
      kv = np.concatenate([prompt_kv, rng.normal(size=(2, H_KV, response, D)).astype(np.float32)], axis=2)
      tokens = prompt + response
      own = [next(free) for _ in range(-(-tokens // PAGE) - len(shared))]
      for p, page in enumerate(own, start=len(shared)):  # the prompt's partial page (copied), then the response
        chunk = kv[:, :, p * PAGE:(p + 1) * PAGE]
        k_pages[:, page, :chunk.shape[2]], v_pages[:, page, :chunk.shape[2]] = chunk
      table = shared + own
      tables.append(table + [table[0]] * (width // PAGE - len(table)))  # unused entries: any page
      lengths.append(tokens)
      padded = np.pad(kv, [(0, 0), (0, 0), (0, width - tokens), (0, 0)], constant_values=np.nan)  # never read
      keys.append(padded[0])
      values.append(padded[1])
  lengths = np.asarray(lengths)
  query_slots = lengths[:, None] - num_new + np.arange(num_new)
  mask = np.arange(width)[None, None, :] <= query_slots[:, :, None]
  q = jnp.asarray(rng.normal(size=(len(tables), num_new, H, D)).astype(np.float32))
  keys, values = np.nan_to_num(np.stack(keys)), np.nan_to_num(np.stack(values))
  want = grouped_attention(q, jnp.asarray(keys), jnp.asarray(values), jnp.asarray(mask))
  got = jax.jit(paged_attention)(q, jnp.asarray(k_pages), jnp.asarray(v_pages), jnp.asarray(tables),
                                 jnp.asarray(lengths))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
