"""tests/host_copy.py's on_host: fn's outputs bit for bit (float32 nan / inf / -0, int32 extremes, bool), whole or
one part of a dict, and a one-line error for a dtype it cannot pack."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.host_copy import on_host


def _fn(x, n):
  return {"a": (x * 2.0, {"n": n + 1, "positive": x > 0}), "b": jnp.sum(x[:2])}


def _bits(tree):
  """Every leaf as (dtype, shape, raw bytes): equal bits, not merely equal values (nan == nan, -0 != 0)."""
  return [(leaf.dtype, leaf.shape, np.ascontiguousarray(leaf).tobytes()) for leaf in jax.tree_util.tree_leaves(tree)]


def test_on_host_returns_the_outputs_bit_for_bit_whole_and_by_part():
  x = np.array([1.5, -0.0, np.nan, np.inf, -np.inf, -3.25], np.float32)
  n = np.array([[np.iinfo(np.int32).min, -1], [0, np.iinfo(np.int32).max - 1]], np.int32)
  want = jax.device_get(jax.jit(_fn)(x, n))
  call = on_host(_fn)
  got = call(x, n)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  assert _bits(got) == _bits(want)
  assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(got))
  assert _bits(call(x, n, part="a")) == _bits(want["a"]) and _bits(call(x, n, part="b")) == _bits(want["b"])
  got["a"][0][0] = 7.0   # the caller's own copy
  assert _bits(call(x, n)) == _bits(want)


def test_on_host_names_a_dtype_it_cannot_pack():
  with pytest.raises(TypeError, match="float16"):
    on_host(lambda x: x.astype(jnp.float16))(np.ones(3, np.float32))
