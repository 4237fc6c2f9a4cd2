"""jaxpt parameters -> a Hugging Face checkpoint directory: the inverse of `jaxpt.models.hf`.

`save_hf(params, config, out_dir)` writes `config.json` + safetensors (sharded with an index above
`max_shard_bytes`) in one of two formats:

    transformers  `pre` scheme, RMSNorm, SwiGLU, no v-norm: LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM,
                  picked by the attention options (`transformers_family`), loadable by `transformers` and by jaxpt;
    jaxpt         every other model (SiameseNorm, Post-Norm, HybridNorm, LayerNorm / GELU models): a jaxpt-native
                  HF-style directory (`model_type: "jaxpt"`), which only jaxpt loads (`jaxpt.models.hf.load`).

A reward model (`save_hf(..., reward={num_scores, prompt_format})`, params of `RewardModel`) is written the same way
with its score head instead of the LM head (which it never uses): in transformers format as
Llama/Qwen2/Qwen3ForSequenceClassification (`score.weight` [num_labels = num_scores, hidden]; pad_token_id only
when the tokenizer has a pad token other than EOS, since transformers scores the last token that is not
pad_token_id and jaxpt scores the EOS that ends prompt + response), in jaxpt format as `JaxptRewardModel`; both
record num_scores and the prompt format under `jaxpt_reward`, which `jaxpt.load("hf:DIR")` reads back.

Each tensor is the inverse of its import mapping (`hf_layout.Source`: jaxpt = W.transpose(hf axes).reshape(jaxpt shape),
so W = jaxpt.reshape(group sizes).transpose(back)), one layer at a time. Arrays are gathered one parameter at a
time (`process_allgather` on multi-host meshes; only process 0 writes), so the host holds at most one shard file's
tensors plus one parameter. The directory is written beside `out_dir` and renamed into place when complete: an
export killed midway leaves no half-written checkpoint under `out_dir`. Each export lists its files in
`jaxpt_export.json`; `overwrite=True` replaces a directory only when it holds nothing else (a previous export),
and refuses any other non-empty directory, naming what is there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy for safetensors)
import numpy as np
from jax.experimental import multihost_utils
from safetensors.numpy import save_file

from jaxpt import oserrors
from jaxpt.config import ConfigError
from jaxpt.data.tokenizer import copy_tokenizer
from jaxpt.models import hf, hf_config, hf_layout
from jaxpt.models.config import ModelConfig

MAX_SHARD_BYTES = 4 * 2**30  # 4 GiB per safetensors file, as transformers' save_pretrained writes
FORMATS = ("auto", "transformers", "jaxpt")
EXPORT_MARKER = "jaxpt_export.json"  # in every export: its format and files (what --overwrite may replace)


def transformers_family(config: ModelConfig) -> tuple[str | None, str, str]:
  """(model_type, '', '') of the transformers class that computes `config`'s model, or (None, the ModelConfig
  field that rules every class out, why):

      qk_norm                                 -> qwen3  (attention_bias: q/k/v and o biases together)
      q/k/v biases without an output bias     -> qwen2
      otherwise                               -> llama  (attention_bias: q/k/v and o biases together)
  """
  for field, value in hf_config.TRANSFORMERS_FIELDS:
    if getattr(config, field) != value:
      return None, field, f"transformers' decoder models have {field}={value!r}"
  if not config.qk_norm and config.qkv_bias and not config.attn_out_bias:
    return "qwen2", "", ""
  if config.qkv_bias != config.attn_out_bias:
    return None, "attn_out_bias", (f"with qkv_bias={config.qkv_bias}"
                                   f"{' and qk_norm' if config.qk_norm else ''}: no transformers class has that")
  return ("qwen3" if config.qk_norm else "llama"), "", ""


def transformers_config(config: ModelConfig, model_type: str, special_ids: dict[str, int | None]) -> dict:
  """The config.json of `config`'s model as transformers' `model_type` class (hub form: rope_theta + rope_scaling),
  with the tokenizer's `special_ids` (bos/eos/pad_token_id)."""
  out: dict[str, Any] = dict(
      architectures=[hf_config.FAMILIES[model_type][0]], model_type=model_type, vocab_size=config.vocab_size,
      hidden_size=config.d_model, intermediate_size=config.mlp_dim, num_hidden_layers=config.num_layers,
      num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
      head_dim=config.resolved_head_dim, hidden_act="silu", max_position_embeddings=config.max_seq_len,
      rms_norm_eps=config.norm_eps, tie_word_embeddings=config.tie_embeddings, rope_theta=config.rope_theta,
      rope_scaling=None, dtype=config.param_dtype, **special_ids)
  if config.rope_scaling == "llama3":
    out["rope_scaling"] = dict(rope_type="llama3", factor=config.rope_scaling_factor,
                               low_freq_factor=config.rope_low_freq_factor,
                               high_freq_factor=config.rope_high_freq_factor,
                               original_max_position_embeddings=config.rope_original_max_len)
  if model_type == "qwen2":
    out.update(use_sliding_window=False, sliding_window=None)
  else:
    out.update(attention_bias=config.qkv_bias, mlp_bias=False)
    if model_type == "qwen3":
      out.update(use_sliding_window=False, sliding_window=None)
  return out


