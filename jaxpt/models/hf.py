"""Hugging Face checkpoints (Llama, Mistral, Qwen2 / Qwen2.5, Qwen3) read into jaxpt's `pre` scheme.

A checkpoint is a local directory: `config.json` plus `model.safetensors`, or shards named by
`model.safetensors.index.json`. `read_config(path)` maps config.json to a `ModelConfig`; `load_params(path,
config)` builds the parameter tree, each array with `jax.make_array_from_callback`, whose callback reads only the
slice a device holds (`safe_open(...).get_slice(name)`, NumPy only, no torch): no host or device ever holds the
whole model. Tensors are cast to `config.param_dtype` (a bf16 checkpoint loads as bf16 by default).

Parameter layout (HF `nn.Linear` weight W is [out, in], y = x W^T + b; H heads, H_kv KV heads, D head_dim):
    embedding [V, d]                  <- model.embed_tokens.weight [V, d]
    attn_norm/scale [d]               <- model.layers.{l}.input_layernorm.weight
    attn/query/kernel [d, H, D]       <- self_attn.q_proj.weight [H*D, d], transposed (row h*D + j is head h, dim j)
    attn/query/bias [H, D]            <- self_attn.q_proj.bias [H*D] (Qwen2; attention_bias)
    attn/key, attn/value [d, H_kv, D] <- self_attn.k_proj / v_proj likewise
    attn/out/kernel [H, D, d]         <- self_attn.o_proj.weight [d, H*D], transposed (bias [d] with attention_bias)
    attn/query_norm/scale [D]         <- self_attn.q_norm.weight (Qwen3; key_norm <- k_norm)
    mlp_norm/scale [d]                <- post_attention_layernorm.weight
    mlp/wi_gate, wi_up/kernel [d, F]  <- mlp.gate_proj / up_proj.weight [F, d], transposed
    mlp/wo/kernel [F, d]              <- mlp.down_proj.weight [d, F], transposed
    output/final_norm/scale [d]       <- model.norm.weight
    head/kernel [d, V]                <- lm_head.weight [V, d], transposed (untied only; ignored when tied)
Scanned layers (`scan_layers`) stack layer l at index l of a leading [layers] axis.

RoPE: jaxpt pairs head dimension i with i + D/2 (rotate-half, `jaxpt.nn.rope`), as HF's `apply_rotary_pos_emb`
does, so q/k rows are taken as stored: no permutation (the one in Meta -> HF Llama conversion scripts turns the
original interleaved layout into this one; HF checkpoints are already in it). Equations of these models as jaxpt
computes them: x + Attn(RMSNorm(x)), x + SwiGLU(RMSNorm(x)), logits = RMSNorm(x) W_head, RMSNorm in float32.

jaxpt-native directories (`model_type: "jaxpt"`, written by `jaxpt.models.hf_export` for models transformers has
no class for: SiameseNorm, Post-Norm, HybridNorm, LayerNorm or GELU models) hold the ModelConfig under
`jaxpt_model` and one tensor per jaxpt parameter and layer, named by its path (`decoder.layers.{l}.in1.scale`,
`embedding`), in jaxpt's layout; they load through the same streaming code.

Not supported, each refused naming the config.json field: activations other than silu, MLP biases, sliding-window
attention in Qwen2/3 (`use_sliding_window`), RoPE types other than default and llama3, partial rotary.
Mistral's `sliding_window` W is exact for sequences up to W, so it caps `max_seq_len` at W.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors' numpy reader can return it)
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import SafetensorError, safe_open

from jaxpt.config import ConfigError, DataError, read_json_object
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.parallel.rules import get_rules
from jaxpt.parallel.sharding import param_shardings

HF_PREFIX = "hf:"  # `init_from` / `jaxpt.load` paths that name a Hugging Face checkpoint directory
CONFIG_FILE = "config.json"
NATIVE_TYPE = "jaxpt"  # config.json model_type of a jaxpt-native directory
NATIVE_ARCHITECTURE = "JaxptTransformerLM"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FAMILIES = {  # model_type -> (architecture, config.json defaults as transformers' config class has them)
    "llama": ("LlamaForCausalLM", dict(max_position_embeddings=2048)),
    "mistral": ("MistralForCausalLM", dict(max_position_embeddings=4096 * 32, sliding_window=4096)),
    "qwen2": ("Qwen2ForCausalLM", dict(max_position_embeddings=32768)),
    "qwen3": ("Qwen3ForCausalLM", dict(max_position_embeddings=32768, head_dim=128)),
}
DEFAULTS = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0, hidden_act="silu",
                attention_bias=False, mlp_bias=False)
# ModelConfig fields read from config.json: an override that contradicts the checkpoint is a ConfigError.
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim",
                       "mlp_type", "norm_type", "norm_eps", "norm_scheme", "qk_norm", "v_norm", "qkv_bias",
                       "attn_out_bias", "tie_embeddings", "rope_theta", "rope_scaling", "rope_scaling_factor",
                       "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len")


# ModelConfig values every transformers decoder class (and so every HF checkpoint jaxpt reads) has.
TRANSFORMERS_FIELDS = (("norm_scheme", "pre"), ("norm_type", "rmsnorm"), ("mlp_type", "swiglu"), ("v_norm", False),
                       ("num_experts", 0), ("mlp_bias", False), ("causal", True), ("rope", True))
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # config.json's special-token ids
# ModelConfig fields that change how a model runs, not what it computes: a load may set them freely.
RUNTIME_FIELDS = ("max_seq_len", "dtype", "param_dtype", "remat", "scan_layers", "attention_query_chunk",
                  "attention_impl", "dropout_rate", "kernel")


def read_hf_json(path: str) -> dict:
  """config.json of checkpoint directory `path` (DataError when `path` is not a checkpoint directory)."""
  file = os.path.join(path, CONFIG_FILE)
  if not os.path.isdir(path):
    raise DataError(f"{path}: not a Hugging Face checkpoint directory (no such directory)")
  if not os.path.isfile(file):
    raise DataError(f"{path}: not a Hugging Face checkpoint directory (no {CONFIG_FILE})")
  return read_json_object(file)


def special_ids(path: str) -> dict[str, Any]:
  """The bos/eos/pad_token_id that config.json of checkpoint directory `path` sets (an id, or a list for eos), as
  it sets them: an export of the model gives back these, no pad_token_id that the checkpoint did not have."""
  return {key: value for key, value in read_hf_json(path).items() if key in SPECIAL_IDS and value is not None}


def _rope(hf: dict, file: str) -> dict:
  """ModelConfig RoPE fields from `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling` (hub)."""
  key = "rope_parameters" if hf.get("rope_parameters") is not None else "rope_scaling"
  params = dict(hf.get(key) or {})
  if any(isinstance(value, dict) for value in params.values()):
    raise DataError(f"{file}: {key}: per-layer-type RoPE parameters are not supported")
  theta = params.get("rope_theta", hf.get("rope_theta", DEFAULTS["rope_theta"]))
  kind = params.get("rope_type", params.get("type", "default"))
  if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
    raise DataError(f"{file}: partial_rotary_factor: only 1.0 (full rotary) is supported")
  fields: dict[str, Any] = dict(rope_theta=float(theta))
  if kind == "llama3":
    try:
      fields.update(rope_scaling="llama3", rope_scaling_factor=float(params["factor"]),
                    rope_low_freq_factor=float(params["low_freq_factor"]),
                    rope_high_freq_factor=float(params["high_freq_factor"]),
                    rope_original_max_len=int(params.get("original_max_position_embeddings",
                                                         hf["max_position_embeddings"])))
    except KeyError as e:
      raise DataError(f"{file}: {key}: llama3 scaling without {e.args[0]!r}") from None
  elif kind != "default":
    raise DataError(f"{file}: {key}.rope_type={kind!r}: unsupported (supported: default, llama3)")
  return fields


def config_fields(hf: dict, file: str = CONFIG_FILE) -> dict:
  """The ModelConfig fields (pre scheme, RMSNorm, SwiGLU) that HF config dict `hf` (from `file`) describes."""
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    raise DataError(f"{file}: model_type={model_type!r}: unsupported (supported: {', '.join(FAMILIES)})")
  architecture, family_defaults = FAMILIES[model_type]
  architectures = hf.get("architectures") or [architecture]
  if architectures != [architecture]:
    raise DataError(f"{file}: architectures={architectures!r}: unsupported for model_type={model_type!r} "
                    f"(supported: [{architecture!r}])")
  hf = {**DEFAULTS, **family_defaults, **{k: v for k, v in hf.items() if v is not None or k == "sliding_window"}}
  for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
    if key not in hf:
      raise DataError(f"{file}: missing field {key!r}")
  if hf["hidden_act"] != "silu":
    raise DataError(f"{file}: hidden_act={hf['hidden_act']!r}: unsupported (supported: 'silu')")
  if model_type == "llama" and hf["mlp_bias"]:  # mistral / qwen2 / qwen3 have fixed biases whatever it says
    raise DataError(f"{file}: mlp_bias=True: unsupported (MLP projections have no bias in jaxpt)")
  if hf.get("use_sliding_window"):
    raise DataError(f"{file}: use_sliding_window=True: unsupported (jaxpt attends to the whole context)")
  heads = hf["num_attention_heads"]
  max_len = hf["max_position_embeddings"]
  if model_type == "mistral" and hf.get("sliding_window") is not None:
    max_len = min(max_len, hf["sliding_window"])  # a window of W is plain causal attention up to W tokens
  bias = model_type in ("llama", "qwen3") and bool(hf["attention_bias"])  # q/k/v and o; qwen2: q/k/v always
  return dict(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads", heads), head_dim=hf.get("head_dim", hf["hidden_size"] // heads),
      mlp_dim=hf["intermediate_size"], mlp_type="swiglu", norm_type="rmsnorm", norm_eps=float(hf["rms_norm_eps"]),
      norm_scheme="pre", qk_norm=model_type == "qwen3", v_norm=False, qkv_bias=bias or model_type == "qwen2",
      attn_out_bias=bias, tie_embeddings=bool(hf["tie_word_embeddings"]), max_seq_len=max_len,
      **_rope(hf, file))


def native_fields(hf: dict, file: str = CONFIG_FILE) -> dict:
  """The ModelConfig fields of a jaxpt-native config.json (its `jaxpt_model` object; unknown keys refused)."""
  fields = hf.get("jaxpt_model")
  if not isinstance(fields, dict):
    raise DataError(f"{file}: model_type={NATIVE_TYPE!r} without a 'jaxpt_model' object")
  known = {field.name for field in dataclasses.fields(ModelConfig)}
  for name in fields:
    if name not in known:
      raise DataError(f"{file}: jaxpt_model.{name}: not a ModelConfig field (written by a newer jaxpt?)")
  return {name: value for name, value in fields.items() if name not in ("dtype", "param_dtype")}


def checkpoint_dtype(hf: dict) -> str:
  """'bfloat16' for a checkpoint config.json calls bfloat16 (`dtype` / `torch_dtype`), else 'float32'."""
  return "bfloat16" if (hf.get("dtype") or hf.get("torch_dtype")) == "bfloat16" else "float32"


def checkpoint_fields(path: str) -> tuple[dict, tuple[str, ...]]:
  """(the ModelConfig fields config.json of checkpoint directory `path` gives, the names among them that fix the
  architecture: a run may not set those to other values). DataError naming the file and field."""
  return _checkpoint_fields(read_hf_json(path), os.path.join(path, CONFIG_FILE))


def _checkpoint_fields(hf: dict, file: str) -> tuple[dict, tuple[str, ...]]:
  if hf.get("model_type") == NATIVE_TYPE:
    fields = native_fields(hf, file)
    return fields, tuple(name for name in fields if name not in RUNTIME_FIELDS)
  return config_fields(hf, file), ARCHITECTURE_FIELDS


def contradiction(path: str, name: str, value: Any, fields: dict, architecture: tuple[str, ...]) -> ConfigError | None:
  """The ConfigError for ModelConfig field `name` set to `value` against checkpoint `path`'s `fields`, or None."""
  if name in architecture and name in fields and value != fields[name]:
    return ConfigError(f"model.{name}", f"contradicts {os.path.join(path, CONFIG_FILE)}, which gives "
                       f"{fields[name]!r}", value)
  return None


