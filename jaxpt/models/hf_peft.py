"""LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`), as
`peft.PeftModel.save_pretrained` writes them for transformers' Llama / Qwen2 / Qwen3 causal LMs.

PEFT's adapter of `nn.Linear` weight W [out, in] is y = x W^T + s x A^T B^T, A = lora_A.weight [r, in], B =
lora_B.weight [out, r], s = lora_alpha / r (use_rslora: lora_alpha / sqrt(r)); jaxpt's (`jaxpt.nn.lora`) is
y = x W + s (x A) B with A [*in, r], B [r, *out], so jaxpt's A is PEFT's A^T and jaxpt's B is PEFT's B^T, the
jaxpt axes flattened in the order the kernel's are (`jaxpt.models.hf_layout`):

    attn/query/lora_a [d, r]       <- base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight [r, d]
    attn/query/lora_b [r, H, D]    <- ...self_attn.q_proj.lora_B.weight [H*D, r] (k_proj, v_proj likewise)
    attn/out/lora_a [H, D, r]      <- ...self_attn.o_proj.lora_A.weight [r, H*D]
    attn/out/lora_b [r, d]         <- ...self_attn.o_proj.lora_B.weight [d, r]
    mlp/wi_gate, wi_up, wo         <- ...mlp.gate_proj, up_proj, down_proj likewise

jaxpt's projections are PEFT's target modules: q -> q_proj, k -> k_proj, v -> v_proj, o -> o_proj, mlp_in ->
gate_proj and up_proj (both or neither), mlp_out -> down_proj. r, lora_alpha, use_rslora, lora_dropout and
target_modules are jaxpt's lora.rank, alpha, rslora, dropout and targets; PEFT options jaxpt's LoRA does not have
(DoRA, biases, modules_to_save, per-layer ranks, layers_to_transform, ...) are refused in one line.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import flax.linen as nn
import jax
import numpy as np
from safetensors import SafetensorError, safe_open

from jaxpt.config import ConfigError, DataError
from jaxpt.models import hf, hf_export, hf_layout
from jaxpt.models.config import ModelConfig
from jaxpt.nn.lora import PROJECTIONS, LoRAConfig, adapter_params

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PeftModelForCausalLM -> LoraModel -> the transformers model
MODULES = {"q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",), "o": ("o_proj",),
           "mlp_in": ("gate_proj", "up_proj"), "mlp_out": ("down_proj",)}  # jaxpt projection -> PEFT target modules
MATRICES = {"lora_a": "lora_A", "lora_b": "lora_B"}
# adapter_config.json fields of PEFT features jaxpt's LoRA does not have: refused unless off (None, False, {}, ...)
UNSUPPORTED = ("use_dora", "lora_bias", "fan_in_fan_out", "modules_to_save", "layers_to_transform", "rank_pattern",
               "alpha_pattern", "layer_replication", "trainable_token_indices", "target_parameters",
               "alora_invocation_tokens", "use_qalora", "exclude_modules")
OFF = (None, False, "none", {}, [])


def adapter_source(path: tuple[str, ...], ndim: int) -> tuple[hf_layout.Source, bool] | None:
  """jaxpt adapter path (`.../query/lora_a`) -> (Source of its PEFT tensor, stacked), as `hf_layout.hf_source`
  maps kernels; None for a path that is no adapter of a projection PEFT names."""
  if len(path) < 2 or path[-1] not in MATRICES:
    return None
  found = hf_layout.hf_source(path[:-1] + ("kernel",), ndim)
  if found is None:
    return None
  kernel, stacked = found
  module = kernel.name[:-len(".weight")]
  n = ndim - 1 if stacked else ndim  # one layer's axes: A [*in, r] <- [r, prod(in)], B [r, *out] <- [prod(out), r]
  groups = ((1, n - 1), (0, 1)) if path[-1] == "lora_a" else ((1, 1), (0, n - 1))
  return hf_layout.Source(f"{PREFIX}{module}.{MATRICES[path[-1]]}.weight", groups), stacked


def _names(key_path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", k)) for k in key_path)


def expected_tensors(model: ModelConfig, lora: LoRAConfig) -> dict[str, tuple[str, tuple[int, int]]]:
  """PEFT tensor name -> (jaxpt projection, HF shape) of every adapter of `model` with `lora`'s rank and targets."""
  dims = model.projection_dims()
  out = {}
  for projection in lora.spec().targets:
    k, n = dims[projection]
    for module in MODULES[projection]:
      where = "self_attn" if projection in ("q", "k", "v", "o") else "mlp"
      for layer in range(model.num_layers):
        stem = f"{PREFIX}model.layers.{layer}.{where}.{module}"
        out[f"{stem}.lora_A.weight"] = (projection, (lora.rank, k))
        out[f"{stem}.lora_B.weight"] = (projection, (n, lora.rank))
  return out


