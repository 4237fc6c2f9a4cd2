"""Reward-model evaluation on host arrays: accuracies, score-length correlations, per-bias splits, a report.

Inputs are per-pair NumPy arrays (padding pairs already dropped): scores r_c, r_r, response token counts
len_c, len_r, bias labels a[name] in {0, 1} and optional string groups (e.g. sycophancy `natural` /
`adversarial`). Definitions (a tie r_c = r_r counts as wrong):

    accuracy                  mean_i 1[r_c,i > r_r,i]
    accuracy_chosen_longer    over pairs with len_c > len_r  (`_shorter`: len_c < len_r; equal lengths in neither)
    pearson / spearman        corr(score, length) over all 2N scored responses (chosen and rejected);
                              Spearman = Pearson of the ranks, ties given their average rank; 0 if either is constant
    pearson_margin_length     Pearson corr(r_c - r_r, len_c - len_r) over the N pairs
    bias[name]                accuracy over pairs with a = 1 and with a = 0
    groups[name][value]       accuracy over the pairs in each group (e.g. sycophancy natural vs adversarial)

`write_report` puts `rm_eval.json`, `rm_eval.md` (tables) and `score_vs_length.png` (`jaxpt.reports`) into a
workdir.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Sequence

import numpy as np

REPORT_JSON = "rm_eval.json"
REPORT_MD = "rm_eval.md"
REPORT_PNG = "score_vs_length.png"


def rankdata(x: Sequence[float]) -> np.ndarray:
  """1-based ranks of `x` [n] (float64); tied values all get the mean of the ranks they span."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  ranks = np.empty(len(x), np.float64)
  start = 0
  while start < len(x):
    stop = start + 1
    while stop < len(x) and sorted_x[stop] == sorted_x[start]:
      stop += 1
    ranks[order[start:stop]] = 0.5 * (start + 1 + stop)  # mean of ranks start+1 .. stop
    start = stop
  return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
  """sum (x - mx)(y - my) / sqrt(sum (x - mx)^2 sum (y - my)^2); 0.0 when either side is constant or n < 2."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if len(x) < 2:
    return 0.0
  xc, yc = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
  return float(np.sum(xc * yc) / denom) if denom > 0 else 0.0


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Pearson correlation of `rankdata(x)` and `rankdata(y)` (ties averaged)."""
  return pearson(rankdata(x), rankdata(y))


def _accuracy(correct: np.ndarray, mask: np.ndarray) -> dict:
  n = int(mask.sum())
  return {"accuracy": float(correct[mask].mean()) if n else None, "num_pairs": n}


def evaluate_pairs(chosen_scores, rejected_scores, chosen_lengths, rejected_lengths,
                   bias_labels: Optional[Mapping[str, Sequence[int]]] = None,
                   groups: Optional[Mapping[str, Sequence[str]]] = None) -> dict:
  """The metrics above as a JSON-able dict (arrays `[N]`, one entry per real pair)."""
  rc, rr = np.asarray(chosen_scores, np.float64), np.asarray(rejected_scores, np.float64)
  lc, lr = np.asarray(chosen_lengths, np.float64), np.asarray(rejected_lengths, np.float64)
  correct = rc > rr
  everything = np.ones(len(rc), bool)
  scores, lengths = np.concatenate([rc, rr]), np.concatenate([lc, lr])
  results = {
      **_accuracy(correct, everything),
      "chosen_longer": _accuracy(correct, lc > lr),
      "chosen_shorter": _accuracy(correct, lc < lr),
      "pearson_score_length": pearson(scores, lengths),
      "spearman_score_length": spearman(scores, lengths),
      "pearson_margin_length": pearson(rc - rr, lc - lr),
      "mean_margin": float(np.mean(rc - rr)) if len(rc) else None,
      "bias": {},
      "groups": {},
  }
  for name, labels in (bias_labels or {}).items():
    a = np.asarray(labels)
    results["bias"][name] = {"a1": _accuracy(correct, a == 1), "a0": _accuracy(correct, a == 0)}
  for name, values in (groups or {}).items():
    values = np.asarray(values)
    results["groups"][name] = {str(v): _accuracy(correct, values == v) for v in sorted(set(values.tolist()))}
  return results


def scalar_metrics(results: dict, prefix: str = "eval_") -> dict[str, float]:
  """The scalar entries of `evaluate_pairs` (empty splits left out), for metrics.jsonl."""
  out = {f"{prefix}accuracy": results["accuracy"],
         f"{prefix}pearson_score_length": results["pearson_score_length"],
         f"{prefix}spearman_score_length": results["spearman_score_length"],
         f"{prefix}pearson_margin_length": results["pearson_margin_length"]}
  splits = [("chosen_longer", results["chosen_longer"]), ("chosen_shorter", results["chosen_shorter"])]
  splits += [(f"{name}_a{k}", split[f"a{k}"]) for name, split in results["bias"].items() for k in (1, 0)]
  splits += [(f"{name}_{value}", split) for name, group in results["groups"].items() for value, split in group.items()]
  for key, split in splits:
    if split["accuracy"] is not None:
      out[f"{prefix}accuracy_{key}"] = split["accuracy"]
  return out


def _fmt(value) -> str:
  return "-" if value is None else f"{value:.3f}"


def markdown_table(results: dict) -> str:
  """A two-column markdown table of every accuracy split and both correlations."""
  rows = [("pairwise accuracy", results["accuracy"], results["num_pairs"]),
          ("accuracy, chosen longer", results["chosen_longer"]["accuracy"], results["chosen_longer"]["num_pairs"]),
          ("accuracy, chosen shorter", results["chosen_shorter"]["accuracy"],
           results["chosen_shorter"]["num_pairs"])]
  for name, split in results["bias"].items():
    rows += [(f"accuracy, {name} a={k}", split[f"a{k}"]["accuracy"], split[f"a{k}"]["num_pairs"]) for k in (1, 0)]
  for name, group in results["groups"].items():
    rows += [(f"accuracy, {name} {value}", split["accuracy"], split["num_pairs"]) for value, split in group.items()]
  rows += [("Pearson corr(score, length)", results["pearson_score_length"], None),
           ("Spearman corr(score, length)", results["spearman_score_length"], None),
           ("Pearson corr(margin, length difference)", results["pearson_margin_length"], None)]
  lines = ["| metric | value | pairs |", "|---|---|---|"]
  lines += [f"| {name} | {_fmt(value)} | {'' if n is None else n} |" for name, value, n in rows]
  return "\n".join(lines) + "\n"


def write_report(workdir: str, results: dict, chosen_scores, rejected_scores, chosen_lengths, rejected_lengths,
                 title: str = "reward model") -> dict[str, str]:
  """Writes rm_eval.json, rm_eval.md and score_vs_length.png into `workdir`; returns their paths."""
  # Imported here: importing the train package must not import matplotlib.
  from jaxpt import reports

  os.makedirs(workdir, exist_ok=True)
  paths = {key: os.path.join(workdir, name) for key, name in
           (("json", REPORT_JSON), ("markdown", REPORT_MD), ("plot", REPORT_PNG))}
  with open(paths["json"], "w") as f:
    json.dump(results, f, indent=2)
  with open(paths["markdown"], "w") as f:
    f.write(f"# {title}: evaluation\n\n" + markdown_table(results))
  reports.plot_score_vs_length(paths["plot"], chosen_scores, rejected_scores, chosen_lengths, rejected_lengths,
                               f"{title}: Pearson {results['pearson_score_length']:.2f}, "
                               f"Spearman {results['spearman_score_length']:.2f}")
  return paths
