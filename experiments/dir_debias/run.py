"""BT vs DIR vs ODIN reward models against a length shortcut: a learnable synthetic task and hh-rlhf harmless-base.

Synthetic (`data.synthetic_task=tagged`, `jaxpt.data.synthetic_preferences`): the preference is the quality tag that
ends each response; 20% of training labels disagree with the tag (label_noise 0.2) and the chosen response is the
longer one in a share p of training pairs, p in {0.7, 0.8, 0.9}: length predicts the training label better than
the tag from p = 0.8 on. Test splits are noise-free: 'test' de-biased (P(chosen longer) = 0.5, balanced accuracy =
mean of the accuracies on chosen-longer and chosen-shorter pairs), 'adversarial' (chosen always shorter).
Methods: bt; dir_<lambda> for lambda in {0.1, 1, 10} with the tuned estimator; dir_reference (the spec's estimator,
hidden 1024, lr 1e-4, K 5, lambda 1, as the published script); odin (length sign from the data); bounds: oracle (BT
trained at p = 0.5) and length_only (score = response length, no training).

hh-rlhf harmless-base (the shipped test file, 20% held out by a hash of the pair): bt, dir (lambda chosen on the
synthetic validation runs at p = 0.9), odin (length sign 'auto': shorter answers win there). Reported: accuracy,
balanced accuracy, and accuracy on the length-matched pairs (token counts within 10% of the longer response).

Selection, all on validation runs that never see the reported data: synthetic validation = the same task drawn with
data_seed 1 (other pairs), model seeds 100, 101; the criterion is the balanced accuracy on its de-biased split. The
estimator (hidden, lr) is chosen at lambda 1 over p, then lambda per p. Reported runs: data_seed 0, seeds 0..4,
paired statistics by seed against BT (`experiments.toolkit.stats`).

  python experiments/dir_debias/run.py [--workdir /tmp/dir_debias] [--jobs 2] [--out DIR] [--seeds 0,1,2,3,4]
  python experiments/dir_debias/run.py --report-only --out experiments/dir_debias/results --overwrite
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

import jaxpt  # noqa: E402

from experiments.toolkit import flags, results, runner, stats  # noqa: E402

BIAS_STRENGTHS = (0.7, 0.8, 0.9)
LABEL_NOISE = 0.2
LAMBDAS = (0.1, 1.0, 10.0)
ESTIMATORS = {"small": {"rm.estimator_hidden": 64, "rm.estimator_lr": 1e-3},
              "reference": {"rm.estimator_hidden": 1024, "rm.estimator_lr": 1e-4}}
TUNE_SEEDS = (100, 101)
SEEDS = (0, 1, 2, 3, 4)
METHODS = ("bt", "dir_0.1", "dir_1", "dir_10", "dir_reference", "odin", "oracle", "length_only")
HH = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "hh-rlhf", "harmless-base-test.jsonl.gz"))
COMMON = {
    "steps": 150, "log_every": 50, "eval_every": 0, "checkpoint_every": 0, "progress": False,
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
    "rm.inner_steps": 5,
}
SYNTHETIC = {"data.synthetic_task": "tagged", "data.label_noise": LABEL_NOISE, "data.synthetic_train_pairs": 2048,
             "data.synthetic_test_pairs": 512}
HH_DATA = {"data.test_fraction": 0.2, "data.seq_len": 128, "data.batch_size": 16, "model.max_seq_len": 128,
           "model.vocab_size": 1024}
LENGTH_MATCH = 0.1  # a pair is length-matched when its token counts differ by at most this share of the longer
COLORS = dict(zip(METHODS, ("tab:blue", "tab:green", "tab:olive", "tab:cyan", "tab:purple", "tab:red", "black",
                            "tab:gray")))


# ------------------------------------------------------------------------------------------------------ a run


def dir_settings(lam: float, estimator: str) -> dict:
  return {"rm.loss": "dir", "rm.mi_weight": lam, **ESTIMATORS[estimator]}


def method_settings(method: str, lam_estimator: str) -> dict:
  """The rm fields of a trained method (length_only is not trained)."""
  if method in ("bt", "oracle"):
    return {"rm.loss": "bt"}
  if method == "odin":
    return {"rm.loss": "odin"}
  if method == "dir_reference":
    return {**dir_settings(1.0, "reference")}
  return dir_settings(float(method.split("_")[1]), lam_estimator)


def make_config(run: dict):
  from experiments.configs import rm_tiny

  return flags.apply_sets(rm_tiny.get_config(), {**COMMON, **run["overrides"], **run["sets"], "seed": run["seed"]})


def train_one(run: dict, directory: str) -> dict:
  """One reward model; -> its test metrics (balanced, adversarial, length-matched accuracy, correlations)."""

  setup = jaxpt.build("rm", make_config(run), directory)
  result = jaxpt.train("rm", setup.config, directory, built=setup)
  runner.require_finished(result, directory)
  out = dict(train_accuracy=result.last_row.get("accuracy"))
  for split in setup.hooks.evaluator.splits:
    report, per_pair = setup.training.under_rules(setup.hooks.evaluator.results)(result.state, split)
    out[split] = split_metrics(report, per_pair)
  return out


def split_metrics(report: dict, per_pair: dict) -> dict:
  """Accuracy, balanced accuracy, length-matched accuracy, score-length correlations, and the length-only scorer."""
  rc, rr = (np.asarray(per_pair[k], np.float64) for k in ("chosen_scores", "rejected_scores"))
  lc, lr = (np.asarray(per_pair[k], np.float64) for k in ("chosen_response_len", "rejected_response_len"))
  correct = rc > rr
  matched = np.abs(lc - lr) <= LENGTH_MATCH * np.maximum(lc, lr)
  longer, shorter = report["chosen_longer"]["accuracy"], report["chosen_shorter"]["accuracy"]
  return dict(accuracy=report["accuracy"], num_pairs=int(len(rc)),
              balanced_accuracy=None if longer is None or shorter is None else (longer + shorter) / 2,
              accuracy_chosen_longer=longer, accuracy_chosen_shorter=shorter,
              length_matched_accuracy=float(correct[matched].mean()) if matched.any() else None,
              length_matched_pairs=int(matched.sum()),
              pearson_score_length=report["pearson_score_length"],
              spearman_score_length=report["spearman_score_length"],
              length_only=dict(accuracy=float(np.mean(lc > lr) + 0.5 * np.mean(lc == lr)),
                               balanced_accuracy=0.5 if (lc > lr).any() and (lc < lr).any() else None))


# ---------------------------------------------------------------------------------------------------- the grid


def synthetic_overrides(p: float, data_seed: int) -> dict:
  return {**SYNTHETIC, "data.length_bias": p, "data.data_seed": data_seed}


def estimator_runs(common: dict) -> list[dict]:
  return [dict(common, name=f"tune/estimator_{e}/p{p}/seed{seed}", seed=seed,
               overrides={**synthetic_overrides(p, 1), **dir_settings(1.0, e)})
          for seed in TUNE_SEEDS for p in BIAS_STRENGTHS for e in ESTIMATORS]


def lambda_runs(common: dict, estimator: str) -> list[dict]:
  return [dict(common, name=f"tune/lambda{lam:g}_{estimator}/p{p}/seed{seed}", seed=seed,
               overrides={**synthetic_overrides(p, 1), **dir_settings(lam, estimator)})
          for seed in TUNE_SEEDS for p in BIAS_STRENGTHS for lam in LAMBDAS if lam != 1.0]


def synthetic_runs(common: dict, methods, estimator: str, seeds) -> list[dict]:
  runs = []
  for seed in seeds:
    for method in (m for m in methods if m != "length_only"):
      for p in (0.5,) if method == "oracle" else BIAS_STRENGTHS:
        runs.append(dict(common, name=f"synthetic/p{p}/{method}/seed{seed}", seed=seed, method=method, p=p,
                         overrides={**synthetic_overrides(p, 0), **method_settings(method, estimator)}))
  return runs


def hh_runs(common: dict, lam: float, estimator: str, seeds) -> list[dict]:
  settings = {"bt": {"rm.loss": "bt"}, "dir": dir_settings(lam, estimator), "odin": {"rm.loss": "odin"}}
  return [dict(common, name=f"hh/{method}/seed{seed}", seed=seed, method=method,
               overrides={**HH_DATA, "data.source": common["hh"], **rm_fields})
          for seed in seeds for method, rm_fields in settings.items()]


def validation_score(summaries: list[dict]) -> dict:
  return stats.summary([s["test"]["balanced_accuracy"] for s in summaries])


# ---------------------------------------------------------------------------------------------------- report


def synthetic_table(summaries: list[dict], methods) -> tuple[list[dict], list[dict]]:
  """Rows (p, method) of test metrics over seeds, and paired comparisons of each method against BT."""
  rows, comparisons = [], []
  for p in BIAS_STRENGTHS:
    by_method = {}
    for method in methods:
      source_p = 0.5 if method == "oracle" else p
      runs = sorted((s for s in summaries if s["method"] == ("bt" if method == "length_only" else method)
                     and s["p"] == source_p), key=lambda s: s["seed"])
      if not runs:
        continue
      pick = (lambda s, key, split: s[split]["length_only"][key]) if method == "length_only" else (
          lambda s, key, split: s[split][key])
      values = {key: [pick(s, key, split) for s in runs] for key, split in
                (("balanced_accuracy", "test"), ("accuracy", "adversarial"))}
      by_method[method] = (runs, values)
      rows.append(dict(p=p, method=method, seeds=[s["seed"] for s in runs],
                       balanced_accuracy=stats.summary(values["balanced_accuracy"]),
                       adversarial_accuracy=stats.summary(values["accuracy"]),
                       pearson_score_length=stats.summary([] if method == "length_only" else
                                                          [s["test"]["pearson_score_length"] for s in runs]),
                       train_accuracy=stats.summary([] if method == "length_only" else
                                                    [s["train_accuracy"] for s in runs])))
    for method, (_, values) in by_method.items():
      if method in ("bt", "length_only", "oracle") or "bt" not in by_method:
        continue
      for key in ("balanced_accuracy", "accuracy"):
        comparisons.append(dict(p=p, a=method, b="bt", metric=key if key != "accuracy" else "adversarial_accuracy",
                                **stats.paired(values[key], by_method["bt"][1][key])))
  return rows, stats.holm_adjust(comparisons)


def hh_table(summaries: list[dict]) -> tuple[list[dict], list[dict]]:
  rows, values = [], {}
  for method in ("bt", "dir", "odin"):
    runs = sorted((s for s in summaries if s["method"] == method), key=lambda s: s["seed"])
    if not runs:
      continue
    values[method] = {k: [s["test"][k] for s in runs] for k in ("accuracy", "balanced_accuracy",
                                                                "length_matched_accuracy", "pearson_score_length")}
    rows.append(dict(method=method, seeds=[s["seed"] for s in runs], train_accuracy=stats.summary(
        [s["train_accuracy"] for s in runs]), length_matched_pairs=runs[0]["test"]["length_matched_pairs"],
        length_only_accuracy=runs[0]["test"]["length_only"]["accuracy"],
        **{k: stats.summary(v) for k, v in values[method].items()}))
  comparisons = [dict(a=m, b="bt", metric=k, **stats.paired(values[m][k], values["bt"][k]))
                 for m in ("dir", "odin") if m in values and "bt" in values
                 for k in ("accuracy", "balanced_accuracy", "length_matched_accuracy")]
  return rows, stats.holm_adjust(comparisons)


def markdown(payload: dict) -> str:
  t = payload["tuning"]
  lines = [payload["provenance"], "", "## Selection on validation (synthetic, data_seed 1, seeds "
           f"{payload['design']['tuning_seeds']}; balanced accuracy on its de-biased split)", "",
           "| estimator (lambda 1) | " + " | ".join(f"p {p}" for p in BIAS_STRENGTHS) + " |",
           "|---|" + "---:|" * len(BIAS_STRENGTHS)]
  for e in ESTIMATORS:
    lines.append(f"| {e} {ESTIMATORS[e]} | " + " | ".join(stats.fmt(t["estimator"][e][str(p)]) for p in
                                                            BIAS_STRENGTHS) + " |")
  lines += ["", f"Chosen estimator: **{t['chosen_estimator']}**.", "",
            "| lambda | " + " | ".join(f"p {p}" for p in BIAS_STRENGTHS) + " |",
            "|---|" + "---:|" * len(BIAS_STRENGTHS)]
  for lam in LAMBDAS:
    cells = " | ".join(stats.fmt(t["lambda"][f"{lam:g}"][str(p)]) for p in BIAS_STRENGTHS)
    lines.append(f"| {lam:g} | {cells} |")
  lines += ["", "Chosen lambda per p: " + ", ".join(f"p {p}: {lam:g}" for p, lam in t["chosen_lambda"].items()), "",
            "## Synthetic task: test (de-biased) and adversarial accuracy", "",
            "| p | method | balanced accuracy | adversarial accuracy | Pearson(score, len) | train accuracy |",
            "|---:|---|---:|---:|---:|---:|"]
  for r in payload["synthetic"]:
    lines.append(f"| {r['p']} | {r['method']} | {stats.fmt(r['balanced_accuracy'])} | "
                 f"{stats.fmt(r['adversarial_accuracy'])} | {stats.fmt(r['pearson_score_length'])} | "
                 f"{stats.fmt(r['train_accuracy'])} |")
  lines += ["", "Paired by seed against BT (A - BT; positive: A better): " + stats.PAIRED_NOTE.replace(
                "of this report", "of this table") + ".", "", "| p | A | metric | A - BT |", "|---:|---|---|---|"]
  for c in payload["synthetic_comparisons"]:
    lines.append(f"| {c['p']} | {c['a']} | {c['metric']} | {stats.fmt_paired(c)} |")
  if payload["hh"]:
    lines += ["", "## hh-rlhf harmless-base (held-out 20%)", "",
              "| method | accuracy | balanced accuracy | length-matched accuracy | Pearson(score, len) | train acc. |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in payload["hh"]:
      lines.append(f"| {r['method']} | {stats.fmt(r['accuracy'])} | {stats.fmt(r['balanced_accuracy'])} | "
                   f"{stats.fmt(r['length_matched_accuracy'])} | {stats.fmt(r['pearson_score_length'])} | "
                   f"{stats.fmt(r['train_accuracy'])} |")
    lines += ["", f"Length-matched pairs: {payload['hh'][0]['length_matched_pairs']}; the length-only scorer's "
              f"accuracy: {payload['hh'][0]['length_only_accuracy']:.3f}.", "",
              "Paired by seed against BT, as above (Holm over this table's comparisons).", "",
              "| A | metric | A - BT |",
              "|---|---|---|"]
    for c in payload["hh_comparisons"]:
      lines.append(f"| {c['a']} | {c['metric']} | {stats.fmt_paired(c)} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  methods = list(dict.fromkeys(r["method"] for r in rows))
  width = 0.8 / max(1, len(methods))
  for ax, key, title in ((axes[0], "balanced_accuracy", "de-biased test: balanced accuracy"),
                         (axes[1], "adversarial_accuracy", "adversarial test (chosen always shorter): accuracy")):
    for k, method in enumerate(methods):
      mine = [r for r in rows if r["method"] == method]
      x = [BIAS_STRENGTHS.index(r["p"]) + (k - len(methods) / 2) * width for r in mine]
      ax.bar(x, [r[key]["mean"] for r in mine], width, yerr=[r[key]["std"] for r in mine], color=COLORS[method],
             label=method, capsize=2)
    ax.set_xticks(range(len(BIAS_STRENGTHS)), [f"p = {p}" for p in BIAS_STRENGTHS])
    ax.axhline(0.5, color="gray", ls="--", lw=0.8)
    ax.set(ylim=(0, 1.05), title=title, ylabel="accuracy (mean ± sample std over seeds)")
  axes[1].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> None:
  parser = flags.parser(__doc__, methods=METHODS, seeds=SEEDS, workdir="/tmp/dir_debias")
  parser.add_argument("--hh", default=HH, help="hh-rlhf harmless-base file ('' to skip the hh-rlhf runs)")
  args = parser.parse_args(argv)
  methods = flags.split_list(args.methods, allowed=METHODS, flag="--methods")
  seeds = flags.split_list(args.seeds, int, flag="--seeds")
  if set(seeds) & set(TUNE_SEEDS):
    raise SystemExit(f"--seeds overlap the tuning seeds {TUNE_SEEDS}")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(sets=flags.parse_sets(args.set), hh=args.hh)
  common["config_digest"] = flags.config_digest(make_config(dict(common, overrides={}, seed=0)))  # checks --set

  def grid(runs):
    return runner.finished_or_trained(runs, train_one, workdir, args.jobs, args.report_only,
                                      {k: common[k] for k in ("sets", "config_digest")},
                                      describe=lambda s: f"balanced {s['test']['balanced_accuracy']}")

  tuned = grid(estimator_runs(common))
  estimator_scores = {e: {str(p): validation_score([s for s in tuned if f"estimator_{e}/p{p}/" in s["name"]])
                          for p in BIAS_STRENGTHS} for e in ESTIMATORS}
  chosen_estimator = max(ESTIMATORS, key=lambda e: np.mean([v["mean"] for v in estimator_scores[e].values()]))
  tuned_lambdas = grid(lambda_runs(common, chosen_estimator))
  lambda_scores = {f"{lam:g}": {str(p): validation_score(
      [s for s in (tuned if lam == 1.0 else tuned_lambdas)
       if (f"estimator_{chosen_estimator}/p{p}/" if lam == 1.0 else f"lambda{lam:g}_{chosen_estimator}/p{p}/")
       in s["name"]]) for p in BIAS_STRENGTHS} for lam in LAMBDAS}
  chosen_lambda = {str(p): max(LAMBDAS, key=lambda lam: lambda_scores[f"{lam:g}"][str(p)]["mean"])
                   for p in BIAS_STRENGTHS}
  print(f"estimator {chosen_estimator}, lambda {chosen_lambda}", flush=True)
  synthetic = grid(synthetic_runs(common, methods, chosen_estimator, seeds))
  hh = grid(hh_runs(common, chosen_lambda[str(max(BIAS_STRENGTHS))], chosen_estimator, seeds)) if args.hh else []
  rows, comparisons = synthetic_table(synthetic, methods)
  hh_rows, hh_comparisons = hh_table(hh)
  payload = dict(
      design=dict(selection="estimator: argmax over ESTIMATORS of the mean (over p) validation balanced accuracy at "
                            "lambda 1; lambda per p: argmax over LAMBDAS; hh uses the lambda chosen at p = 0.9",
                  validation="the synthetic task drawn with data_seed 1 (reported runs: data_seed 0)",
                  tuning_seeds=list(TUNE_SEEDS), reported_seeds=seeds, label_noise=LABEL_NOISE,
                  statistic="paired by seed against BT: t interval, t test, exact sign-flip test (`statistics`)",
                  summary="mean ± sample std (n)", length_matched=f"|len_c - len_r| <= {LENGTH_MATCH} max(len)"),
      sets=common["sets"], common=COMMON,
      tuning={"estimator": estimator_scores, "chosen_estimator": chosen_estimator, "lambda": lambda_scores,
              "chosen_lambda": chosen_lambda},
      synthetic=rows, synthetic_comparisons=comparisons, hh=hh_rows, hh_comparisons=hh_comparisons,
      statistics=dict(synthetic=stats.statistics(comparisons), hh=stats.statistics(hh_comparisons)),
      provenance=results.provenance(tuned + tuned_lambdas + synthetic + hh, os.path.join(HERE, "run.py")))
  results.write_json(os.path.join(out, "results.json"), payload, tuned + tuned_lambdas + synthetic + hh,
                     report_only=args.report_only)
  results.copy_run_files(workdir, tuned + tuned_lambdas + synthetic + hh, out)
  if rows:
    plot(rows, os.path.join(out, "results.png"))
  results.write_markdown(out, "DIR de-biasing: BT vs DIR vs ODIN", markdown(payload), "Plot: `results.png`.",
                         os.path.join(HERE, "discussion.md"))
  print(f"results in {out}")


if __name__ == "__main__":
  main()