def native_config(config: ModelConfig, special_ids: dict[str, int | None]) -> dict:
  """The config.json of a jaxpt-native directory: the whole ModelConfig under `jaxpt_model`."""
  return dict(architectures=[hf_config.NATIVE_ARCHITECTURE], model_type=hf_config.NATIVE_TYPE, dtype=config.param_dtype,
              jaxpt_model=dataclasses.asdict(config), **special_ids)


SCORE_NAMES = {1: ["reward"], 2: ["quality", "length"]}  # id2label of a reward model (ODIN: r_Q, r_L)


def reward_config(hf_json: dict, family: str | None, reward: dict) -> dict:
  """`hf_json` (the backbone's config.json) as a reward model's: its architecture, labels and `jaxpt_reward`."""
  num_scores = reward["num_scores"]
  names = SCORE_NAMES.get(num_scores, [f"score_{i}" for i in range(num_scores)])
  out = dict(hf_json, architectures=[hf_config.SEQUENCE_CLASSIFIERS[family] if family else
                                     hf_config.NATIVE_REWARD_ARCHITECTURE],
             id2label={str(i): name for i, name in enumerate(names)},
             label2id={name: i for i, name in enumerate(names)},
             **{hf_config.REWARD_KEY: dict(num_scores=num_scores, score_names=names,
                                           prompt_format=reward.get("prompt_format", "plain"))})
  eos = out.get("eos_token_id")
  if family and out.get("pad_token_id") in (eos if isinstance(eos, list) else [eos]):
    out.pop("pad_token_id")  # transformers would skip the scored EOS as padding
  return out


def to_hf_layout(block: np.ndarray, source: hf_layout.Source) -> np.ndarray:
  """One layer's jaxpt array -> the HF tensor `source` names (the inverse of `hf_layout.read_slice` on the whole
  array)."""
  sizes, start = [], 0
  for _, count in source.groups:
    sizes.append(int(np.prod(block.shape[start:start + count], dtype=np.int64)))
    start += count
  return np.transpose(block.reshape(sizes), np.argsort([axis for axis, _ in source.groups]))