def read_config(path: str, **overrides: Any) -> ModelConfig:
  """The `ModelConfig` of the checkpoint directory `path`, with `overrides` (other ModelConfig fields: dtype,
  scan_layers, remat, ...). param_dtype and dtype default to the checkpoint's (bfloat16 or float32).

  DataError (naming the file and field) for a directory that is not a checkpoint or an unsupported model;
  ConfigError naming both values for an override that contradicts config.json.
  """
  hf = read_hf_json(path)  # read once: the fields and the dtype
  fields, architecture = _checkpoint_fields(hf, os.path.join(path, CONFIG_FILE))
  known = {field.name for field in dataclasses.fields(ModelConfig)}
  for name, value in overrides.items():
    if name not in known:
      raise ConfigError(f"model.{name}", "unknown field")
    if (error := contradiction(path, name, value, fields, architecture)) is not None:
      raise error
  dtype = checkpoint_dtype(hf)
  values = {"param_dtype": dtype, "dtype": dtype, **fields, **overrides}
  try:
    return ModelConfig(**values)
  except ConfigError as e:
    if e.where in overrides:
      raise e.under("model") from None
    raise DataError(f"{os.path.join(path, CONFIG_FILE)}: {e}") from None


class Source(NamedTuple):
  """Where a jaxpt parameter (one layer's part of it) comes from: HF tensor `name`; `groups` lists, in jaxpt axis
  order, (HF axis, number of consecutive jaxpt axes it is split into): jaxpt = W.transpose(hf axes).reshape."""

  name: str
  groups: tuple[tuple[int, int], ...]


