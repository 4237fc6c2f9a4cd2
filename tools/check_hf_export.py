"""Loads jaxpt exports with `transformers` and writes their logits (needs torch + transformers; not jaxpt).

    python tools/check_hf_export.py ROOT NAME [NAME ...]

For each NAME, `AutoModelForCausalLM.from_pretrained(ROOT/NAME)` (fp32, eager attention) runs on the int ids in
ROOT/ids.npy [batch, seq] and its logits go to ROOT/NAME/transformers_logits.npy. `tests/test_models_hf_export.py`
(slow) compares them with jaxpt's own logits of the exported params. A reward-model export (config.json's
architectures a `...ForSequenceClassification`) loads with `AutoModelForSequenceClassification` instead, runs on
the right-padded rows of ROOT/NAME/ids.npy, and its pooled scores [batch, num_labels] (of each row's last token
that is not config.pad_token_id) go to ROOT/NAME/transformers_scores.npy (`tests/test_reward_export.py`).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import transformers


def main(root: str, names: list[str]) -> None:
  for name in names:
    directory = os.path.join(root, name)
    if transformers.AutoConfig.from_pretrained(directory).architectures[0].endswith("ForSequenceClassification"):
      scores(directory)
      continue
    ids = torch.from_numpy(np.load(os.path.join(root, "ids.npy")).astype(np.int64))
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32,
                                                              attn_implementation="eager")
    with torch.no_grad():
      logits = model(input_ids=ids).logits.float().numpy()
    np.save(os.path.join(root, name, "transformers_logits.npy"), logits)
    print(name, type(model).__name__, logits.shape)


def scores(directory: str) -> None:
  """A reward-model export's scores of the rows of directory/ids.npy -> directory/transformers_scores.npy."""
  ids = torch.from_numpy(np.load(os.path.join(directory, "ids.npy")).astype(np.int64))
  model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32,
                                                                          attn_implementation="eager")
  with torch.no_grad():
    pooled = model(input_ids=ids).logits.float().numpy()
  np.save(os.path.join(directory, "transformers_scores.npy"), pooled)
  print(os.path.basename(directory), type(model).__name__, pooled.shape)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
