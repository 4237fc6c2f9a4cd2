"""Where each jaxpt parameter lives in a Hugging Face checkpoint: tensor names, layout, and sliced reads.

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
A reward model (`RewardModel`: `backbone/...` as above, `head/kernel` [d, num_scores]) is transformers' sequence
classifier: the backbone's tensors, no lm_head, and score.weight [num_scores, d], transposed (`SCORE_SOURCE`).

RoPE: jaxpt pairs head dimension i with i + D/2 (rotate-half, `jaxpt.nn.rope`), as HF's `apply_rotary_pos_emb`
does, so q/k rows are taken as stored: no permutation (the one in Meta -> HF Llama conversion scripts turns the
original interleaved layout into this one; HF checkpoints are already in it). Equations of these models as jaxpt
computes them: x + Attn(RMSNorm(x)), x + SwiGLU(RMSNorm(x)), logits = RMSNorm(x) W_head, RMSNorm in float32.

jaxpt-native directories (`model_type: "jaxpt"`, written by `jaxpt.models.hf_export` for models transformers has
no class for: SiameseNorm, Post-Norm, HybridNorm, LayerNorm or GELU models) hold one tensor per jaxpt parameter and
layer, named by its path (`decoder.layers.{l}.in1.scale`, `embedding`), in jaxpt's layout.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Source(NamedTuple):
  """Where a jaxpt parameter (one layer's part of it) comes from: HF tensor `name`; `groups` lists, in jaxpt axis
  order, (HF axis, number of consecutive jaxpt axes it is split into): jaxpt = W.transpose(hf axes).reshape."""

  name: str
  groups: tuple[tuple[int, int], ...]


LM_HEAD_PATH = ("head", "kernel")  # a TransformerLM's untied output head [d, V]: lm_head.weight
REWARD_HEAD_PATH = ("head", "kernel")  # a RewardModel's score head [d, num_scores]; its backbone is under "backbone"
SCORE_SOURCE = Source("score.weight", ((1, 1), (0, 1)))  # <- [num_scores, d], in both formats


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
  if path == LM_HEAD_PATH:
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
