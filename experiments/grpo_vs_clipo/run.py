"""GRPO vs GRPO + CLIPO from one SFT'd policy: learning rates tuned equally on validation, 4 seeds paired.

1. sft:   one `jaxpt.train("sft", ...)` run of `config.sft()` (3-step arithmetic, trained to its plateau; its eval
          curve is reported); every GRPO run starts from it.
2. tune:  GRPO and CLIPO, each at every lr in LRS, tuning seed 100. Each method's lr is the one with the highest
          final validation reward: sampled pass@1 (data.eval_samples samples per problem at T = 1, as the training
          rollouts are drawn) on the 'validation' set (training-split problems after the first task.train_size:
          never trained on, by SFT or GRPO); ties go to the higher greedy accuracy; the test sets are not looked at.
3. final: both methods at their tuned lr, seeds 0..3. Reported per held-out set (test, test_rename,
          test_distractor, test_numbers: new numbers drawn from the test split): greedy accuracy and sampled
          pass@1 (data.eval_samples samples per problem at T = 1, the same fixed keys for every run), and, paired
          by seed, CLIPO - GRPO with its 95% t interval, paired t and exact sign-flip p (Holm-adjusted)
          (`experiments.toolkit.stats`).
CLIPO as the official code runs it (`config.grpo(clipo=True)`): a 512-wide projection head and a head-only warm-up.

  python experiments/grpo_vs_clipo/run.py [--workdir /tmp/grpo_vs_clipo] [--jobs 2] [--out DIR]
  python experiments/grpo_vs_clipo/run.py --set steps=300 --sft-set steps=4000     # a larger rerun
  python experiments/grpo_vs_clipo/run.py --report-only --out experiments/grpo_vs_clipo/results --overwrite

`--set` changes the GRPO config of every run, `--sft-set` the SFT config. Runs are resumable (WORKDIR/sft,
WORKDIR/<phase>/<method>/lr<lr>/seed<k>); a workdir made with other overrides is refused.
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

import jaxpt  # noqa: E402

from experiments.grpo_vs_clipo import config as config_lib  # noqa: E402
from experiments.toolkit import flags, results, runner, stats  # noqa: E402

METHODS = ("grpo", "clipo")
LRS = (3e-5, 1e-4, 3e-4)
TUNE_SEEDS = (100,)
SEEDS = (0, 1, 2, 3)
SETS = ("test", "test_rename", "test_distractor", "test_numbers")
COLORS = {"sft": "tab:gray", "grpo": "tab:blue", "clipo": "tab:orange"}
LABELS = {"sft": "SFT (start)", "grpo": "GRPO", "clipo": "GRPO + CLIPO"}


# ------------------------------------------------------------------------------------------------------- runs


def sft_config(sets: dict):
  return flags.apply_sets(config_lib.sft(), sets)


def grpo_config(run: dict):
  config = flags.apply_sets(config_lib.grpo(clipo=run["method"] == "clipo"), run["sets"])
  config.init_from = run["sft_dir"]
  config.seed = run["seed"]
  config.optim.learning_rate = run["lr"]
  return config


def train_sft(run: dict, directory: str) -> dict:
  """The SFT run, then the GRPO trainer's own evaluation of it (the 'start' row: same sets, same decoding)."""
  jaxpt.train("sft", sft_config(run["sft_sets"]), directory)
  trainer = jaxpt.build("grpo", grpo_config(dict(run, method="grpo", seed=0, lr=1e-5, sft_dir=directory)),
                         os.path.join(directory, "_start_eval"))
  curve = [{k: v for k, v in r.items() if k == "step" or k.startswith("eval_")}
           for r in results.read_metrics(directory) if any(k.startswith("eval_") for k in r)]
  return dict(evals=trainer.evaluate(trainer.init_state()), sft_curve=curve)


