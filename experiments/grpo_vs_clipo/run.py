"""GRPO vs GRPO + CLIPO from one SFT'd policy, 3 seeds each; held-out and perturbed accuracy before and after.

  python experiments/grpo_vs_clipo/run.py [--workdir /tmp/grpo_vs_clipo]     # resumable: finished runs are kept
  python experiments/grpo_vs_clipo/run.py --report-only

Steps: (1) `jaxpt sft` with `config.sft()` in WORKDIR/sft; (2) its greedy accuracy on every held-out set (the
"before" row); (3) `jaxpt grpo` with `config.grpo(clipo)` for clipo in {off, on} x seed {0, 1, 2} in
WORKDIR/<method>/seed<k>, each ending with the same evaluation. Writes results.md, results.json and curves.png
next to this file. Everything runs through the library's own trainers (`jaxpt.train.sft`, `jaxpt.train.grpo`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.grpo_vs_clipo import config as config_lib  # noqa: E402

METHODS = ("grpo", "clipo")
LABELS = {"sft": "SFT (before)", "grpo": "GRPO", "clipo": "GRPO + CLIPO"}
SEEDS = (0, 1, 2)
SETS = ("test", "test_rename", "test_distractor", "test_numbers")
DONE = "done.json"
SMOOTH = 10  # steps in the moving average of the training-rollout accuracy plot


def _done(directory: str) -> dict | None:
  path = os.path.join(directory, DONE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_done(directory: str, summary: dict) -> dict:
  with open(os.path.join(directory, DONE), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def train_sft(workdir: str) -> dict:
  directory = os.path.join(workdir, "sft")
  if (summary := _done(directory)) is not None:
    return summary
  from jaxpt.train.sft import sft

  provenance = current_provenance()  # the code as the run starts (HEAD may move while it runs)
  start = time.perf_counter()
  sft(config_lib.sft(), directory)
  # The "before" row: the GRPO trainer's own evaluation applied to the SFT'd params (same sets, same decoding).
  from jaxpt.train.grpo import build_grpo

  trainer = build_grpo(_grpo_config(directory, "grpo", 0), os.path.join(workdir, "_before"))
  accuracy = trainer.evaluate(trainer.init_state())
  return _write_done(directory, {"method": "sft", "wall_s": time.perf_counter() - start,
                                 "provenance": provenance, **accuracy})


def _grpo_config(sft_dir: str, method: str, seed: int):
  config = config_lib.grpo(clipo=method == "clipo")
  config.init_from = sft_dir
  config.seed = seed
  return config


def train_grpo_run(workdir: str, method: str, seed: int) -> dict:
  directory = os.path.join(workdir, method, f"seed{seed}")
  if (summary := _done(directory)) is not None:
    return summary
  from jaxpt.train.grpo import train_grpo

  provenance = current_provenance()  # the code as the run starts (HEAD may move while it runs)
  start = time.perf_counter()
  result = train_grpo(_grpo_config(os.path.join(workdir, "sft"), method, seed), directory)
  evals = {k: v for k, v in result.last_row.items() if k.startswith("eval_accuracy")}
  return _write_done(directory, {"method": method, "seed": seed, "wall_s": time.perf_counter() - start,
                                 "provenance": provenance, **evals})


def _rows(directory: str) -> list[dict]:
  from jaxpt.train.metrics import read_metrics

  return read_metrics(directory)


def report(workdir: str) -> dict:
  import numpy as np

  sft = _done(os.path.join(workdir, "sft"))
  runs = {m: [_done(os.path.join(workdir, m, f"seed{s}")) for s in SEEDS] for m in METHODS}
  table = {"sft": {name: [sft[f"eval_accuracy_{name}"]] for name in SETS}}
  for method, summaries in runs.items():
    table[method] = {name: [s[f"eval_accuracy_{name}"] for s in summaries if s] for name in SETS}
  lines = ["| policy | " + " | ".join(SETS) + " |", "|---" * (len(SETS) + 1) + "|"]
  for method, accs in table.items():
    cells = [f"{100 * np.mean(v):.1f} ± {100 * np.std(v):.1f}" if len(v) > 1 else f"{100 * v[0]:.1f}"
             for v in accs.values()]
    lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
  per_seed = ["| policy | seed | " + " | ".join(SETS) + " |", "|---" * (len(SETS) + 2) + "|"]
  for method, summaries in runs.items():
    for s in summaries:
      if s:
        per_seed.append(f"| {LABELS[method]} | {s['seed']} | " +
                        " | ".join(f"{100 * s[f'eval_accuracy_{n}']:.1f}" for n in SETS) + " |")
  with open(os.path.join(HERE, "results.md"), "w") as f:
    f.write("# GRPO vs GRPO + CLIPO: greedy accuracy (%) on held-out problems and perturbed variants\n\n")
    f.write(_provenance_lines(workdir, sft, runs))
    f.write(f"Mean ± std over seeds {list(SEEDS)} ({config_lib.GRPO_STEPS} GRPO steps from one SFT'd policy of "
            f"{config_lib.SFT_STEPS} steps, `experiments/configs/sft_tiny.py`; first {config_lib.EVAL_PROBLEMS} "
            "problems "
            "of each set). Reproduce: "
            "`python experiments/grpo_vs_clipo/run.py`.\n\n")
    f.write("\n".join(lines) + "\n\nPer seed:\n\n" + "\n".join(per_seed) + "\n")
  results = {"table": table, "runs": runs, "sft": sft}
  with open(os.path.join(HERE, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(workdir)
  return results


def _provenance(workdir: str, summary: dict) -> str:
  """Which code and devices produced one run (its done.json), or for runs that predate that field the workdir's
  provenance.json (written when the first run started)."""
  if "provenance" in summary:
    return summary["provenance"]
  path = os.path.join(workdir, "provenance.json")
  if not os.path.exists(path):
    return "unrecorded code"
  with open(path) as f:
    return json.load(f)["provenance"]


def current_provenance() -> str:
  """The commit (`+dirty` if tracked files had changes), JAX version and devices of this process."""
  import subprocess

  import jax

  def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()

  commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
  dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
  devices = jax.devices()
  return f"commit {commit}{dirty}, JAX {jax.__version__} on {len(devices)} {devices[0].platform} device(s), one process"


def _provenance_lines(workdir: str, sft: dict, runs: dict) -> str:
  """'Produced by P.' when every row came from the same code, else one line per set of rows."""
  by_label: dict[str, set] = {LABELS["sft"]: {_provenance(workdir, sft)}}
  for method, summaries in runs.items():
    by_label[LABELS[method]] = {_provenance(workdir, s) for s in summaries if s}
  every = set().union(*by_label.values())
  if len(every) == 1:
    return f"Produced by {every.pop()}.\n\n"
  lines = [f"- {label}: {'; '.join(sorted(provs))}" for label, provs in by_label.items()]
  return "Produced by:\n" + "\n".join(lines) + "\n\n"


def plot(workdir: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  colors = {"grpo": "tab:blue", "clipo": "tab:orange"}
  for method in METHODS:
    for seed in SEEDS:
      directory = os.path.join(workdir, method, f"seed{seed}")
      if not os.path.exists(os.path.join(directory, "metrics.jsonl")):
        continue
      rows = [r for r in _rows(directory) if "accuracy" in r]
      if len(rows) < SMOOTH:
        continue
      acc = np.convolve([r["accuracy"] for r in rows], np.ones(SMOOTH) / SMOOTH, mode="valid")
      steps = [r["step"] for r in rows][SMOOTH - 1:]
      axes[0].plot(steps, acc, color=colors[method], alpha=0.8, label=LABELS[method] if seed == 0 else None)
  axes[0].set(xlabel="GRPO step", ylabel=f"rollout accuracy ({SMOOTH}-step mean)", title="training rollouts")
  axes[0].legend()
  with open(os.path.join(HERE, "results.json")) as f:
    table = json.load(f)["table"]
  width = 0.27
  for i, method in enumerate(("sft",) + METHODS):
    means = [100 * np.mean(table[method][n]) for n in SETS]
    stds = [100 * np.std(table[method][n]) for n in SETS]
    axes[1].bar(np.arange(len(SETS)) + (i - 1) * width, means, width, yerr=stds, label=LABELS[method])
  axes[1].set_xticks(np.arange(len(SETS)), SETS)
  axes[1].set(ylabel="greedy accuracy (%)", title="held-out problems", ylim=(0, 110))
  axes[1].legend(loc="upper center", ncol=3, fontsize="small")
  fig.tight_layout()
  fig.savefig(os.path.join(HERE, "curves.png"), dpi=110)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="/tmp/grpo_vs_clipo")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args()
  if not args.report_only:
    from jaxpt.host_allocator import reuse_freed_host_memory

    reuse_freed_host_memory()
    import jax
    from absl import logging

    jax.config.update("jax_compilation_cache_dir", os.path.join(args.workdir, "_jax_cache"))
    logging.set_verbosity(logging.WARNING)
    print("sft:", train_sft(args.workdir), flush=True)
    for seed in SEEDS:
      for method in METHODS:
        print(f"{method} seed {seed}:", train_grpo_run(args.workdir, method, seed), flush=True)
  print(json.dumps(report(args.workdir)["table"], indent=1))


if __name__ == "__main__":
  main()
