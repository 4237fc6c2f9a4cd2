"""Loads jaxpt exports with `transformers` and writes their logits (needs torch + transformers; not jaxpt).

    python tools/check_hf_export.py ROOT NAME [NAME ...]

For each NAME, `AutoModelForCausalLM.from_pretrained(ROOT/NAME)` (fp32, eager attention) runs on the int ids in
ROOT/ids.npy [batch, seq] and its logits go to ROOT/NAME/transformers_logits.npy. `tests/test_models_hf_export.py`
(slow) compares them with jaxpt's own logits of the exported params.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import transformers


def main(root: str, names: list[str]) -> None:
  ids = torch.from_numpy(np.load(os.path.join(root, "ids.npy")).astype(np.int64))
  for name in names:
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32,
                                                              attn_implementation="eager")
    with torch.no_grad():
      logits = model(input_ids=ids).logits.float().numpy()
    np.save(os.path.join(root, name, "transformers_logits.npy"), logits)
    print(name, type(model).__name__, logits.shape)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
