"""How far each RL run moved its policy from the SFT start, beside the gold it kept: a descriptive reading of the
committed main-stage results (`results/results.json` and the per-run metrics `results/runs/final/<rm>/seed<k>/`
`<rl>_metrics.jsonl`), no training.

    python experiments/rlhf_reward_hacking/policy_drift.py      # writes results/policy_drift.json

Per run: kl_last = the mean of the logged `kl_ref` (the policy's KL to its frozen SFT reference, per token, on the
step's rollouts) over the last W steps (W = run.W, the window the report's gold_last and length outcomes use), and
its gold_final (the report's held-out greedy gold). Per (RL algorithm, RM): the mean and sample sd over seeds of
kl_last. Across runs: the Spearman rank correlation of kl_last with gold_final, over all runs and within each RL
algorithm (descriptive: the runs share seeds and RMs, so no p value is given).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.rlhf_reward_hacking import run  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def spearman(x: list[float], y: list[float]) -> float:
  """Spearman's rho (scipy's: ties get their mean rank)."""
  from scipy import stats

  return float(stats.spearmanr(x, y).statistic)


def kl_last(metrics_file: str, window: int = run.W) -> float:
  """The mean `kl_ref` of the last `window` logged steps of a run's metrics.jsonl."""
  with open(metrics_file) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  values = [row["kl_ref"] for row in rows if "kl_ref" in row]
  if len(values) < window:
    raise ValueError(f"{metrics_file}: {len(values)} steps log kl_ref, fewer than the window {window}")
  return float(np.mean(values[-window:]))


def compute(results_dir: str = RESULTS) -> dict:
  with open(os.path.join(results_dir, "results.json")) as f:
    report = json.load(f)
  runs = []
  for row in report["runs"]:
    if not row["name"].startswith("final/"):
      continue
    metrics = os.path.join(results_dir, "runs", row["name"], f"{row['rl']}_metrics.jsonl")
    runs.append(dict(name=row["name"], rl=row["rl"], method=row["method"], seed=row["seed"],
                     kl_last=round(kl_last(metrics), 6), gold_final=row["gold_final"]))
  arms = []
  for rl in run.RL_ARMS:
    for method in run.METHODS:
      kls = [r["kl_last"] for r in runs if r["rl"] == rl and r["method"] == method]
      golds = [r["gold_final"] for r in runs if r["rl"] == rl and r["method"] == method]
      arms.append(dict(rl=rl, method=method, n=len(kls), kl_last_mean=round(float(np.mean(kls)), 6),
                       kl_last_sd=round(float(np.std(kls, ddof=1)), 6),
                       gold_final_mean=round(float(np.mean(golds)), 6)))
  correlations = {"all": spearman([r["kl_last"] for r in runs], [r["gold_final"] for r in runs])}
  for rl in run.RL_ARMS:
    mine = [r for r in runs if r["rl"] == rl]
    correlations[rl] = spearman([r["kl_last"] for r in mine], [r["gold_final"] for r in mine])
  return dict(doc=__doc__.strip().split("\n\n")[0], command="python experiments/rlhf_reward_hacking/policy_drift.py",
              window=run.W, arms=arms, spearman_kl_last_vs_gold_final={k: round(v, 4) for k, v in correlations.items()},
              runs=runs)


def main() -> None:
  result = compute()
  with open(os.path.join(RESULTS, "policy_drift.json"), "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
  for arm in result["arms"]:
    print(f"{arm['rl']:5s} {arm['method']:5s} kl_last {arm['kl_last_mean']:.4f} +- {arm['kl_last_sd']:.4f} "
          f"gold_final {arm['gold_final_mean']:.3f} (n = {arm['n']})")
  print("Spearman(kl_last, gold_final):", result["spearman_kl_last_vs_gold_final"])


if __name__ == "__main__":
  main()
