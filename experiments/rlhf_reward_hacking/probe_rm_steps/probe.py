"""Probe, not a selection: does a Bradley-Terry reward model from this experiment's SFT backbone learn to read
correctness when it trains longer than the experiment's 50 steps, on pairs with a weaker length bias, or on more
pairs? One RM per STEPS:LR[:BIAS[:PAIRS[:METHOD]]] argument (BIAS: P(chosen side padded) in the training pairs,
default run.py's LENGTH_BIAS; PAIRS: training pairs, default run.py's PAIRS['train']; METHOD: bt (default), dir
(at run.GRID's first lambda) or odin), tuning seed, on the experiment's pairs otherwise; each writes
`WORKDIR/<method>_<steps>_<lr>[_bias<BIAS>][_pairs<PAIRS>]/done.json` with the validation balanced accuracy
(`run.train_rm`). The committed `bt_*.json` are its outputs:

    python experiments/rlhf_reward_hacking/probe_rm_steps/probe.py /tmp/rmprobe 50:3e-3 400:3e-3 400:3e-3:0.7
"""

import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.rlhf_reward_hacking import run  # noqa: E402
from jaxpt.data import arithmetic_preferences  # noqa: E402


def suffix(bias: float, train_pairs: int) -> str:
  """The folder-name suffix of a point's pairs: empty for the experiment's own."""
  return ((f"_bias{bias:g}" if bias != run.LENGTH_BIAS else "")
          + (f"_pairs{train_pairs}" if train_pairs != run.PAIRS["train"] else ""))


def pairs_folder(workdir: str, bias: float, train_pairs: int) -> str:
  """The experiment's pairs with `bias` and `train_pairs` training pairs (the validation pairs are the next
  problems of the training split after them: `arithmetic_preferences.write_pairs`)."""
  folder = os.path.join(workdir, "pairs" + suffix(bias, train_pairs))
  arithmetic_preferences.write_pairs(folder, run.sft_config(False).task, train_pairs, run.PAIRS["validation"],
                                     run.PAIRS["test"], bias, run.MAX_FILLER)
  return folder


def main(workdir: str, points: list[str]) -> None:
  sft = os.path.join(workdir, "sft")
  if not os.path.exists(os.path.join(sft, "done.json")):
    run.train_sft(dict(smoke=False), sft)
    with open(os.path.join(sft, "done.json"), "w") as f:
      json.dump({}, f)
  for point in points:
    fields = point.split(":")
    steps, lr = int(fields[0]), float(fields[1])
    bias = float(fields[2]) if len(fields) > 2 else run.LENGTH_BIAS
    train_pairs = int(fields[3]) if len(fields) > 3 else run.PAIRS["train"]
    method = fields[4] if len(fields) > 4 else "bt"
    pairs = pairs_folder(workdir, bias, train_pairs)
    directory = os.path.join(workdir, f"{method}_{steps}_{lr:g}" + suffix(bias, train_pairs))
    if os.path.exists(os.path.join(directory, "done.json")):
      continue
    start = time.time()
    hp = {"steps": steps, "optim.learning_rate": lr, "log_every": 50, **run.GRID[method][0]}
    out = run.train_rm(dict(smoke=False, sft_dir=sft, pairs=pairs, seed=run.TUNE_SEED, method=method, hp=hp),
                       directory)
    out["seconds"] = time.time() - start
    with open(os.path.join(directory, "done.json"), "w") as f:
      json.dump(out, f, indent=1)
    print(method, steps, lr, bias, train_pairs, json.dumps(out), flush=True)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