def _copy(name: str, ndim: int) -> Source:
  return Source(name, tuple((axis, 1) for axis in range(ndim)))


def _layer_source(rest: tuple[str, ...], prefix: str, ndim: int) -> Source | None:
  """jaxpt path `rest` inside one layer (leaf shape of `ndim` axes, no layer axis) -> its Source."""
  attn = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "o_proj"}
  mlp = {"wi_gate": "gate_proj", "wi_up": "up_proj", "wo": "down_proj"}
  norms = {("attn_norm",): "input_layernorm", ("mlp_norm",): "post_attention_layernorm",
           ("attn", "query_norm"): "self_attn.q_norm", ("attn", "key_norm"): "self_attn.k_norm"}
  if rest[-1] == "scale" and rest[:-1] in norms:
    return _copy(f"{prefix}{norms[rest[:-1]]}.weight", 1)
  if len(rest) == 3 and (rest[0], rest[1]) in [("attn", k) for k in attn] + [("mlp", k) for k in mlp]:
    name = f"{prefix}self_attn.{attn[rest[1]]}" if rest[0] == "attn" else f"{prefix}mlp.{mlp[rest[1]]}"
    into_d_model = rest[1] in ("out", "wo")  # [*in, d] <- W [d, prod(in)]; else [d, *out] <- W [prod(out), d]
    if rest[2] == "bias":
      return Source(f"{name}.bias", ((0, ndim),))
    if rest[2] == "kernel":
      return Source(f"{name}.weight", ((1, ndim - 1), (0, 1)) if into_d_model else ((1, 1), (0, ndim - 1)))
  return None


