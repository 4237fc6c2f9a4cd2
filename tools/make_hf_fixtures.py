"""Writes the Hugging Face parity fixtures of `tests/test_models_hf.py` and `tests/test_data_hf_tokenizer.py`
(needs torch + transformers + tokenizers; not jaxpt).

One tiny random model per family under `tests/assets/hf/<family>/`:
    config.json, generation_config.json   as `save_pretrained` writes them (llama: rewritten in the hub's
                                           `rope_theta` + `rope_scaling` form, which transformers reads back alike)
    model.safetensors                      fp32 (mistral: two shards + model.safetensors.index.json)
    reference.npz                          input_ids int32 [2, 12]; logits float32 [2, 12, vocab] (fp32 eager
                                           forward); greedy int32 [2, 8] (`generate(do_sample=False)`, no EOS stop)

Families: llama (Llama-3 rope scaling, rope_theta 5e5, untied), mistral (sliding window 64 < 128 positions,
untied, sharded), qwen2 (q/k/v biases, tied), qwen3 (q/k RMSNorm, head_dim 32 != 64 / 4, norm eps 0.02, tied).
Weights are redrawn from a seeded NumPy generator at a scale that makes the greedy choices clear (top-1 vs top-2
logit gap checked), so a rerun with the same torch/transformers writes the same files byte for byte.

Each family also gets a tokenizer (see make_hf_tokenizers.py), written by `PreTrainedTokenizerFast.save_pretrained`:
    tokenizer.json, tokenizer_config.json  a tiny BPE (<= 256 ids, the models' vocab_size) trained on a fixed text
    chat_template.jinja (llama, qwen3)     qwen2 keeps its template in tokenizer_config.json (the hub's Qwen2.5
                                           form), mistral a list of named templates there
    tokenizer_reference.json               AutoTokenizer's encodings, rendered chats and decodings of fixed texts
`--tokenizer-only` writes just these (the model files are left as they are).

Run in a venv with torch and transformers (kept outside the repository; torch 2.13.0 is the local CPU wheel):
    python3 -m venv /tmp/hfref && /tmp/hfref/bin/pip install torch==2.13.0 transformers safetensors tokenizers jinja2
    /tmp/hfref/bin/python tools/make_hf_fixtures.py [--out tests/assets/hf] [--family llama ...] [--tokenizer-only]
The committed files were written with torch 2.13.0, transformers 5.23.0, tokenizers 0.23.3.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import zipfile

import numpy as np
import torch
import transformers

from make_hf_tokenizers import make_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, PROMPT_LEN, NEW_TOKENS = 2, 12, 8
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, hidden_act="silu", bos_token_id=1, eos_token_id=2)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
FAMILIES = {  # family -> (config class, model class, config kwargs, max_shard_size or None)
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=False),
              None),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=64, tie_word_embeddings=False), "300KB"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
              None),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(rms_norm_eps=0.02, rope_theta=1000000.0, head_dim=32, tie_word_embeddings=True,
                   use_sliding_window=False), None),
}
SEEDS = {"llama": 11, "mistral": 12, "qwen2": 13, "qwen3": 14}


def redraw_weights(model: torch.nn.Module, seed: int) -> None:
  """Every parameter redrawn in name order: norms 1 + 0.2 N, biases 0.3 N, embeddings / LM head 0.5 N,
  projections N(0, 1 / fan_in)."""
  rng = np.random.default_rng(seed)
  with torch.no_grad():
    for name, param in sorted(model.named_parameters()):
      shape = tuple(param.shape)
      if name.endswith("norm.weight"):
        value = 1.0 + 0.2 * rng.standard_normal(shape)
      elif name.endswith(".bias"):
        value = 0.3 * rng.standard_normal(shape)
      elif "embed_tokens" in name or "lm_head" in name:
        value = 0.5 * rng.standard_normal(shape)
      else:
        value = rng.standard_normal(shape) / np.sqrt(shape[1])
      param.copy_(torch.from_numpy(value.astype(np.float32)))


def write_npz(path: str, arrays: dict) -> None:
  """np.savez with fixed zip timestamps, so equal arrays give equal bytes."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
    for name in sorted(arrays):
      buffer = io.BytesIO()
      np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
      zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def legacy_rope_config(directory: str) -> None:
  """config.json's `rope_parameters` (transformers 5) rewritten as the hub's `rope_theta` + `rope_scaling`."""
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    config = json.load(f)
  rope = dict(config.pop("rope_parameters"))
  config["rope_theta"] = rope.pop("rope_theta")
  config["rope_scaling"] = rope
  with open(path, "w") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_family(family: str, out: str) -> dict:
  config_class, model_class, kwargs, max_shard_size = FAMILIES[family]
  torch.manual_seed(SEEDS[family])
  config = getattr(transformers, config_class)(**COMMON, **kwargs)
  model = getattr(transformers, model_class)(config).to(torch.float32)
  redraw_weights(model, SEEDS[family])
  directory = os.path.join(out, family)
  os.makedirs(directory, exist_ok=True)
  for name in os.listdir(directory):
    if name.endswith((".safetensors", ".json", ".npz")):
      os.remove(os.path.join(directory, name))
  model.save_pretrained(directory, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
  if family == "llama":
    legacy_rope_config(directory)

  # The reference is computed from the saved directory, read back as any user would.
  model = getattr(transformers, model_class).from_pretrained(directory, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
  if family == "llama":
    assert model.config.rope_parameters["rope_type"] == "llama3", model.config.rope_parameters
  rng = np.random.default_rng(SEEDS[family] + 100)
  input_ids = rng.integers(3, COMMON["vocab_size"], (BATCH, PROMPT_LEN)).astype(np.int64)
  ids = torch.from_numpy(input_ids)
  with torch.no_grad():
    logits = model(ids).logits.float().numpy()
    generation = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                               eos_token_id=None, pad_token_id=0, output_scores=True,
                                               return_dict_in_generate=True)
    out_ids = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=generation)
  greedy = out_ids.sequences[:, PROMPT_LEN:].numpy()
  assert greedy.shape == (BATCH, NEW_TOKENS), greedy.shape
  top2 = torch.stack(out_ids.scores, 1).topk(2, dim=-1).values.numpy()  # [B, T, 2]
  gap = float((top2[..., 0] - top2[..., 1]).min())
  assert gap > 1e-3, f"{family}: greedy choice too close to call ({gap})"
  write_npz(os.path.join(directory, "reference.npz"), {
      "input_ids": input_ids.astype(np.int32), "logits": logits.astype(np.float32),
      "greedy": greedy.astype(np.int32)})
  return {**make_tokenizer(family, directory), **fixture_size(family, directory),
          "max_abs_logit": float(np.abs(logits).max()), "min_greedy_gap": gap}


def fixture_size(family: str, directory: str) -> dict:
  files = sorted(os.path.relpath(os.path.join(root, name), directory)
                 for root, _, names in os.walk(directory) for name in names)
  size = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
  assert size < 1 << 20, f"{family}: fixture is {size} bytes"
  return {"files": files, "bytes": size}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(ROOT, "tests", "assets", "hf"))
  parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
  parser.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer files")
  args = parser.parse_args()
  torch.use_deterministic_algorithms(True)
  for family in args.family or sorted(FAMILIES):
    if args.tokenizer_only:
      directory = os.path.join(args.out, family)
      print(family, json.dumps({**make_tokenizer(family, directory), **fixture_size(family, directory)}))
    else:
      print(family, json.dumps(make_family(family, args.out)))


if __name__ == "__main__":
  main()
