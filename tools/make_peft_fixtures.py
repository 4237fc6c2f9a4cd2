"""Writes the PEFT LoRA fixtures of `tests/test_peft.py`, and checks jaxpt-written adapters with PEFT (needs torch +
transformers + peft; not jaxpt).

One adapter per family over the tiny HF fixtures of `tests/assets/hf/<family>/` (make_hf_fixtures.py), under
`tests/assets/peft/<family>/`:
    adapter_config.json, adapter_model.safetensors   as `PeftModel.save_pretrained` writes them (fp32;
                                                     target_modules sorted: PEFT writes a set in hash order)
    reference.npz                                    input_ids int32 [2, 12] (the base fixture's); logits float32
                                                     [2, 12, vocab] of the PeftModel (fp32 eager forward, eval mode)

Families and adapters (`ADAPTERS`): llama (r 4, alpha 8, all seven projections), qwen2 (r 2, alpha 6, q_proj and
v_proj, dropout 0.05), qwen3 (r 4, alpha 4, rsLoRA, every projection but o_proj). `get_peft_model` makes the
adapters; then lora_A and lora_B (PEFT starts B at zero) are redrawn in name order from a seeded NumPy generator,
N(0, 1 / in) and N(0, 0.25 / r), so the adapters move the logits by O(1) and a rerun writes the same tensors.

`--check DIR --logits FILE` is the reverse direction: `PeftModel.from_pretrained` loads the adapters in DIR (e.g.
written by `jaxpt export-hf --adapters`) on the transformers model of their base (adapter_config.json's
base_model_name_or_path, or --base), runs on FILE's input_ids and prints the largest difference from FILE's logits
(jaxpt's), with how far the adapters move PEFT's logits from the base's, as one JSON line. The jaxpt side, for a
LoRA run RUN over an `hf:` base (e.g. `jaxpt sft --config experiments/configs/sft_hf.py
--config.init_from=hf:tests/assets/hf/llama --config.lora.rank=4 ...`):
    jaxpt export-hf --workdir RUN --out DIR --adapters
    python3 -c "import jaxpt, numpy as np; m = jaxpt.load('RUN', dtype='float32'); \
      ids = np.load('tests/assets/hf/llama/reference.npz')['input_ids']; \
      np.savez('FILE.npz', input_ids=ids, logits=np.asarray(m.logits(ids)))"

Run in a venv with torch, transformers and peft (kept outside the repository; torch 2.13.0 is the local CPU wheel):
    python3 -m venv /tmp/peftref && /tmp/peftref/bin/pip install torch==2.13.0 transformers peft safetensors
    /tmp/peftref/bin/python tools/make_peft_fixtures.py [--out tests/assets/peft] [--family llama ...]
    /tmp/peftref/bin/python tools/make_peft_fixtures.py --check DIR --logits FILE.npz [--base HF_DIR]
The committed files were written with torch 2.13.0, transformers 5.24.0, peft 0.21.2.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import peft
import torch
import transformers

from make_hf_fixtures import write_npz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # family -> LoraConfig kwargs
    "llama": dict(r=4, lora_alpha=8, target_modules=ALL),
    "qwen2": dict(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj"], lora_dropout=0.05),
    "qwen3": dict(r=4, lora_alpha=4, use_rslora=True, target_modules=[m for m in ALL if m != "o_proj"]),
}
SEEDS = {"llama": 21, "qwen2": 23, "qwen3": 24}


def base_model(directory: str) -> torch.nn.Module:
  return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                           attn_implementation="eager").eval()


def redraw_adapters(model: torch.nn.Module, seed: int) -> None:
  """Every lora_A / lora_B redrawn in name order: A N(0, 1 / in), B N(0, 0.25 / r)."""
  rng = np.random.default_rng(seed)
  with torch.no_grad():
    for name, param in sorted(model.named_parameters()):
      if ".lora_A." in name:
        value = rng.standard_normal(tuple(param.shape)) / np.sqrt(param.shape[1])
      elif ".lora_B." in name:
        value = 0.5 * rng.standard_normal(tuple(param.shape)) / np.sqrt(param.shape[1])
      else:
        continue
      param.copy_(torch.from_numpy(value.astype(np.float32)))


def make_family(family: str, out: str) -> dict:
  os.chdir(ROOT)  # base_model_name_or_path: the base fixture's path relative to the repository
  base_dir = os.path.join("tests", "assets", "hf", family)
  torch.manual_seed(SEEDS[family])
  model = peft.get_peft_model(base_model(base_dir), peft.LoraConfig(task_type="CAUSAL_LM", **ADAPTERS[family]))
  redraw_adapters(model, SEEDS[family])
  directory = os.path.join(out, family)
  os.makedirs(directory, exist_ok=True)
  for name in os.listdir(directory):
    if name.endswith((".safetensors", ".json", ".npz", ".md")):
      os.remove(os.path.join(directory, name))
  model.save_pretrained(directory)
  readme = os.path.join(directory, "README.md")  # the model card PEFT writes: not needed, not committed
  if os.path.exists(readme):
    os.remove(readme)
  with open(os.path.join(directory, "adapter_config.json")) as f:
    config = json.load(f)
  config["target_modules"] = sorted(config["target_modules"])  # PEFT writes a set, in hash order: made repeatable
  with open(os.path.join(directory, "adapter_config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)

  # The reference is computed from the saved adapters, loaded on a fresh base as any user would.
  model = peft.PeftModel.from_pretrained(base_model(base_dir), directory).eval()
  input_ids = np.load(os.path.join(base_dir, "reference.npz"))["input_ids"]
  with torch.no_grad():
    logits = model(torch.from_numpy(input_ids.astype(np.int64))).logits.float().numpy()
    base_logits = np.load(os.path.join(base_dir, "reference.npz"))["logits"]
  write_npz(os.path.join(directory, "reference.npz"), {"input_ids": input_ids.astype(np.int32),
                                                       "logits": logits.astype(np.float32)})
  files = sorted(os.listdir(directory))
  size = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
  assert size < 100_000, f"{family}: fixture is {size} bytes"
  return {"files": files, "bytes": size, "max_abs_logit": float(np.abs(logits).max()),
          "max_abs_change_from_base": float(np.abs(logits - base_logits).max())}


def check(directory: str, logits_file: str, base: str | None) -> dict:
  """PEFT's logits of the adapters in `directory` over their base vs the logits in `logits_file`."""
  with open(os.path.join(directory, "adapter_config.json")) as f:
    config = json.load(f)
  base = base or config["base_model_name_or_path"]
  model = peft.PeftModel.from_pretrained(base_model(base), directory).eval()
  reference = np.load(logits_file)
  with torch.no_grad():
    logits = model(torch.from_numpy(reference["input_ids"].astype(np.int64))).logits.float().numpy()
    with model.disable_adapter():  # the base alone: how far the adapters move the logits
      base_logits = model(torch.from_numpy(reference["input_ids"].astype(np.int64))).logits.float().numpy()
  want = reference["logits"]
  return {"adapters": directory, "base": base, "loaded_modules": sorted({name.split(".")[-1] for name, module in
                                                                          model.named_modules()
                                                                          if hasattr(module, "lora_A")}),
          "max_abs_diff": float(np.abs(logits - want).max()), "max_abs_logit": float(np.abs(want).max()),
          "max_abs_change_from_base": float(np.abs(want - base_logits).max())}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(ROOT, "tests", "assets", "peft"))
  parser.add_argument("--family", action="append", choices=sorted(ADAPTERS))
  parser.add_argument("--check", help="a directory of adapters to load with PEFT (e.g. written by jaxpt)")
  parser.add_argument("--logits", help="--check: an npz of input_ids [batch, seq] and the logits to compare with")
  parser.add_argument("--base", help="--check: the base model directory (default: base_model_name_or_path)")
  args = parser.parse_args()
  torch.use_deterministic_algorithms(True)
  if args.check:
    print(json.dumps(check(args.check, args.logits, args.base)))
    return
  for family in args.family or sorted(ADAPTERS):
    print(family, json.dumps(make_family(family, os.path.abspath(args.out))))


if __name__ == "__main__":
  main()