def train_grpo(run: dict, directory: str) -> dict:
  """One GRPO run, then its held-out evals (the final step's; computed from the final state when the run was
  already at its last step, e.g. resumed after a kill between its last checkpoint and its record)."""
  trainer = jaxpt.build("grpo", grpo_config(run), directory)
  result = jaxpt.train("grpo", trainer.config, directory, built=trainer)
  runner.require_finished(result, directory)
  is_eval = lambda key: key.startswith(("eval_accuracy_", "eval_pass1_"))  # noqa: E731
  row = result.last_row if any(map(is_eval, result.last_row)) else trainer.evaluate(result.state)
  evals = {k: float(v) for k, v in row.items() if is_eval(k)}
  rollouts = [r["accuracy"] for r in results.read_metrics(directory) if "accuracy" in r]
  return dict(evals=evals, final_rollout_accuracy=float(sum(rollouts[-10:]) / max(1, len(rollouts[-10:]))))


def grid_runs(phase: str, methods, lrs: dict, seeds, common: dict) -> list[dict]:
  return [dict(common, name=f"{phase}/{m}/lr{lr:g}/seed{seed}", phase=phase, method=m, lr=lr, seed=seed)
          for seed in seeds for m in methods for lr in lrs[m]]


# ---------------------------------------------------------------------------------------------------- report


def select(tuning: list[dict], methods) -> tuple[dict, list[dict]]:
  """({method: lr with the highest final validation pass@1, then greedy accuracy}, the tuning table)."""
  table = [dict(method=s["method"], lr=s["lr"], seed=s["seed"],
                validation=s["evals"].get("eval_accuracy_validation", math.nan),
                validation_pass1=s["evals"].get("eval_pass1_validation", math.nan)) for s in tuning]
  best = {m: max((r for r in table if r["method"] == m), key=lambda r: (r["validation_pass1"], r["validation"]))["lr"]
          for m in methods if any(r["method"] == m for r in table)}
  return best, table


def final_table(final: list[dict], sft: dict) -> tuple[list[dict], list[dict]]:
  rows = [dict(method="sft", lr=None, seeds=[], **{f"{kind}_{name}": stats.summary([sft["evals"][
      f"eval_{kind}_{name}"]]) for kind in ("accuracy", "pass1") for name in SETS})]
  by_method = {}
  for method in METHODS:
    runs = sorted((s for s in final if s["method"] == method), key=lambda s: s["seed"])
    if runs:
      by_method[method] = {s["seed"]: s["evals"] for s in runs}
      rows.append(dict(method=method, lr=runs[0]["lr"], seeds=[s["seed"] for s in runs],
                       **{f"{kind}_{name}": stats.summary([s["evals"][f"eval_{kind}_{name}"] for s in runs])
                          for kind in ("accuracy", "pass1") for name in SETS}))
  comparisons = []
  for kind in ("accuracy", "pass1"):
    for name in SETS:
      key = f"eval_{kind}_{name}"
      for method, by_seed in by_method.items():  # against the one SFT policy they start from
        seeds = sorted(by_seed)
        comparisons.append(dict(a=method, b="sft", metric=f"{kind}_{name}", seeds=seeds, **stats.paired(
            [by_seed[i][key] for i in seeds], [sft["evals"][key]] * len(seeds))))
      if len(by_method) == 2:
        seeds = sorted(set(by_method["clipo"]) & set(by_method["grpo"]))
        comparisons.append(dict(a="clipo", b="grpo", metric=f"{kind}_{name}", seeds=seeds, **stats.paired(
            [by_method["clipo"][i][key] for i in seeds], [by_method["grpo"][i][key] for i in seeds])))
  return rows, stats.holm_adjust(comparisons)


CLIPO_DIAGNOSTICS = ("clipo_num_anchors", "clipo_pos_sim", "clipo_neg_sim", "clipo_reward_mean")


def clipo_diagnostics(final: list[dict], workdir: str) -> dict:
  """{metric: summary over the CLIPO runs of each run's mean over its steps} for CLIPO_DIAGNOSTICS: how many
  anchors a step had, the anchors' mean cosine similarity to their positives and negatives, the mean reward."""
  per_run = [[r for r in results.read_metrics(runner.run_dir(workdir, s)) if "clipo_num_anchors" in r]
             for s in final if s["method"] == "clipo"]
  return {key: stats.summary([sum(r[key] for r in rows) / len(rows) for rows in per_run if rows])
          for key in CLIPO_DIAGNOSTICS}