def _targets(modules: Any, where: str, field: str, directory: str) -> str:
  """PEFT target_modules (a list of module names, or 'all-linear') -> jaxpt's `lora.targets`."""
  if modules == "all-linear":
    return ",".join(PROJECTIONS)
  if not isinstance(modules, list) or not modules:
    raise ConfigError(field, f"{where}: target_modules={modules!r}: jaxpt reads a list of module names "
                      f"({', '.join(m for ms in MODULES.values() for m in ms)}) or 'all-linear'", directory)
  known = {module: projection for projection, ms in MODULES.items() for module in ms}
  unknown = [m for m in modules if m not in known]
  if unknown:
    raise ConfigError(field, f"{where}: target module {unknown[0]!r} has no LoRA in jaxpt (jaxpt adapts "
                      f"{', '.join(known)})", directory)
  chosen = set(modules)
  for projection, ms in MODULES.items():
    if len(ms) > 1 and 0 < len(chosen & set(ms)) < len(ms):
      raise ConfigError(field, f"{where}: target_modules has {sorted(chosen & set(ms))[0]} without "
                        f"{sorted(set(ms) - chosen)[0]} (jaxpt's {projection} adapts both)", directory)
  return ",".join(p for p in PROJECTIONS if any(m in chosen for m in MODULES[p]))


def read_adapter_fields(directory: str, field: str = "lora.init_adapter") -> dict[str, Any]:
  """The `lora` fields (rank, alpha, rslora, dropout, targets) of the PEFT adapter in `directory`, from its
  adapter_config.json; ConfigError naming `field` and the file for a missing or unreadable file, another PEFT
  method than LoRA, or a LoRA option jaxpt does not have."""
  where = os.path.join(directory, ADAPTER_CONFIG)
  if not os.path.isfile(where):
    raise ConfigError(field, f"{directory}: no {ADAPTER_CONFIG} (expected a PEFT adapter directory, as "
                      "save_pretrained or `jaxpt export-hf --adapters` writes)", directory)
  if not os.path.isfile(os.path.join(directory, ADAPTER_WEIGHTS)):
    raise ConfigError(field, f"{directory}: no {ADAPTER_WEIGHTS} (jaxpt reads PEFT adapters in safetensors)",
                      directory)
  try:
    with open(where) as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(field, f"{where}: not readable JSON ({e})", directory) from None
  if not isinstance(config, dict):
    raise ConfigError(field, f"{where}: not a JSON object", directory)
  if config.get("peft_type") != "LORA":
    raise ConfigError(field, f"{where}: peft_type={config.get('peft_type')!r}: jaxpt reads LoRA adapters ('LORA')",
                      directory)
  for name in UNSUPPORTED:
    if config.get(name) not in OFF:
      raise ConfigError(field, f"{where}: {name}={config[name]!r}: a PEFT option jaxpt's LoRA does not have",
                        directory)
  if config.get("bias", "none") != "none":
    raise ConfigError(field, f"{where}: bias={config['bias']!r}: jaxpt's adapters have no biases ('none')",
                      directory)
  rank, alpha = config.get("r"), config.get("lora_alpha")
  if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
    raise ConfigError(field, f"{where}: r={rank!r}: must be a positive integer", directory)
  if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
    raise ConfigError(field, f"{where}: lora_alpha={alpha!r}: must be a positive number", directory)
  return dict(rank=rank, alpha=float(alpha), rslora=bool(config.get("use_rslora", False)),
              dropout=float(config.get("lora_dropout") or 0.0),
              targets=_targets(config.get("target_modules"), where, field, directory))


def adapter_lora(directory: str, field: str = "adapter") -> LoRAConfig:
  """The `lora` section of the PEFT adapter in `directory` (`read_adapter_fields`), its init_adapter `directory`."""
  return LoRAConfig(**read_adapter_fields(directory, field), init_adapter=directory)


