"""Probe, not a selection: does a Bradley-Terry reward model from this experiment's SFT backbone learn to read
correctness when it trains longer than the experiment's 50 steps? One RM per STEPS:LR argument, tuning seed, on
the experiment's own pairs (LENGTH_BIAS of run.py); each writes `WORKDIR/bt_<steps>_<lr>/done.json` with the
validation balanced accuracy (`run.train_rm`). The committed `bt_*.json` are its outputs:

    python experiments/rlhf_reward_hacking/probe_rm_steps/probe.py /tmp/rmprobe 50:3e-3 400:3e-3
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


def main(workdir: str, points: list[str]) -> None:
  pairs, sft = os.path.join(workdir, "pairs"), os.path.join(workdir, "sft")
  arithmetic_preferences.write_pairs(pairs, run.sft_config(False).task, run.PAIRS["train"], run.PAIRS["validation"],
                                     run.PAIRS["test"], run.LENGTH_BIAS, run.MAX_FILLER)
  if not os.path.exists(os.path.join(sft, "done.json")):
    run.train_sft(dict(smoke=False), sft)
    with open(os.path.join(sft, "done.json"), "w") as f:
      json.dump({}, f)
  for point in points:
    steps, lr = int(point.split(":")[0]), float(point.split(":")[1])
    directory = os.path.join(workdir, f"bt_{steps}_{lr:g}")
    if os.path.exists(os.path.join(directory, "done.json")):
      continue
    start = time.time()
    out = run.train_rm(dict(smoke=False, sft_dir=sft, pairs=pairs, seed=run.TUNE_SEED, method="bt",
                            hp={"steps": steps, "optim.learning_rate": lr, "log_every": 50}), directory)
    out["seconds"] = time.time() - start
    with open(os.path.join(directory, "done.json"), "w") as f:
      json.dump(out, f, indent=1)
    print(steps, lr, json.dumps(out), flush=True)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
