"""Hugging Face checkpoints (Llama, Mistral, Qwen2 / Qwen2.5, Qwen3) read into jaxpt's `pre` scheme.

A checkpoint is a local directory: `config.json` plus `model.safetensors`, or shards named by
`model.safetensors.index.json`. `read_config(path)` maps config.json to a `ModelConfig` (`jaxpt.models.hf_config`);
`load_params(path, config)` builds the parameter tree, each array with `jax.make_array_from_callback`, whose
callback reads only the slice a device holds (`safe_open(...).get_slice(name)`, NumPy only, no torch): no host or
device ever holds the whole model. Which tensor fills which parameter, in which layout: `jaxpt.models.hf_layout`.
Tensors are cast to `config.param_dtype` (a bf16 checkpoint loads as bf16 by default). jaxpt-native directories
(`model_type: "jaxpt"`, written by `jaxpt.models.hf_export`) load through the same streaming code.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors' numpy reader can return it)
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import SafetensorError, safe_open

from jaxpt.config import ConfigError, DataError, read_json_object
from jaxpt.models.config import ModelConfig
from jaxpt.models.hf_config import (CONFIG_FILE, NATIVE_TYPE, check_importable, read_config, read_hf_json,
                                    reward_record)
from jaxpt.models.hf_layout import LM_HEAD_PATH, REWARD_HEAD_PATH, SCORE_SOURCE, hf_shape, read_slice, tensor_source
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import TransformerLM
from jaxpt.parallel.rules import get_rules
from jaxpt.parallel.sharding import param_shardings

HF_PREFIX = "hf:"  # `init_from` / `jaxpt.load` paths that name a Hugging Face checkpoint directory
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class Checkpoint:
  """The safetensors files of a checkpoint directory, open for lazy slicing (a context manager)."""

  def __init__(self, path: str, weights_file: str = WEIGHTS_FILE):
    self.path = path
    index_file, single = os.path.join(path, INDEX_FILE), os.path.join(path, weights_file)
    if weights_file == WEIGHTS_FILE and os.path.isfile(index_file):
      self.where = index_file
      weight_map = read_json_object(index_file).get("weight_map")
      if not isinstance(weight_map, dict):
        raise DataError(f"{index_file}: missing field 'weight_map'")
      self.files = {name: os.path.join(path, file) for name, file in weight_map.items()}
    elif os.path.isfile(single):
      self.where, self.files = single, None
    elif weights_file == WEIGHTS_FILE:
      raise DataError(f"{path}: not a Hugging Face checkpoint directory (no {WEIGHTS_FILE} or {INDEX_FILE})")
    else:
      raise DataError(f"{path}: no {weights_file}")
    self.stack = contextlib.ExitStack()
    self.handles: dict[str, Any] = {}

  def __enter__(self) -> "Checkpoint":
    files = [self.where] if self.files is None else sorted(set(self.files.values()))
    for file in files:
      if not os.path.isfile(file):
        raise DataError(f"{self.where}: weight_map names {os.path.basename(file)}, which is missing")
      try:
        self.handles[file] = self.stack.enter_context(safe_open(file, framework="numpy"))
      except SafetensorError as e:
        self.stack.close()
        raise DataError(f"{file}: truncated or not a safetensors file ({e})") from None
    if self.files is None:
      self.files = {name: self.where for name in self.handles[self.where].keys()}
    return self

  def __exit__(self, *exc) -> None:
    self.stack.close()

  def tensor(self, name: str, shape: tuple[int, ...]):
    """The lazy slice of tensor `name` after checking it exists with HF shape `shape` (DataError otherwise)."""
    file = self.files.get(name)
    if file is None:
      raise DataError(f"{self.where}: missing tensor {name!r}")
    try:
      tensor = self.handles[file].get_slice(name)
    except SafetensorError as e:
      raise DataError(f"{file}: tensor {name!r}: {e}") from None
    actual = tuple(tensor.get_shape())
    if actual != shape:
      raise DataError(f"{file}: tensor {name!r} has shape {list(actual)}, {CONFIG_FILE} implies {list(shape)}")
    return FileSlice(file, name)


class FileSlice(NamedTuple):
  """Tensor `name` of safetensors `file`; `[index]` reads that block through a mapping opened for the read alone.

  safetensors reads through a memory map, and every page a read touches stays in the process's resident memory
  while the map is open; one map per read releases them as soon as the block is copied, so a whole load holds the
  loaded arrays and one block, not also the checkpoint's pages (measured: benchmarks/hf_load_memory.py)."""

  file: str
  name: str

  def __getitem__(self, index):
    with safe_open(self.file, framework="numpy") as handle:
      return np.array(handle.get_slice(self.name)[index])  # a copy, not a view of the map


def load_params(path: str, config: ModelConfig, mesh: Mesh | None = None, shardings: Any = None,
                rules: str = "fsdp_tp", each: Callable | None = None) -> Any:
  """The parameters of `TransformerLM(config)` read from checkpoint directory `path`, cast to config.param_dtype.

  Each leaf is made by `jax.make_array_from_callback` in its target sharding: `shardings` (a tree like the params
  of NamedSharding / Sharding), else the logical-axis rules preset `rules` on `mesh`, else the first device. A
  device's callback reads only its block of the HF tensor. DataError (naming file and tensor) for missing files,
  a truncated or unreadable safetensors file, a missing tensor, or a shape that contradicts config.json.
  `each(names, array)`: what the tree holds in the leaf's place, called as each leaf is read, before the next one
  (QLoRA quantizes the kernels as they stream in: the float base is never whole).
  """
  native = read_hf_json(path).get("model_type") == NATIVE_TYPE
  if not native:
    check_importable(config)
  boxed = jax.eval_shape(lambda: TransformerLM(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32)))
  dtype = jnp.dtype(config.param_dtype)
  return load_tree(path, boxed["params"], lambda names, ndim: (tensor_source(names, ndim, native), dtype), mesh,
                    shardings, rules, each=each)


