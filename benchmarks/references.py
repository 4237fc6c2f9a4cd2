"""Reference programs run beside jaxpt's benchmarks, each with the python of its own venv:

- `hf`: PyTorch + HF transformers (Qwen2, eager), `../shared/bench/hf_reference.py`;
- `tunix`: google-tunix 0.1.7's Llama3 and `Sampler`, `benchmarks/tunix_reference.py`.

Both take `d_model num_layers` and print `... tokens/s <N>` (train step) and `generate: <N> new tokens/s`.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess

_HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = {"hf": _HERE.parents[1] / "shared" / "bench" / "hf_reference.py", "tunix": _HERE / "tunix_reference.py"}
VENVS = {"hf": "torch + transformers", "tunix": "google-tunix==0.1.7"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """--hf-python / --tunix-python: the python to run each reference with (empty: skip it)."""
  for name, needs in VENVS.items():
    parser.add_argument(f"--{name}-python", default="", help=f"python of a venv with {needs}")


def run(args: argparse.Namespace, d_model: int, num_layers: int) -> dict:
  """{name: {train_tokens_per_sec, generate_new_tokens_per_sec}} for every reference given a python."""
  results = {}
  for name, script in SCRIPTS.items():
    python = getattr(args, f"{name}_python")
    if not python:
      continue
    out = subprocess.run([python, str(script), str(d_model), str(num_layers)], check=True, capture_output=True,
                         text=True).stdout
    train = re.search(r"tokens/s (\d+)", out)
    generate = re.search(r"generate: (\d+) new tokens/s", out)
    results[name] = {"train_tokens_per_sec": float(train.group(1)) if train else None,
                     "generate_new_tokens_per_sec": float(generate.group(1)) if generate else None}
  return results