def markdown(payload: dict) -> str:
  lines = [payload["provenance"], "", "## Learning rate, tuned on validation (sampled pass@1 / greedy accuracy, "
           f"seed {payload['design']['tuning_seeds']})", "", "| method | " +
           " | ".join(f"lr {lr:g}" for lr in payload["lrs"]) + " | chosen |", "|---|" + "---:|" *
           (len(payload["lrs"]) + 1)]
  for method in METHODS:
    rows = {r["lr"]: r for r in payload["tuning"] if r["method"] == method}
    if rows:
      lines.append(f"| {LABELS[method]} | " + " | ".join(
          f"{rows[lr]['validation_pass1']:.3f} / {rows[lr]['validation']:.3f}" if lr in rows else "—"
          for lr in payload["lrs"]) +
                   f" | {payload['best_lr'][method]:g} |")
  for kind, title in (("accuracy", "greedy accuracy"), ("pass1", "sampled pass@1")):
    lines += ["", f"## Held-out {title}", "", "| policy | lr | " + " | ".join(SETS) + " |",
              "|---|---:|" + "---:|" * len(SETS)]
    for r in payload["final"]:
      lr = "—" if r["lr"] is None else f"{r['lr']:g}"
      lines.append(f"| {LABELS[r['method']]} | {lr} | " + " | ".join(stats.fmt(r[f"{kind}_{n}"]) for n in SETS) +
                   " |")
  curve = payload["sft"]["sft_curve"]
  key = next((k for k in (curve[0] if curve else {}) if k.startswith("eval_answer_accuracy")), None)
  if key:
    lines += ["", "SFT plateau check, the SFT's own held-out greedy accuracy by step: " +
              ", ".join(f"{r['step']}: {r[key]:.3f}" for r in curve) + "."]
  lines += ["", "Differences (positive: A better): " + stats.PAIRED_NOTE + "; against the SFT policy, each seed's "
            "run minus the SFT's one number (a one-sample comparison: the SFT's own seed variance is left out).", "",
            "| metric | A - B | difference |", "|---|---|---|"]
  for c in payload["comparisons"]:
    lines.append(f"| {c['metric']} | {LABELS[c['a']]} - {LABELS[c['b']]} | {stats.fmt_paired(c)} |")
  if payload.get("clipo_diagnostics"):
    lines += ["", "CLIPO diagnostics, each run's mean over its steps: " + ", ".join(
        f"{k} {stats.fmt(v)}" for k, v in payload["clipo_diagnostics"].items()) + "."]
  return "\n".join(lines)


