"""Hugging Face config.json -> jaxpt `ModelConfig`: which checkpoints jaxpt reads and with which fields.

`read_config(path, **overrides)` maps the config.json of a checkpoint directory (Llama, Mistral, Qwen2 / Qwen2.5,
Qwen3) to a `ModelConfig` in jaxpt's `pre` scheme (RMSNorm, SwiGLU); an override that contradicts the checkpoint is
a ConfigError. A jaxpt-native directory (`model_type: "jaxpt"`, written by `jaxpt.models.hf_export`) holds its
ModelConfig under `jaxpt_model`.

Not supported, each refused naming the config.json field: activations other than silu, MLP biases, sliding-window
attention in Qwen2/3 (`use_sliding_window`), RoPE types other than default and llama3, partial rotary.
Mistral's `sliding_window` W is exact for sequences up to W, so it caps `max_seq_len` at W.

Reward models (`jaxpt.models.hf_export` writes them; `reward_record` reads them): transformers' sequence classifiers
(`LlamaForSequenceClassification`, Qwen2 / Qwen3 likewise: the backbone + `score.weight` [num_labels, hidden]) or a
jaxpt-native `JaxptRewardModel`, with what jaxpt needs to score as the run did under `jaxpt_reward` (num_scores and
the prompt format the reward model was trained with). A language-model read of one is a DataError naming the file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxpt.config import ConfigError, DataError, read_json_object
from jaxpt.models.config import ModelConfig

CONFIG_FILE = "config.json"
NATIVE_TYPE = "jaxpt"  # config.json model_type of a jaxpt-native directory
NATIVE_ARCHITECTURE = "JaxptTransformerLM"
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
SEQUENCE_CLASSIFIERS = {"llama": "LlamaForSequenceClassification", "mistral": "MistralForSequenceClassification",
                        "qwen2": "Qwen2ForSequenceClassification", "qwen3": "Qwen3ForSequenceClassification"}
NATIVE_REWARD_ARCHITECTURE = "JaxptRewardModel"
REWARD_KEY = "jaxpt_reward"  # config.json of a reward-model export: {num_scores, score_names, prompt_format}
PROMPT_FORMATS = ("plain", "chat")
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


def is_reward_model(hf: dict) -> bool:
  """Whether HF config dict `hf` describes a reward model (a sequence classifier, or jaxpt's native one)."""
  return (hf.get("architectures") or [None])[0] in (*SEQUENCE_CLASSIFIERS.values(), NATIVE_REWARD_ARCHITECTURE)


def reward_record(hf: dict, file: str = CONFIG_FILE) -> dict | None:
  """{num_scores, prompt_format} of a reward-model config.json (None for a language model): from its `jaxpt_reward`
  record, else (a sequence classifier written by another tool) num_labels and plain prompts. DataError naming the
  file and field for a record that contradicts itself."""
  if not is_reward_model(hf):
    return None
  record = hf.get(REWARD_KEY)
  labels = hf.get("id2label")
  num_labels = len(labels) if isinstance(labels, dict) and labels else hf.get("num_labels", 2)
  if record is None:
    return dict(num_scores=num_labels, prompt_format="plain")
  if not isinstance(record, dict):
    raise DataError(f"{file}: {REWARD_KEY}: not an object")
  num_scores, prompt_format = record.get("num_scores"), record.get("prompt_format", "plain")
  if not isinstance(num_scores, int) or num_scores < 1 or (isinstance(labels, dict) and num_scores != num_labels):
    raise DataError(f"{file}: {REWARD_KEY}.num_scores={num_scores!r}: must be an int >= 1 (and the number of "
                    "id2label entries)")
  if prompt_format not in PROMPT_FORMATS:
    raise DataError(f"{file}: {REWARD_KEY}.prompt_format={prompt_format!r}: must be one of "
                    f"{', '.join(PROMPT_FORMATS)}")
  return dict(num_scores=num_scores, prompt_format=prompt_format)


def _check_kind(hf: dict, file: str, reward: bool) -> None:
  """DataError naming the file when it holds a reward model and a language model was asked for, or the reverse."""
  if is_reward_model(hf) and not reward:
    raise DataError(f"{file}: architectures={hf.get('architectures')!r}: a reward model, not a causal language "
                    "model (jaxpt.load('hf:DIR') reads it as a reward model)")
  if reward and not is_reward_model(hf):
    raise DataError(f"{file}: architectures={hf.get('architectures')!r}: a language model, not a reward model")


def config_fields(hf: dict, file: str = CONFIG_FILE) -> dict:
  """The ModelConfig fields (pre scheme, RMSNorm, SwiGLU) that HF config dict `hf` (from `file`) describes (of the
  backbone, for a sequence classifier)."""
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    raise DataError(f"{file}: model_type={model_type!r}: unsupported (supported: {', '.join(FAMILIES)})")
  architecture, family_defaults = FAMILIES[model_type]
  architectures = hf.get("architectures") or [architecture]
  if architectures not in ([architecture], [SEQUENCE_CLASSIFIERS[model_type]]):
    raise DataError(f"{file}: architectures={architectures!r}: unsupported for model_type={model_type!r} "
                    f"(supported: [{architecture!r}], [{SEQUENCE_CLASSIFIERS[model_type]!r}])")
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


def checkpoint_fields(path: str, reward: bool = False) -> tuple[dict, tuple[str, ...]]:
  """(the ModelConfig fields config.json of checkpoint directory `path` gives, the names among them that fix the
  architecture: a run may not set those to other values). DataError naming the file and field, also for a reward
  model (`reward=False`) or a language model (`reward=True`)."""
  return _checkpoint_fields(read_hf_json(path), os.path.join(path, CONFIG_FILE), reward)


def _checkpoint_fields(hf: dict, file: str, reward: bool = False) -> tuple[dict, tuple[str, ...]]:
  _check_kind(hf, file, reward)
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


def read_config(path: str, reward: bool = False, **overrides: Any) -> ModelConfig:
  """The `ModelConfig` of the checkpoint directory `path` (a reward model's backbone with `reward`), with
  `overrides` (other ModelConfig fields: dtype, scan_layers, remat, ...). param_dtype and dtype default to the
  checkpoint's (bfloat16 or float32).

  DataError (naming the file and field) for a directory that is not a checkpoint or an unsupported model;
  ConfigError naming both values for an override that contradicts config.json.
  """
  hf = read_hf_json(path)  # read once: the fields and the dtype
  fields, architecture = _checkpoint_fields(hf, os.path.join(path, CONFIG_FILE), reward)
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


def check_importable(config: ModelConfig) -> None:
  """ConfigError naming the field when `config` is not a model HF checkpoints can fill (pre, RMSNorm, SwiGLU)."""
  for field, value in TRANSFORMERS_FIELDS:
    if getattr(config, field) != value:
      raise ConfigError(f"model.{field}", f"Hugging Face checkpoints load into {field}={value!r} only",
                        getattr(config, field))
