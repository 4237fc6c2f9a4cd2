"""Compiled test functions whose many small outputs reach the host in ONE device-to-host copy, shared by the loss
properties (tests/test_losses_*.py): a compiled call that returns a hundred small arrays (every aggregation mode x
KL option of a loss, with their metrics) spends several times longer creating and fetching them one by one than
computing them, and a property makes that call 1000 times."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _packed(leaf):
  """A float32, int32 or bool leaf as a flat float32 vector, exactly: int32 bit-cast, bool as 0 / 1."""
  if leaf.dtype == jnp.float32:
    return leaf.ravel()
  if leaf.dtype == jnp.int32:
    return jax.lax.bitcast_convert_type(leaf, jnp.float32).ravel()
  if leaf.dtype == jnp.bool_:
    return leaf.astype(jnp.float32).ravel()
  raise TypeError(f"on_host: an output of dtype {leaf.dtype} (float32, int32 or bool only)")


def _unpacked(flat, spec):
  """The inverse of _packed for one leaf: flat float32 [size] -> NumPy array of spec's shape and dtype."""
  if spec.dtype == jnp.int32:
    flat = flat.view(np.int32)
  elif spec.dtype == jnp.bool_:
    flat = flat != 0
  return flat.reshape(spec.shape)


def on_host(fn):
  """fn(*args) -> pytree of float32 / int32 / bool arrays, as call(*args, part=None) -> the same pytree in NumPy
  (or only fn's output[part], where fn returns a dict), through one compiled call returning ONE float32 vector
  (the outputs packed by `_packed`), copied to the host once and cut there. One compile per argument shapes and
  dtypes, as jax.jit; the values are fn's, bit for bit."""
  fn = jax.jit(fn)   # traced once per argument specs, for the layout and the packed function alike
  packed = jax.jit(lambda *args: jnp.concatenate([_packed(leaf) for leaf in jax.tree_util.tree_leaves(fn(*args))]))

  @functools.cache
  def layout(specs):
    """{part: (treedef, [(start, stop, leaf spec)])} of fn's output for argument specs; part None: all of it."""
    out = jax.eval_shape(fn, *specs)
    paths_and_leaves, tree = jax.tree_util.tree_flatten_with_path(out)
    ends = np.cumsum([int(np.prod(leaf.shape)) for _, leaf in paths_and_leaves])
    cuts = [(int(end) - int(np.prod(leaf.shape)), int(end), leaf) for end, (_, leaf) in zip(ends, paths_and_leaves)]
    parts = {None: (tree, cuts)}
    if isinstance(out, dict):   # a dict flattens key by key: each key's leaves are consecutive
      for key in out:
        mine = [cut for cut, (path, _) in zip(cuts, paths_and_leaves) if path[0].key == key]
        parts[key] = (jax.tree_util.tree_structure(out[key]), mine)
    return parts

  def call(*args, part=None):
    dtypes = (a.dtype if hasattr(a, "dtype") else np.result_type(a) for a in args)  # Python scalars: NumPy's
    specs = tuple(jax.ShapeDtypeStruct(np.shape(a), jax.dtypes.canonicalize_dtype(d)) for a, d in zip(args, dtypes))
    tree, cuts = layout(specs)[part]
    flat = np.array(packed(*args))   # one copy, writable
    return jax.tree_util.tree_unflatten(tree, [_unpacked(flat[start:stop], spec) for start, stop, spec in cuts])

  return call
