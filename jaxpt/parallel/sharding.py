"""Shardings from logical axis names: parameters, train state, batches, and the activation-rules context.

Parameters are described by their boxed abstract tree (`jax.eval_shape(model.init, ...)["params"]`, leaves
`nn.Partitioned` carrying logical names); nothing here materialises an array.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpt.config import ConfigError
from jaxpt.parallel.rules import Rules


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def param_shardings(boxed_params: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedSharding per parameter (unboxed tree structure) from the logical names in `boxed_params`."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_params), mesh, rules)


def check_param_divisibility(boxed_params: Any, mesh: Mesh, rules: Rules, rules_name: str = "") -> None:
  """ConfigError naming the parameter, its logical axis and the mesh sizes when a split is uneven."""
  specs = nn.logical_to_mesh(nn.get_partition_spec(boxed_params), rules)
  leaves = jax.tree_util.tree_leaves_with_path(nn.meta.unbox(boxed_params))
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  logical = jax.tree.leaves(nn.get_partition_spec(boxed_params), is_leaf=lambda x: isinstance(x, PartitionSpec))
  for (path, leaf), spec, names in zip(leaves, spec_leaves, logical):
    for dim, axes in enumerate(spec):
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else tuple(axes)
      ways = math.prod(mesh.shape[a] for a in axes)
      if leaf.shape[dim] % ways:
        sizes = " x ".join(f"config.mesh.{a}={mesh.shape[a]}" for a in axes)
        raise ConfigError(f"{sizes} (config.mesh.rules={rules_name!r})", f"parameter {jax.tree_util.keystr(path)} "
                          f"axis {names[dim]!r} has size {leaf.shape[dim]}, not divisible by {ways}")


def state_shardings(abstract_state: Any, params_sharding: Any, optimizer: optax.GradientTransformation,
                    mesh: Mesh, optimized_sharding: Any = None) -> Any:
  """Shardings of a TrainState: params as given, optimizer moments like their params, the rest (step, rng, aux)
  replicated. `optimized_sharding`: the shardings of the params the optimizer sees, when only a part of them
  (LoRA's trainable part; default `params_sharding`). An optimizer with `parts` (name -> optimizer of
  params[name]: `jaxpt.engine.optim.partitioned`) has a state {name: that optimizer's state}."""
  rep = replicated(mesh)
  is_sharding = lambda x: isinstance(x, NamedSharding)
  optimized = params_sharding if optimized_sharding is None else optimized_sharding
  parts = getattr(optimizer, "parts", None)  # one optimizer per top-level params subtree (jaxpt.engine.optim)
  if parts is not None:
    opt = {name: optax.tree_map_params(part, lambda _, s: s, abstract_state.opt_state[name], optimized[name],
                                       transform_non_params=lambda _: rep, is_leaf=is_sharding)
           for name, part in parts.items()}
  else:
    opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract_state.opt_state, optimized,
                                transform_non_params=lambda _: rep, is_leaf=is_sharding)
  aux = jax.tree.map(lambda _: rep, abstract_state.aux)
  return abstract_state.replace(step=rep, params=params_sharding, opt_state=opt, rng=rep, aux=aux)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Leading (batch) axis split as the `batch` rule says; the other axes whole."""
  axes = nn.logical_to_mesh_axes(("batch",), rules)
  return NamedSharding(mesh, PartitionSpec(*axes))


def process_batch_slice(sharding: NamedSharding, global_batch: int) -> tuple[int, int]:
  """(index, count): this process needs rows [index * B / count, (index + 1) * B / count) of each global batch.

  Equals (process_index, process_count) when every process holds a distinct block of data-parallel devices;
  processes that share their rows (e.g. a `tensor` axis across hosts) get the same index.
  """
  rows = sorted({(s[0].start or 0, global_batch if s[0].stop is None else s[0].stop)
                 for s in sharding.addressable_devices_indices_map((global_batch,)).values()})
  begin, end = rows[0][0], rows[-1][1]
  covered = begin
  for start, stop in rows:
    if start > covered:
      break
    covered = max(covered, stop)
  size = end - begin
  if covered != end or global_batch % size or begin % size:
    raise ValueError(f"this process's devices hold batch rows {rows}, not one aligned block of {global_batch}")
  return begin // size, global_batch // size


def global_batch(local_batch: dict, sharding: NamedSharding, global_batch_size: int) -> dict:
  """This process's rows `[B / count, ...]` (see process_batch_slice) -> global arrays `[B, ...]`."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      sharding, np.asarray(x), (global_batch_size,) + np.shape(x)[1:]), local_batch)