def load_reward_params(path: str, config: ModelConfig, num_scores: int, mesh: Mesh | None = None,
                       shardings: Any = None, rules: str = "fsdp_tp") -> Any:
  """The parameters of `RewardModel(config, num_scores)` from a reward-model checkpoint directory (written by
  `hf_export.save_hf` for a reward model, or a transformers sequence classifier): the backbone as `load_params`
  reads it, the score head from `score.weight` [num_scores, d_model] (float32). The backbone's LM head, which a
  reward model never uses and an export does not write, is zeros."""
  native = read_hf_json(path).get("model_type") == NATIVE_TYPE
  if not native:
    check_importable(config)
  module = RewardModel(config, num_scores=num_scores)
  boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32),
                                             jnp.zeros((1,), jnp.int32)))
  dtype = jnp.dtype(config.param_dtype)

  def locate(names, ndim):
    if names == REWARD_HEAD_PATH:
      return (SCORE_SOURCE, False), jnp.dtype(jnp.float32)
    if names == ("backbone", *LM_HEAD_PATH):
      return (None, False), dtype  # zeros
    return (tensor_source(names[1:], ndim, native) if names[0] == "backbone" else None), dtype

  return load_tree(path, boxed["params"], locate, mesh, shardings, rules)


def load_tree(path: str, boxed: Any, locate: Callable, mesh: Mesh | None, shardings: Any, rules: str,
              weights_file: str = WEIGHTS_FILE, each: Callable | None = None) -> Any:
  """The param tree of abstract `boxed` read from checkpoint `path` (its `weights_file`, or the shards its index
  names). `locate(names, ndim)` -> (where, dtype) for each leaf: where is (Source, stacked), (None, False) for a
  leaf of zeros, or None for one that has no tensor (a ConfigError). `each(names, array)`: what the tree holds in
  a leaf's place, called as soon as the leaf is read (default: the array)."""
  abstract = nn.meta.unbox(boxed)
  if shardings is None:
    if mesh is None:
      shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract)
    else:
      shardings = param_shardings(boxed, mesh, get_rules(rules))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  sharding_leaves = treedef.flatten_up_to(shardings)
  with Checkpoint(path, weights_file) as checkpoint:
    plans, all_names = [], []
    for key_path, leaf in leaves:
      names = tuple(str(getattr(k, "key", k)) for k in key_path)
      all_names.append(names)
      found, dtype = locate(names, leaf.ndim)
      if found is None:
        raise ConfigError("model", f"parameter {'/'.join(names)} has no Hugging Face tensor")
      source, stacked = found
      if source is None:
        plans.append(((leaf.shape, None, False, leaf.shape, []), dtype))
        continue
      layer_shape = leaf.shape[1:] if stacked else leaf.shape
      layers = range(leaf.shape[0]) if stacked else [None]
      tensors = [checkpoint.tensor(source.name.format(layer=l), hf_shape(source, layer_shape)) for l in layers]
      plans.append(((leaf.shape, source, stacked, layer_shape, tensors), dtype))
    each = each or (lambda names, array: array)
    arrays = [each(names, _build(plan, sharding, dtype))
              for names, (plan, dtype), sharding in zip(all_names, plans, sharding_leaves)]
  return jax.tree_util.tree_unflatten(treedef, arrays)


def _build(plan, sharding, dtype) -> jax.Array:
  shape, source, stacked, layer_shape, tensors = plan

  def callback(index):
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    if source is None:  # a parameter the checkpoint has no tensor for and nothing reads (a reward model's LM head)
      return np.zeros([len(range(*i.indices(n))) for i, n in zip(index, shape)], dtype)
    if not stacked:
      return np.asarray(read_slice(tensors[0], source, layer_shape, index), dtype)
    picked = range(*index[0].indices(shape[0]))
    return np.stack([np.asarray(read_slice(tensors[l], source, layer_shape, index[1:]), dtype) for l in picked])

  return jax.make_array_from_callback(shape, sharding, callback, dtype=dtype)


def load(path: str, mesh: Mesh | None = None, shardings: Any = None, rules: str = "fsdp_tp",
         **overrides: Any) -> tuple[ModelConfig, Any]:
  """(read_config(path, **overrides), load_params(path, that config, mesh, shardings, rules))."""
  config = read_config(path, **overrides)
  return config, load_params(path, config, mesh, shardings, rules)


def load_reward(path: str, mesh: Mesh | None = None, shardings: Any = None, rules: str = "fsdp_tp",
                **overrides: Any) -> tuple[ModelConfig, Any, dict]:
  """(the backbone's ModelConfig, the `RewardModel` params, config.json's reward record {num_scores,
  prompt_format}) of a reward-model checkpoint directory; DataError naming the file for a language model."""
  config = read_config(path, reward=True, **overrides)
  record = reward_record(read_hf_json(path), os.path.join(path, CONFIG_FILE))
  return config, load_reward_params(path, config, record["num_scores"], mesh, shardings, rules), record