def host_value(leaf: jax.Array) -> np.ndarray:
  """The whole of `leaf` on this host (every process must call this: multi-host gathers are collective)."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return np.asarray(jax.device_get(leaf))


def hf_tensors(params: Any, native: bool) -> Iterator[tuple[str, np.ndarray]]:
  """(HF tensor name, array) for every tensor of the checkpoint, one parameter gathered at a time."""
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]:
    names = tuple(str(getattr(k, "key", k)) for k in key_path)
    found = hf_layout.tensor_source(names, np.ndim(leaf), native)
    if found is None:
      raise ConfigError("model", f"parameter {'/'.join(names)} has no Hugging Face tensor")
    source, stacked = found
    value = host_value(leaf)
    if stacked:
      for layer in range(value.shape[0]):
        yield source.name.format(layer=layer), np.ascontiguousarray(to_hf_layout(value[layer], source))
    else:
      yield source.name, np.ascontiguousarray(to_hf_layout(value, source))


def reward_tensors(params: Any, native: bool) -> Iterator[tuple[str, np.ndarray]]:
  """`hf_tensors` of a `RewardModel`'s params: the backbone's without its (unused) LM head, then score.weight."""
  params = nn.meta.unbox(params)
  backbone = {name: value for name, value in params["backbone"].items() if name != hf_layout.LM_HEAD_PATH[0]}
  yield from hf_tensors(backbone, native)
  head = host_value(params[hf_layout.REWARD_HEAD_PATH[0]][hf_layout.REWARD_HEAD_PATH[1]])
  yield hf_layout.SCORE_SOURCE.name, np.ascontiguousarray(to_hf_layout(head, hf_layout.SCORE_SOURCE))


def _shard_names(count: int, weights_file: str = hf.WEIGHTS_FILE) -> list[str]:
  if count == 1:
    return [weights_file]
  return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _write_tensors(tensors: Iterator[tuple[str, np.ndarray]], directory: str, max_shard_bytes: int,
                   write: bool, weights_file: str = hf.WEIGHTS_FILE) -> None:
  """Safetensors files of at most ~max_shard_bytes each (one file: `weights_file`; more: numbered + index).
  Every tensor is drawn from `tensors` on every process (the gathers are collective), also after a failed write,
  which is raised at the end."""
  shards: list[list[str]] = []
  buffer: dict[str, np.ndarray] = {}
  size = total = 0
  error = None

  def flush():
    nonlocal buffer, size, error
    if buffer and error is None:
      path = os.path.join(directory, f"part-{len(shards)}.safetensors")
      try:
        with oserrors.writing(path):  # safetensors' SafetensorError for a full disk -> OSError(ENOSPC, ..., path)
          save_file(buffer, path, metadata={"format": "pt"})
      except OSError as e:  # a full disk: keep drawing tensors so the other processes' gathers complete
        error = e
      shards.append(list(buffer))
    buffer, size = {}, 0

  for name, array in tensors:
    if not write:  # the other processes only take part in the gathers
      continue
    if buffer and size + array.nbytes > max_shard_bytes:
      flush()
    buffer[name] = array
    size += array.nbytes
    total += array.nbytes
  if not write:
    return
  flush()
  if error is not None:
    raise error
  files = _shard_names(len(shards), weights_file)
  for i, file in enumerate(files):
    os.replace(os.path.join(directory, f"part-{i}.safetensors"), os.path.join(directory, file))
  if len(files) > 1:
    weight_map = {name: file for file, names in zip(files, shards) for name in names}
    with open(os.path.join(directory, hf.INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def _files_under(directory: str) -> list[str]:
  """Every file under `directory` (hidden ones too), relative to it, sorted; also each empty folder ('sub/') and
  each link to a folder (never followed): a replacement would lose them too."""
  found = []
  for folder, dirs, names in os.walk(directory):
    relative = os.path.relpath(folder, directory)
    found += [os.path.normpath(os.path.join(relative, n)) for n in names]
    found += [os.path.normpath(os.path.join(relative, d)) for d in dirs if os.path.islink(os.path.join(folder, d))]
    if folder != directory and not dirs and not names:
      found.append(f"{relative}/")
  return sorted(found)


def _previous_export(out_dir: str) -> list[str]:
  """The files of `out_dir` that its EXPORT_MARKER (written by the export that made it) does not list: what a
  replacement would lose. Every file, when there is no readable marker."""
  present = _files_under(out_dir)
  try:
    with open(os.path.join(out_dir, EXPORT_MARKER)) as f:
      written = set(json.load(f)["files"]) | {EXPORT_MARKER}
  except (OSError, ValueError, KeyError, TypeError):
    return present
  return [f for f in present if f not in written]


def _check_out_dir(out_dir: str, overwrite: bool) -> None:
  """Raises FileExistsError (one line naming what is there) unless `out_dir` is absent, an empty directory, or,
  with `overwrite`, a previous export holding only the files it wrote."""
  if os.path.islink(out_dir):
    raise FileExistsError(f"{out_dir}: is a symbolic link (expected a new or empty directory)")
  if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"{out_dir}: is a file (expected a new or empty directory)")
  if os.path.isdir(os.path.join(out_dir, "checkpoints")):
    raise FileExistsError(f"{out_dir}: holds a jaxpt run (checkpoints/); never written over, --overwrite or not")
  if not os.path.isdir(out_dir) or not os.listdir(out_dir):
    return
  if not overwrite:
    raise FileExistsError(f"{out_dir}: exists and is not empty (choose a new directory, or overwrite=True / "
                          "--overwrite)")
  _refuse_foreign(out_dir, _previous_export(out_dir))


def _refuse_foreign(out_dir: str, foreign: list[str]) -> None:
  """FileExistsError naming the `foreign` files of `out_dir` (those no export wrote), if there are any."""
  if foreign:
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    raise FileExistsError(f"{out_dir}: holds files no jaxpt export wrote ({shown}); --overwrite replaces only a "
                          f"previous export (one with its {EXPORT_MARKER}): choose another directory")


def _replace(out_dir: str, new: str, old: str) -> None:
  """Moves the finished export `new` to `out_dir`. An `out_dir` there (checked at the start: empty, or a previous
  export) is first moved to `old` and checked again there, where nothing can be added to it any more: if it holds
  files no export wrote (added while the tensors were written), or the move of `new` fails, it is moved back. The
  caller removes `old` once `new` is in place; a kill in between leaves both, nothing lost."""
  if os.path.isdir(out_dir):
    os.rename(out_dir, old)
    try:
      _refuse_foreign(out_dir, _previous_export(old) if os.listdir(old) else [])
      os.rename(new, out_dir)
    except BaseException:
      os.rename(old, out_dir)
      raise
  else:
    os.rename(new, out_dir)


def _write_marker(directory: str, format: str) -> None:
  """`directory/EXPORT_MARKER`: the export's format and every file it wrote, so `--overwrite` can tell a previous
  export (replaced) from anything else (refused)."""
  record = {"format": format, "files": _files_under(directory)}
  with open(os.path.join(directory, EXPORT_MARKER), "w") as f:
    json.dump(record, f, indent=2)


def _on_process_0(action: Callable[[], None], others: Callable[[], None] = lambda: None) -> None:
  """Runs `action` on process 0 (`others` on the rest) and raises process 0's error on every process: a
  multi-host caller must not be left waiting in a collective that process 0 never reaches."""
  error = None
  if jax.process_index() == 0:
    try:
      action()
    except Exception as e:  # re-raised below, on every process
      error = e
  else:
    others()
  if jax.process_count() > 1:
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if failed and error is None:
      raise RuntimeError("the export failed on process 0 (its error is in process 0's log)")
  if error is not None:
    raise error


def save_hf(params: Any, config: ModelConfig, out_dir: str, *, format: str = "auto",
            special_ids: dict[str, int | None] | None = None, tokenizer_dir: str | None = None,
            max_shard_bytes: int = MAX_SHARD_BYTES, overwrite: bool = False, reward: dict | None = None) -> str:
  """Writes `TransformerLM(config)`'s `params` to `out_dir` as a Hugging Face checkpoint; returns the format used.
  With `reward` ({num_scores, prompt_format}), `params` are `RewardModel(config, num_scores)`'s and the checkpoint
  is a reward model's (module docstring).

  format: `transformers` (ConfigError naming the model field that no transformers class has), `jaxpt` (native),
  or `auto` (transformers when possible). special_ids: bos/eos/pad_token_id for config.json. tokenizer_dir: its
  tokenizer files (tokenizer.json and companions, or jaxpt's spm.model) are copied along. Tensors are written in
  `config.param_dtype`. FileExistsError (one line naming what is there) when `out_dir` is a file, a link or a
  non-empty directory; with `overwrite`, a previous export that holds only the files it wrote is replaced.
  Multi-host: every process calls it (the gathers are collective), process 0 writes.
  """
  if format not in FORMATS:
    raise ConfigError("format", f"must be one of {', '.join(FORMATS)}", format)
  family, field, why = transformers_family(config)
  if format == "transformers" and family is None:
    raise ConfigError(f"model.{field}", f"no transformers class ({why}); use format='jaxpt'", getattr(config, field))
  native = format == "jaxpt" or family is None
  ids = {k: v for k, v in (special_ids or {}).items() if v is not None}
  hf_json = native_config(config, ids) if native else transformers_config(config, family, ids)
  if reward is not None:
    hf_json = reward_config(hf_json, None if native else family, reward)

  def files(directory: str) -> None:
    with open(os.path.join(directory, hf_config.CONFIG_FILE), "w") as f:
      json.dump(hf_json, f, indent=2, sort_keys=True)
    if tokenizer_dir is not None:
      copy_tokenizer(tokenizer_dir, directory)

  tensors = hf_tensors(params, native) if reward is None else reward_tensors(params, native)
  write_export(out_dir, tensors, files, "jaxpt" if native else "transformers", overwrite=overwrite,
               max_shard_bytes=max_shard_bytes)
  return "jaxpt" if native else "transformers"


def write_export(out_dir: str, tensors: Iterator[tuple[str, np.ndarray]], files: Callable[[str], None], format: str,
                 *, overwrite: bool = False, max_shard_bytes: int = MAX_SHARD_BYTES,
                 weights_file: str = hf.WEIGHTS_FILE) -> None:
  """Writes an export to `out_dir`: the (name, array) `tensors` as safetensors (`weights_file`, or shards above
  `max_shard_bytes`), then `files(directory)` (config.json and the like) and the EXPORT_MARKER recording `format`,
  into a folder beside `out_dir` renamed into place when complete (`save_hf`). FileExistsError (one line) for an
  `out_dir` that `_check_out_dir` refuses. Multi-host: every process calls it, process 0 writes."""
  write = jax.process_index() == 0
  out_dir = os.path.abspath(os.path.expanduser(out_dir))
  work: list[str] = []  # process 0: a new folder beside out_dir (new/: the export, old/: the one it replaces)

  def start() -> None:
    _check_out_dir(out_dir, overwrite)
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    work.append(tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.export-", dir=os.path.dirname(out_dir)))
    os.makedirs(os.path.join(work[0], "new"))

  def finish() -> None:
    partial = os.path.join(work[0], "new")
    files(partial)
    _write_marker(partial, format)
    _replace(out_dir, partial, os.path.join(work[0], "old"))

  _on_process_0(start)  # before any gather: a refused out_dir stops every process
  try:
    _on_process_0(lambda: _write_tensors(tensors, os.path.join(work[0], "new"), max_shard_bytes, True, weights_file),
                  others=lambda: _write_tensors(tensors, "", max_shard_bytes, write=False))
    _on_process_0(finish)
  finally:
    if write and work:
      shutil.rmtree(work[0], ignore_errors=True)  # made by this call: the unfinished export or the replaced one