def full_batch(batch: dict, sharding: NamedSharding) -> dict:
  """A batch every process holds whole (e.g. eval) -> global arrays `[B, ...]` laid out by `sharding`."""
  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, batch)


def process_rows(array: jax.Array) -> np.ndarray:
  """This process's rows of a global array split along its leading axis, in order, as numpy `[rows here, ...]`
  (rows held by several local devices, e.g. replicated over `tensor`, taken once): the inverse of
  `global_batch` for this process."""
  blocks = {}
  for shard in array.addressable_shards:
    blocks.setdefault(shard.index[0].start or 0, shard.data)
  return np.concatenate([np.asarray(blocks[start]) for start in sorted(blocks)])


def all_rows(local: Any, sharding: NamedSharding, global_batch_size: int) -> Any:
  """Every process's rows (see `process_batch_slice`) of a pytree of host arrays `[B / count, ...]` -> the whole
  `[B, ...]` on every process (one all-gather; processes that share rows give them once)."""
  if jax.process_count() == 1:
    return local
  index, count = process_batch_slice(sharding, global_batch_size)
  gathered, indices = multihost_utils.process_allgather((local, np.asarray([index])), tiled=False)
  order = np.unique(np.asarray(indices)[:, 0], return_index=True)[1]  # first process holding each block
  if len(order) != count:
    raise ValueError(f"the processes hold {len(order)} distinct row blocks, expected {count}")
  return jax.tree.map(lambda x: np.concatenate(list(np.asarray(x)[order])), gathered)


def global_batches(local: Iterator[dict], sharding: NamedSharding, global_batch_size: int) -> Iterator[dict]:
  for batch in local:
    yield global_batch(batch, sharding, global_batch_size)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules, inside_jit: bool = False):
  """Makes `nn.with_logical_constraint` in model code constrain activations on `mesh` under `rules`.

  Use `inside_jit=True` in a function being traced, False (the default) around eager calls that trace later.
  """
  mesh_ctx = jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if inside_jit else jax.set_mesh(mesh)
  with mesh_ctx, nn.logical_axis_rules(rules):
    yield


def with_activation_sharding(fn: Callable, mesh: Mesh, rules: Rules) -> Callable:
  """`fn` traced under `activation_sharding(mesh, rules)` (for use inside jit)."""

  def wrapped(*args, **kwargs):
    with activation_sharding(mesh, rules, inside_jit=True):
      return fn(*args, **kwargs)

  return wrapped


@dataclasses.dataclass(frozen=True)
class MeshLayout:
  """Where a program's arrays live on a mesh: the logical rules, the params' shardings (a pytree of
  NamedSharding) and the batch sharding (leading axis over data x fsdp)."""

  mesh: Mesh
  rules: Rules
  params: Any
  batch: NamedSharding

  @property
  def replicated(self) -> NamedSharding:
    return replicated(self.mesh)

  def jit(self, fn: Callable, out_shardings: Any, in_shardings: Any = None, **kwargs: Any) -> Callable:
    """`fn` jitted with these shardings (in_shardings None: those of the arguments) and traced under the
    activation rules."""
    if in_shardings is not None:
      kwargs["in_shardings"] = in_shardings
    return jax.jit(with_activation_sharding(fn, self.mesh, self.rules), out_shardings=out_shardings, **kwargs)