def hf_source(path: tuple[str, ...], ndim: int) -> tuple[Source, bool] | None:
  """jaxpt parameter path -> (Source, stacked): stacked when the leaf has a leading [layers] axis (scanned), whose
  entry l reads `model.layers.{l}` (the Source name then holds `{layer}`). None for a path HF has no tensor for."""
  if path == ("embedding",):
    return _copy("model.embed_tokens.weight", 2), False
  if path == ("output", "final_norm", "scale"):
    return _copy("model.norm.weight", 1), False
  if path == ("head", "kernel"):
    return Source("lm_head.weight", ((1, 1), (0, 1))), False
  if len(path) > 2 and path[0] == "decoder":
    if path[1] == "layers":
      source = _layer_source(path[2:], "model.layers.{layer}.", ndim - 1)
      return None if source is None else (source, True)
    if path[1].startswith("layers_"):
      source = _layer_source(path[2:], f"model.layers.{path[1][len('layers_'):]}.", ndim)
      return None if source is None else (source, False)
  return None


def native_source(path: tuple[str, ...], ndim: int) -> tuple[Source, bool]:
  """Like `hf_source` for a jaxpt-native directory: one tensor per parameter (per layer: `decoder.layers.{l}.…`,
  whether the model scans its layers or not), stored in jaxpt's layout."""
  if len(path) > 2 and path[0] == "decoder" and path[1] == "layers":
    return _copy(".".join(("decoder", "layers", "{layer}") + path[2:]), ndim - 1), True
  if len(path) > 2 and path[0] == "decoder" and path[1].startswith("layers_"):
    return _copy(".".join(("decoder", "layers", path[1][len("layers_"):]) + path[2:]), ndim), False
  return _copy(".".join(path), ndim), False


def tensor_source(path: tuple[str, ...], ndim: int, native: bool) -> tuple[Source, bool] | None:
  """`native_source` for a jaxpt-native directory, else `hf_source`."""
  return native_source(path, ndim) if native else hf_source(path, ndim)