def plot(payload: dict, sft: dict, final: list[dict], workdir: str, out: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  curve = sft["sft_curve"]
  key = "eval_answer_accuracy" if curve and "eval_answer_accuracy" in curve[0] else None  # problems solved
  if key:
    axes[0].plot([r["step"] for r in curve], [r[key] for r in curve], "o-", color=COLORS["sft"])
  axes[0].set(xlabel="SFT step", ylabel="problems solved, greedy",
              title="SFT: held-out greedy accuracy (plateau check)")
  for s in final:
    rows = [r for r in results.read_metrics(runner.run_dir(workdir, s)) if "accuracy" in r]
    acc = np.convolve([r["accuracy"] for r in rows], np.ones(10) / 10, mode="valid") if len(rows) >= 10 else []
    axes[1].plot(range(10, 10 + len(acc)), acc, color=COLORS[s["method"]], alpha=0.7,
                 label=LABELS[s["method"]] if s["seed"] == min(payload["design"]["reported_seeds"]) else None)
  axes[1].set(xlabel="GRPO step", ylabel="rollout accuracy (10-step mean)", title="Training rollouts")
  axes[1].legend(fontsize=8)
  width = 0.27
  for i, r in enumerate(payload["final"]):
    axes[2].bar(np.arange(len(SETS)) + (i - 1) * width, [100 * r[f"accuracy_{n}"]["mean"] for n in SETS], width,
                yerr=[100 * r[f"accuracy_{n}"]["std"] for n in SETS], color=COLORS[r["method"]],
                label=LABELS[r["method"]], capsize=2)
  axes[2].set_xticks(np.arange(len(SETS)), [n.replace("test_", "") for n in SETS])
  axes[2].set(ylabel="greedy accuracy (%), mean ± sample std", title="Held-out sets", ylim=(0, 105))
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "curves.png"), dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> None:
  parser = flags.parser(__doc__, methods=METHODS, seeds=SEEDS, workdir="/tmp/grpo_vs_clipo")
  parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field of the SFT config (repeatable)")
  parser.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in LRS), help="the tuning grid of lrs")
  args = parser.parse_args(argv)
  methods = flags.split_list(args.methods, allowed=METHODS, flag="--methods")
  seeds = flags.split_list(args.seeds, int, flag="--seeds")
  lrs = flags.split_list(args.lrs, float, flag="--lrs")
  if set(seeds) & set(TUNE_SEEDS):
    raise SystemExit(f"--seeds overlap the tuning seeds {TUNE_SEEDS}")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(sets=flags.parse_sets(args.set), sft_sets=flags.parse_sets(args.sft_set),
                sft_dir=os.path.join(workdir, "sft"))
  common["config_digest"] = flags.config_digest(  # bad overrides fail here, before any training
      sft_config(common["sft_sets"]), *(grpo_config(dict(common, method=m, seed=0, lr=0.0)) for m in METHODS))
  overrides = {k: common[k] for k in ("sets", "sft_sets", "config_digest")}

  def grid(runs, train):
    return runner.finished_or_trained(runs, train, workdir, args.jobs, args.report_only, overrides)

  sft = grid([dict(common, name="sft")], train_sft)
  if not sft:
    raise SystemExit("the SFT run did not finish")
  tuning = grid(grid_runs("tune", methods, {m: lrs for m in methods}, TUNE_SEEDS, common), train_grpo)
  best_lr, tuning_table = select(tuning, methods)
  print("tuned lr:", best_lr, flush=True)
  final = grid(grid_runs("final", methods, {m: [best_lr[m]] for m in methods}, seeds, common), train_grpo)
  rows, comparisons = final_table(final, sft[0])
  payload = dict(
      design=dict(selection="each method's lr = argmax over --lrs of the final sampled pass@1 (ties: greedy "
                            "accuracy) on 'validation' (training-split problems after task.train_size, unseen in "
                            "training)",
                  tuning_seeds=list(TUNE_SEEDS), reported_seeds=seeds,
                  statistic="paired by seed, CLIPO - GRPO: t interval, t test, exact sign-flip test; each "
                            "method - SFT: the same on each seed's difference from the SFT policy's number",
                  summary="mean ± sample std (n)"),
      sets=common["sets"], sft_sets=common["sft_sets"], lrs=lrs, best_lr=best_lr, tuning=tuning_table,
      sft=sft[0], final=rows, comparisons=comparisons, statistics=stats.statistics(comparisons),
      clipo_diagnostics=clipo_diagnostics(final, workdir),
      provenance=results.provenance(sft + tuning + final, os.path.join(HERE, "run.py")),
      sft_config=sft_config(common["sft_sets"]).to_dict(),
      grpo_config={m: grpo_config(dict(common, method=m, seed=0, lr=best_lr.get(m, 0.0))).to_dict()
                   for m in methods})
  results.write_json(os.path.join(out, "results.json"), payload, sft + tuning + final,
                     report_only=args.report_only)
  results.copy_run_files(workdir, sft + tuning + final, out)
  plot(payload, sft[0], final, workdir, out)
  results.write_markdown(out, "GRPO vs GRPO + CLIPO", markdown(payload), "Plot: `curves.png`.",
                         os.path.join(HERE, "discussion.md"))
  print(f"results in {out}")


if __name__ == "__main__":
  main()