def check_adapter(directory: str, model: ModelConfig, lora: LoRAConfig, field: str = "lora.init_adapter") -> None:
  """ConfigError naming `field` and the file unless `directory`'s adapter_model.safetensors holds exactly the
  adapters of `model` with `lora`'s rank and targets, in their shapes (from the file's header: no tensor is read),
  and `model` is one transformers has a class for (PEFT adapters name its modules)."""
  family, name, why = hf_export.transformers_family(model)
  if family is None:
    raise ConfigError(field, f"PEFT adapters need a model transformers has a class for (model.{name}: {why})",
                      directory)
  where = os.path.join(directory, ADAPTER_WEIGHTS)
  try:
    with safe_open(where, framework="numpy") as f:
      present = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
  except (OSError, SafetensorError) as e:
    raise ConfigError(field, f"{where}: truncated or not a safetensors file ({e})", directory) from None
  expected = expected_tensors(model, lora)
  for name in sorted(expected):
    if name not in present:
      raise ConfigError(field, f"{where}: missing tensor {name!r} (lora.targets={lora.targets!r}, "
                        f"{model.num_layers} layers)", directory)
  for name in sorted(present):
    if name not in expected:
      raise ConfigError(field, f"{where}: tensor {name!r} is no adapter of lora.targets={lora.targets!r} "
                        f"over {model.num_layers} layers", directory)
    projection, shape = expected[name]
    if present[name] != shape:
      raise ConfigError(field, f"{where}: tensor {name!r} has shape {list(present[name])}; the model's {projection} "
                        f"adapter with rank {lora.rank} is {list(shape)} (a base with other shapes?)", directory)


def load_adapters(directory: str, template: Any, field: str = "lora.init_adapter") -> Any:
  """The adapters of `template` (a params tree of arrays or ShapeDtypeStructs with shardings; only its adapter
  leaves are read) from `directory`'s adapter_model.safetensors, each array made in its template leaf's sharding
  (float32). Call `check_adapter` first: a tensor that is missing here is a ConfigError naming `field`."""
  abstract = adapter_params(nn.meta.unbox(template))
  shardings = jax.tree.map(lambda leaf: leaf.sharding, abstract)

  def locate(names, ndim):
    return adapter_source(names, ndim), np.dtype(np.float32)

  try:
    return hf.load_tree(directory, abstract, locate, None, shardings, "fsdp_tp", weights_file=ADAPTER_WEIGHTS)
  except DataError as e:
    raise ConfigError(field, str(e), directory) from None


def adapter_tensors(params: Any) -> Iterator[tuple[str, np.ndarray]]:
  """(PEFT tensor name, float32 array) of every adapter leaf of `params`, one parameter gathered at a time."""
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(adapter_params(nn.meta.unbox(params)))[0]:
    names = _names(key_path)
    found = adapter_source(names, np.ndim(leaf))
    if found is None:
      raise ConfigError("lora.targets", f"adapter {'/'.join(names)} has no PEFT tensor")
    source, stacked = found
    value = np.asarray(hf_export.host_value(leaf), np.float32)
    for layer in range(value.shape[0]) if stacked else [None]:
      block = value if layer is None else value[layer]
      yield source.name.format(layer=layer), np.ascontiguousarray(hf_export.to_hf_layout(block, source))


def adapter_config(lora: LoRAConfig, base_model: str | None) -> dict:
  """The adapter_config.json of adapters with `lora`'s settings over `base_model` (a transformers checkpoint
  directory, or None when the base is no HF checkpoint): PEFT's LoraConfig fields, the others at PEFT's defaults."""
  modules = [m for projection in lora.spec().targets for m in MODULES[projection]]
  return dict(peft_type="LORA", task_type="CAUSAL_LM", base_model_name_or_path=base_model, revision=None,
              r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, use_rslora=lora.rslora,
              target_modules=modules, bias="none", fan_in_fan_out=False, modules_to_save=None, use_dora=False,
              init_lora_weights=True, layers_to_transform=None, layers_pattern=None, rank_pattern={},
              alpha_pattern={}, inference_mode=True)



def save_adapters(params: Any, config: ModelConfig, lora: LoRAConfig, out_dir: str, *, base_model: str | None = None,
                  overwrite: bool = False) -> None:
  """Writes the adapters of `params` (`TransformerLM(config, lora=lora.spec())`'s params, or only their adapter
  leaves) to `out_dir` in PEFT's format: adapter_config.json (`adapter_config`) + adapter_model.safetensors
  (float32), which `peft.PeftModel.from_pretrained` loads on the transformers model of `base_model`. ConfigError
  for a run without LoRA or a model transformers has no class for; FileExistsError as `hf_export.save_hf`
  (`overwrite` replaces a previous export). Multi-host: every process calls it, process 0 writes."""
  if not lora.enabled:
    raise ConfigError("lora.rank", "the model has no LoRA adapters to save (rank 0)", lora.rank)
  family, name, why = hf_export.transformers_family(config)
  if family is None:
    raise ConfigError(f"model.{name}", f"PEFT adapters need a model transformers has a class for ({why}); export "
                      "the merged model instead", getattr(config, name))
  record = adapter_config(lora, base_model)

  def files(directory: str) -> None:
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
      json.dump(record, f, indent=2, sort_keys=True)

  hf_export.write_export(out_dir, adapter_tensors(params), files, "peft", overwrite=overwrite,
                         max_shard_bytes=1 << 62, weights_file=ADAPTER_WEIGHTS)