def hf_shape(source: Source, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape that jaxpt shape `shape` (one layer) reads through `source`."""
  sizes, start = {}, 0
  for axis, count in source.groups:
    sizes[axis] = math.prod(shape[start:start + count])
    start += count
  return tuple(sizes[axis] for axis in range(len(sizes)))


def read_slice(tensor, source: Source, shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
  """The jaxpt-layout block `index` (slices over `shape`) of `source`, read from safetensors slice `tensor`.

  Per group only the leading jaxpt axis narrows the HF read (a contiguous range of the flat HF axis); the other
  axes of a group are read whole and cut after the reshape (e.g. a head_dim split: never done by jaxpt's rules).
  """
  hf_index, block_shape, post, start = {}, [], [], 0
  for axis, count in source.groups:
    dims = range(start, start + count)
    spans = [index[d].indices(shape[d]) for d in dims]
    if any(step != 1 for _, _, step in spans):
      raise ValueError(f"{source.name}: strided read {index}")
    inner = math.prod(shape[d] for d in dims[1:])
    lo, hi, _ = spans[0]
    hf_index[axis] = slice(lo * inner, hi * inner)
    block_shape += [hi - lo] + [shape[d] for d in dims[1:]]
    post += [slice(None)] + [slice(lo, hi) for lo, hi, _ in spans[1:]]
    start += count
  block = tensor[tuple(hf_index[axis] for axis in range(len(hf_index)))]
  block = np.transpose(block, [axis for axis, _ in source.groups])
  return block.reshape(block_shape)[tuple(post)]


class Checkpoint:
  """The safetensors files of a checkpoint directory, open for lazy slicing (a context manager)."""

  def __init__(self, path: str):
    self.path = path
    index_file, single = os.path.join(path, INDEX_FILE), os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(index_file):
      self.where = index_file
      weight_map = read_json_object(index_file).get("weight_map")
      if not isinstance(weight_map, dict):
        raise DataError(f"{index_file}: missing field 'weight_map'")
      self.files = {name: os.path.join(path, file) for name, file in weight_map.items()}
    elif os.path.isfile(single):
      self.where, self.files = single, None
    else:
      raise DataError(f"{path}: not a Hugging Face checkpoint directory (no {WEIGHTS_FILE} or {INDEX_FILE})")
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


def check_importable(config: ModelConfig) -> None:
  """ConfigError naming the field when `config` is not a model HF checkpoints can fill (pre, RMSNorm, SwiGLU)."""
  for field, value in TRANSFORMERS_FIELDS:
    if getattr(config, field) != value:
      raise ConfigError(f"model.{field}", f"Hugging Face checkpoints load into {field}={value!r} only",
                        getattr(config, field))


def load_params(path: str, config: ModelConfig, mesh: Mesh | None = None, shardings: Any = None,
                rules: str = "fsdp_tp") -> Any:
  """The parameters of `TransformerLM(config)` read from checkpoint directory `path`, cast to config.param_dtype.

  Each leaf is made by `jax.make_array_from_callback` in its target sharding: `shardings` (a tree like the params
  of NamedSharding / Sharding), else the logical-axis rules preset `rules` on `mesh`, else the first device. A
  device's callback reads only its block of the HF tensor. DataError (naming file and tensor) for missing files,
  a truncated or unreadable safetensors file, a missing tensor, or a shape that contradicts config.json.
  """
  native = read_hf_json(path).get("model_type") == NATIVE_TYPE
  if not native:
    check_importable(config)
  boxed = jax.eval_shape(lambda: TransformerLM(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32)))
  boxed = boxed["params"]
  abstract = nn.meta.unbox(boxed)
  if shardings is None:
    if mesh is None:
      shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract)
    else:
      shardings = param_shardings(boxed, mesh, get_rules(rules))
  dtype = jnp.dtype(config.param_dtype)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  sharding_leaves = treedef.flatten_up_to(shardings)
  with Checkpoint(path) as checkpoint:
    plans = []
    for key_path, leaf in leaves:
      names = tuple(str(getattr(k, "key", k)) for k in key_path)
      found = tensor_source(names, leaf.ndim, native)
      if found is None:
        raise ConfigError("model", f"parameter {'/'.join(names)} has no Hugging Face tensor")
      source, stacked = found
      layer_shape = leaf.shape[1:] if stacked else leaf.shape
      layers = range(leaf.shape[0]) if stacked else [None]
      tensors = [checkpoint.tensor(source.name.format(layer=l), hf_shape(source, layer_shape)) for l in layers]
      plans.append((leaf.shape, source, stacked, layer_shape, tensors))
    arrays = [_build(plan, sharding, dtype) for plan, sharding in zip(plans, sharding_leaves)]
  return jax.tree_util.tree_unflatten(treedef, arrays)


def _build(plan, sharding, dtype) -> jax.Array:
  shape, source, stacked, layer_shape, tensors = plan

  def callback(index):
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
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

