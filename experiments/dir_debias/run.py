"""BT vs DIR (lambda 0.1, 1.0) vs ODIN reward models on a length-biased synthetic task and on hh-rlhf harmless-base.

    python experiments/dir_debias/run.py [--seeds 0,1,2] [--datasets synthetic,hh] [--steps 150] [--out DIR]

Tiny models (experiments/configs/rm_tiny.py shrunk to d_model 32, 2 layers), one run per (dataset, method, seed);
each run's rm_eval.json (de-biased 'test' split; for synthetic also 'adversarial', the chosen answer always
shorter) is collected into results.json, summarised (mean +- std over seeds) in results.md, and plotted in
results.png (plus each method's score-vs-length scatter for the first seed, scatter_<dataset>_<method>.png).
Runs live under --out (default /tmp/dir_debias); the committed files go next to this script.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

reuse_freed_host_memory()

import argparse
import json
import os
import shutil
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.configs import rm_tiny  # noqa: E402
from jaxpt.train import rm, rm_eval  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HH = os.path.join(os.path.dirname(ROOT), "shared", "data", "hh-rlhf", "harmless-base-test.jsonl.gz")
METHODS = {
    "bt": {"rm.loss": "bt"},
    "dir_0.1": {"rm.loss": "dir", "rm.mi_weight": 0.1},
    "dir_1.0": {"rm.loss": "dir", "rm.mi_weight": 1.0},
    "odin": {"rm.loss": "odin"},
}
COMMON = {
    "log_every": 50, "eval_every": 0, "checkpoint_every": 0, "progress": False,
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
    "rm.estimator_hidden": 64, "rm.estimator_lr": 1e-3,
}
DATASETS = {
    # train P(chosen longer) = 0.9; 'test' is de-biased (0.5), 'adversarial' 0.0
    "synthetic": {"data.length_bias": 0.9, "data.synthetic_train_pairs": 2048, "data.synthetic_test_pairs": 256},
    # the shipped harmless-base file, 20% held out (by a hash of the pair), last 128 tokens of each dialogue
    "hh": {"data.source": HH, "data.test_fraction": 0.2, "data.seq_len": 128, "data.batch_size": 16,
           "model.max_seq_len": 128, "model.vocab_size": 1024},
}
SUMMARY = (("accuracy", "test accuracy"), ("chosen_longer", "acc. chosen longer"),
           ("chosen_shorter", "acc. chosen shorter"), ("pearson_score_length", "Pearson(score, len)"),
           ("spearman_score_length", "Spearman(score, len)"), ("adversarial", "adversarial accuracy"))


def make_config(dataset: str, method: str, seed: int, steps: int):
  config = rm_tiny.get_config()
  for key, value in {**COMMON, **DATASETS[dataset], **METHODS[method], "seed": seed, "steps": steps}.items():
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


def run_one(dataset: str, method: str, seed: int, steps: int, out: str) -> dict:
  workdir = os.path.join(out, dataset, method, f"seed{seed}")
  shutil.rmtree(workdir, ignore_errors=True)
  start = time.time()
  result = rm.train_rm(make_config(dataset, method, seed, steps), workdir)
  report = json.load(open(os.path.join(workdir, rm_eval.REPORT_JSON)))
  row = {"dataset": dataset, "method": method, "seed": seed, "seconds": round(time.time() - start, 1),
         "train_loss": result.last_row.get("bt_loss", result.last_row.get("loss")),
         "train_accuracy": result.last_row.get("accuracy"), "test": report}
  adversarial = os.path.join(workdir, "eval_adversarial", rm_eval.REPORT_JSON)
  if os.path.exists(adversarial):
    row["adversarial"] = json.load(open(adversarial))
  return row


def metric(row: dict, key: str):
  if key == "adversarial":
    return row["adversarial"]["accuracy"] if "adversarial" in row else None
  value = row["test"][key]
  return value["accuracy"] if isinstance(value, dict) else value


def summarise(rows: list[dict]) -> str:
  lines = ["| dataset | method | " + " | ".join(name for _, name in SUMMARY) + " |",
           "|---|---|" + "---|" * len(SUMMARY)]
  for dataset in dict.fromkeys(r["dataset"] for r in rows):
    for method in METHODS:
      group = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
      if not group:
        continue
      cells = []
      for key, _ in SUMMARY:
        values = [metric(r, key) for r in group if metric(r, key) is not None]
        cells.append(f"{np.mean(values):.3f} ± {np.std(values):.3f}" if values else "-")
      lines.append(f"| {dataset} | {method} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
  datasets = list(dict.fromkeys(r["dataset"] for r in rows))
  fig, axes = plt.subplots(len(datasets), 2, figsize=(9, 3.2 * len(datasets)), squeeze=False)
  for i, dataset in enumerate(datasets):
    accuracy_label = "test accuracy" + (" (de-biased)" if dataset == "synthetic" else "")
    for j, (key, label) in enumerate((("accuracy", accuracy_label),
                                      ("pearson_score_length", "Pearson corr(score, length)"))):
      ax = axes[i, j]
      for k, method in enumerate(METHODS):
        values = [metric(r, key) for r in rows if r["dataset"] == dataset and r["method"] == method]
        if values:
          ax.bar(k, np.mean(values), yerr=np.std(values), color=f"C{k}", capsize=3)
          ax.scatter([k] * len(values), values, color="k", s=8, zorder=3)
      ax.set_xticks(range(len(METHODS)), list(METHODS))
      ax.set_title(f"{dataset}: {label}")
      ax.axhline(0.5 if key == "accuracy" else 0.0, color="grey", lw=0.8, ls="--")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--datasets", default="synthetic,hh")
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--out", default="/tmp/dir_debias")
  parser.add_argument("--results", default=HERE, help="where results.json/.md/.png go")
  parser.add_argument("--report-only", action="store_true", help="only rewrite results.md/.png from results.json")
  args = parser.parse_args(argv)
  os.makedirs(args.results, exist_ok=True)
  results_json = os.path.join(args.results, "results.json")
  rows = json.load(open(results_json)) if os.path.exists(results_json) else []
  for dataset in [] if args.report_only else args.datasets.split(","):
    for seed in (int(s) for s in args.seeds.split(",")):
      for method in args.methods.split(","):
        rows = [r for r in rows if (r["dataset"], r["method"], r["seed"]) != (dataset, method, seed)]
        row = run_one(dataset, method, seed, args.steps, args.out)
        rows.append(row)
        print(f"{dataset} {method} seed {seed}: acc {metric(row, 'accuracy'):.3f} "
              f"pearson {metric(row, 'pearson_score_length'):.3f} ({row['seconds']} s)", flush=True)
        with open(results_json, "w") as f:  # after every run, so a long experiment can be resumed / inspected
          json.dump(rows, f, indent=1)
  with open(os.path.join(args.results, "results.md"), "w") as f:
    f.write(f"# DIR debiasing: BT vs DIR vs ODIN ({args.steps} steps, seeds {args.seeds})\n\n" + summarise(rows))
  plot(rows, os.path.join(args.results, "results.png"))
  if not args.report_only:
    copy_scatter_plots(args.out, args.results, min(int(s) for s in args.seeds.split(",")))


def copy_scatter_plots(out: str, results: str, seed: int) -> None:
  """Each (dataset, method)'s score-vs-length scatter of one seed, as scatter_<dataset>_<method>.png."""
  for dataset in DATASETS:
    for method in METHODS:
      source = os.path.join(out, dataset, method, f"seed{seed}", rm_eval.REPORT_PNG)
      if os.path.exists(source):
        shutil.copy(source, os.path.join(results, f"scatter_{dataset}_{method}.png"))


if __name__ == "__main__":
  main()
