"""The reference programs' venvs: `--hf-python` / `--tunix-python`, the python to run each with (`add_arguments`).

- `hf`: PyTorch + HF transformers (Qwen2, eager);
- `tunix`: google-tunix 0.1.7's Llama3 (and its `Sampler`).

`benchmarks/train_step.py` runs their train steps as persistent processes (`benchmarks/train_peers.py`) in
alternation with jaxpt's. The one-shot programs, `../shared/bench/hf_reference.py` and
`benchmarks/tunix_reference.py`, take `d_model num_layers` and print `... tokens/s <N>` (train step, timed on its
own) and `generate: <N> new tokens/s`; run them by hand, e.g. `/tmp/tunix/bin/python benchmarks/tunix_reference.py`.
"""

from __future__ import annotations

import argparse

VENVS = {"hf": "torch + transformers", "tunix": "google-tunix==0.1.7"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """--hf-python / --tunix-python: the python to run each reference with (empty: skip it)."""
  for name, needs in VENVS.items():
    parser.add_argument(f"--{name}-python", default="", help=f"python of a venv with {needs}")
