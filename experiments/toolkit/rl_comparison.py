"""The design the GRPO-family comparisons on the multi-path task share (`grpo_vs_clipo_multipath`, `policy_losses`):
lr is tuned per method on validation, a pilot at the tuned lrs fixes N by a power estimate, then N paired seeds are
run.

Stages (`--stage`), each resumable from its per-run files (`runner`: a run whose done.json exists is not trained
again, so a stage can be continued over several sessions):
  pilot: tuning first: every method x `lrs` from the SFT of TUNE_SEED, each method's lr = argmax of the final
         validation sampled pass@1 (ties: greedy), flagged where it sits at the grid's edge. Then SFT seeds
         PILOT_SEEDS and each method at its tuned lr from each (the seed spread of the runs the main stage will
         make: one lr for all methods would measure a method far from its own optimum, e.g. one that diverges
         there); the paired sd over pilot seeds of (method - baseline) of the validation sampled pass@1 (never
         test: N is a calibration) fixes N = the smallest n >= MIN_SEEDS with 80% power for `target` (two-sided
         paired t, alpha 0.05; `stats.paired_n_for_power`) from the largest sd; written with the tuned lrs to the
         experiment's `pilot.json` (committed before any main run) with the command, the code and every run.
  main:  N and the tuned lrs read from pilot.json (the main runs never change them; the tuning runs are read
         again for the report and must give the same lrs; they and the pilot file's runs must carry the current
         code's config_digest, `runner.refuse_other_digests`, or the stage stops before training). Final: seeds
         0 .. N-1; seed k's SFT is trained with seed k and every method's seed-k run starts from it, so (method -
         baseline) and (method - SFT) are paired by seed and carry the SFT's own seed variance. Trained seed by
         seed (`seed_by_seed`); each finished seed's run files are kept in the experiment's `main_runs/`
         (committed), and a fresh workdir starts from those and the pilot's `pilot_runs/`, so the stage spans
         sessions whose machines keep nothing. Reported per
         held-out set (validation, test): greedy accuracy and sampled pass@1; the paired differences with the 95% t
         interval, paired t, sign-flip p, Holm-adjusted over the report.
Every run's GRPO config is the set-up's `grpo()` + the method's settings (`methods`) + --set; the SFT's `sft()` +
--sft-set. `--smoke` runs both stages on a tiny model for a few steps (a check that the pipeline runs; no numbers).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from typing import Callable

from experiments.toolkit import flags, results, runner, stats

TUNE_SEED = 100
PILOT_SEEDS = (200, 201, 202)
MIN_SEEDS = 5
SETS = ("validation", "test")
KINDS = ("pass1", "accuracy")
STAGES = results.doc_section(__doc__, "Stages", "Every run")  # results.json's design.stages, checked at import
PRIMARY = "pass1_validation"  # the pilot's outcome (validation: N is a calibration); the report's is pass1_test
SMOKE_SFT = {"steps": 20, "eval_every": 20, "checkpoint_every": 20, "model.d_model": 32, "model.num_layers": 1,
             "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64, "task.train_size": 400,
             "task.test_size": 32, "task.validation_size": 32, "decode.eval_problems": 32, "decode.batch_size": 16,
             "data.eval_batches": 1}
SMOKE_GRPO = {"steps": 2, "eval_every": 2, "checkpoint_every": 2, "data.prompts_per_step": 4,
              "data.eval_prompts": 8, "data.eval_samples": 1, "grpo.group_size": 4, "sampling.max_new_tokens": 40}


@dataclasses.dataclass(frozen=True)
class Experiment:
  """What one comparison fixes.

  Attributes:
    module: the module defining it as `EXPERIMENT` (runs carry this name: the workers import it).
    doc, here, title: the run.py docstring (--help), its folder (pilot.json, discussion.md), the report's title.
    config: the set-up module (`sft()`, `grpo()`).
    methods: {method: its GRPO config overrides} in table order; the first is the baseline every other is
      compared with.
    lrs: the tuning grid (the pilot runs each method at its tuned lr).
    target: the effect N is powered for (sampled pass@1), and where it comes from.
    max_seeds: the CPU budget's cap on N (the report says "cannot resolve at this scale" where the power estimate
      exceeds it).
    workdir: the default --workdir (shared by the experiments of this set-up: same-named runs are the same runs).
    diagnostics: metrics logged by the trainer whose per-run mean over steps the report summarises per method
      (a key added after runs finished is read from their metrics.jsonl at report time).
  """

  module: str
  doc: str
  here: str
  title: str
  config: object
  methods: dict
  lrs: tuple
  target: float
  target_source: str
  max_seeds: int
  workdir: str = "/tmp/multipath_rl_v3"  # v3: 8 updates a step (v2: 2 updates; /tmp/multipath_rl: SFT 600 steps)
  diagnostics: tuple = ()

  @property
  def baseline(self) -> str:
    return next(iter(self.methods))


# ------------------------------------------------------------------------------------------------------- runs


def experiment_of(run: dict) -> Experiment:
  return importlib.import_module(run["experiment"]).EXPERIMENT


def sft_config(exp: Experiment, run: dict):
  config = flags.apply_sets(exp.config.sft(), {**(SMOKE_SFT if run["smoke"] else {}), **run["sft_sets"]})
  config.seed = run["sft_seed"]
  return config


def grpo_config(exp: Experiment, run: dict):
  config = exp.config.grpo()
  if run["smoke"]:
    for key in ("d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim"):
      config.model[key] = SMOKE_SFT[f"model.{key}"]
    config.task.update({k.split(".")[1]: v for k, v in SMOKE_SFT.items() if k.startswith("task.")})
  config = flags.apply_sets(config, {**(SMOKE_GRPO if run["smoke"] else {}), **exp.methods[run["method"]],
                                     **run["sets"]})
  config.init_from = run["sft_dir"]
  config.seed = run["seed"]
  config.optim.learning_rate = run["lr"]
  return config


def _evals(row: dict) -> dict:
  return {k: float(v) for k, v in row.items() if k.startswith(("eval_accuracy_", "eval_pass1_"))}


def train_sft(run: dict, directory: str) -> dict:
  """The SFT of seed run['sft_seed'] (its eval reads validation only), then the GRPO trainer's evaluation of it
  (the 'sft' row: the same sets and decoding as every GRPO run's final eval)."""
  import jaxpt

  exp = experiment_of(run)
  jaxpt.train("sft", sft_config(exp, run), directory)
  trainer = jaxpt.build("grpo", grpo_config(exp, dict(run, method=exp.baseline, seed=0, lr=1e-5, sft_dir=directory)),
                         os.path.join(directory, "_start_eval"))
  return dict(evals=_evals(trainer.evaluate(trainer.init_state())), sft_curve=sft_curve(directory))


def sft_curve(directory: str) -> list[dict]:
  """The SFT's validation evals by step, from its metrics.jsonl (read again at report time: the record's copy can
  miss rows of a resumed run)."""
  return [{k: v for k, v in r.items() if k == "step" or k.startswith("eval_")}
          for r in results.read_metrics(directory) if any(k.startswith("eval_") for k in r)]


def train_grpo(run: dict, directory: str) -> dict:
  """One GRPO run from its seed's SFT; its final held-out evals and its diagnostics' means over steps."""
  import jaxpt

  exp = experiment_of(run)
  trainer = jaxpt.build("grpo", grpo_config(exp, run), directory)
  result = jaxpt.train("grpo", trainer.config, directory, built=trainer)
  runner.require_finished(result, directory)
  row = result.last_row if any(k.startswith("eval_pass1_") for k in result.last_row) else trainer.evaluate(
      result.state)
  return dict(evals=_evals(row), diagnostics=step_means(results.read_metrics(directory), diagnostic_keys(exp)))


def diagnostic_keys(exp: Experiment) -> tuple[str, ...]:
  return ("accuracy",) + tuple(exp.diagnostics)


def step_means(rows: list[dict], keys) -> dict[str, float]:
  """Each key's mean over the metrics rows that log it (CLIPO's similarities: over the steps that had anchors)."""
  means = {}
  for key in keys:
    values = [r[key] for r in rows if key in r and (not key.endswith("_sim") or r.get("clipo_num_anchors", 1) > 0)]
    means[key] = float(sum(values) / len(values)) if values else math.nan
  return means


def with_diagnostics(exp: Experiment, runs: list[dict], workdir: str) -> list[dict]:
  """The runs, each with the diagnostics its done.json lacks (keys the experiment added after it trained) read
  from its metrics.jsonl in the workdir."""
  for run in runs:
    missing = [k for k in diagnostic_keys(exp) if k not in run["diagnostics"]]
    if missing:
      rows = results.read_metrics(runner.run_dir(workdir, run))
      run["diagnostics"] = {**run["diagnostics"], **step_means(rows, missing)}
  return runs


def train_run(run: dict, directory: str) -> dict:
  """A grid's worker: an SFT (phase 'sft') or a GRPO run."""
  return (train_sft if run["phase"] == "sft" else train_grpo)(run, directory)


def seed_by_seed(seeds, sft_of: Callable, runs_of: Callable, grid: Callable, workdir: str,
                 keep: str | None) -> tuple[list[dict], list[dict]]:
  """The finished SFT and GRPO records of `seeds`, trained in waves: wave k is seed k's SFT (first: the longest
  run) beside seed k-1's GRPO runs (`runs_of`, once that SFT has finished), so both workers stay busy and a seed's
  runs finish together. After each wave a seed whose SFT and runs have all finished is copied to `keep`
  (`results.copy_run_files`; None: not kept), whole seeds only, so a later session's fresh workdir imports them
  (`runner.copy_finished`) and never needs the SFT checkpoints it has not got."""
  sfts, final = [], []
  for k in range(len(seeds) + 1):
    previous_sft = [r for r in sfts if k and r["sft_seed"] == seeds[k - 1]]
    finished = grid((sft_of(seeds[k]) if k < len(seeds) else []) + (runs_of(seeds[k - 1]) if previous_sft else []),
                    train_run)
    sfts += [r for r in finished if r["phase"] == "sft"]
    final += [r for r in finished if r["phase"] != "sft"]
    if keep and previous_sft:
      expected = previous_sft + runs_of(seeds[k - 1])
      if {r["name"] for r in expected} <= {r["name"] for r in final + previous_sft}:
        results.copy_run_files(workdir, expected, keep)
  return sfts, final


def sft_runs(seeds, common: dict) -> list[dict]:
  return [dict(common, name=f"sft/seed{s}", phase="sft", sft_seed=s) for s in seeds]


def grpo_runs(phase: str, methods, lrs: dict, seeds, common: dict, workdir: str) -> list[dict]:
  return [dict(common, name=f"{phase}/{m}/lr{lr:g}/seed{seed}", phase=phase, method=m, lr=lr, seed=seed,
               sft_dir=os.path.join(workdir, f"sft/seed{seed}"))
          for seed in seeds for m in methods for lr in lrs[m]]


# ---------------------------------------------------------------------------------------------------- statistics


def metric(run: dict, kind: str, split: str) -> float:
  return run["evals"].get(f"eval_{kind}_{split}", math.nan)


def comparisons(exp: Experiment, runs: list[dict], sfts: list[dict], methods, sets=SETS, kinds=KINDS,
                against_sft: bool = True) -> list[dict]:
  """Paired by seed: each method - the baseline, and (against_sft) each method - its seed's SFT policy; per
  kind x set. Unadjusted (see `stats.holm_adjust`)."""
  by = {(r["method"], r["seed"]): r for r in runs}
  sft_by = {s["sft_seed"]: s for s in sfts}
  out = []
  for kind in kinds:
    for split in sets:
      name = f"{kind}_{split}"
      for m in methods:
        pairs = [("sft", lambda seed: sft_by.get(seed))] if against_sft else []
        if m != exp.baseline and exp.baseline in methods:
          pairs.insert(0, (exp.baseline, lambda seed: by.get((exp.baseline, seed))))
        for b, other in pairs:
          seeds = sorted(seed for (mm, seed) in by if mm == m and other(seed) is not None)
          if len(seeds) >= 2:
            out.append(dict(a=m, b=b, metric=name, seeds=seeds, **stats.paired(
                [metric(by[(m, s)], kind, split) for s in seeds], [metric(other(s), kind, split) for s in seeds])))
  return out


def power(exp: Experiment, pilot: list[dict], methods) -> dict:
  """N from the pilot (module docstring; its runs at each method's tuned lr): the largest paired sd of PRIMARY over
  the method - baseline pairs."""
  comps = [c for c in comparisons(exp, pilot, [], methods, kinds=("pass1",), sets=("validation",), against_sft=False)]
  sds = {f"{c['a']}-{c['b']}": c["std_diff"] for c in comps}
  finite = [v for v in sds.values() if v is not None and math.isfinite(v) and v > 0]
  sd = max(finite) if finite else math.nan
  needed = stats.paired_n_for_power(sd, exp.target) if finite else math.inf
  n = int(min(max(needed, MIN_SEEDS), exp.max_seeds)) if math.isfinite(needed) else exp.max_seeds
  return dict(outcome=PRIMARY, target_effect=exp.target, target_source=exp.target_source,
              pilot_seeds=sorted({r["seed"] for r in pilot}), pilot_sd_diff=sds, sd_used=sd,
              n_for_80_power=needed if math.isfinite(needed) else None, n=n, min_seeds=MIN_SEEDS,
              max_seeds=exp.max_seeds, cap_binds=bool(not math.isfinite(needed) or needed > exp.max_seeds),
              detectable_effect_at_n=stats.detectable_effect(sd, n) if finite else None,
              power_at_n=stats.paired_power(sd, exp.target, n) if finite else None)


def select(exp: Experiment, tuning: list[dict], methods, lrs) -> tuple[dict, list[dict]]:
  """({method: lr with the highest final validation pass@1, then greedy accuracy}, the tuning table)."""
  table = [dict(method=r["method"], lr=r["lr"], validation_pass1=metric(r, "pass1", "validation"),
                validation=metric(r, "accuracy", "validation")) for r in tuning]
  best = {}
  for m in methods:
    rows = [r for r in table if r["method"] == m]
    if rows:
      key = lambda r: tuple(v if math.isfinite(v) else -math.inf for v in (r["validation_pass1"], r["validation"]))
      chosen = max(rows, key=key)
      best[m] = chosen["lr"]
      for r in rows:
        r["chosen"] = r is chosen
        r["at_grid_edge"] = r is chosen and len(lrs) > 1 and r["lr"] in (min(lrs), max(lrs))
  return best, table


def summary_rows(exp: Experiment, final: list[dict], sfts: list[dict], methods) -> list[dict]:
  rows = [dict(method="sft", lr=None, seeds=sorted(s["sft_seed"] for s in sfts),
               **{f"{k}_{s}": stats.summary([metric(r, k, s) for r in sfts]) for k in KINDS for s in SETS})]
  for m in methods:
    runs = sorted((r for r in final if r["method"] == m), key=lambda r: r["seed"])
    if runs:
      values = {k: [r["diagnostics"].get(k, math.nan) for r in runs] for k in runs[0]["diagnostics"]}
      diag = {k: stats.summary(v) for k, v in values.items()  # a metric the method never logs (GRPO's CLIPO
              if not all(x is None or math.isnan(x) for x in v)}  # similarities) is left out, not summarised as nan
      rows.append(dict(method=m, lr=runs[0]["lr"], seeds=[r["seed"] for r in runs], diagnostics=diag,
                       **{f"{k}_{s}": stats.summary([metric(r, k, s) for r in runs]) for k in KINDS for s in SETS}))
  return rows


# ------------------------------------------------------------------------------------------------------- report


def markdown(payload: dict) -> str:
  p = payload["power"]
  lines = [payload["provenance"], "",
           f"N = {p['n']} seeds, fixed before the main runs by the pilot (`pilot.json`: seeds {p['pilot_seeds']}, "
           f"each method at its tuned lr): the largest paired sd of {p['outcome']} ({p['sd_used']:.4f}); 80% power "
           f"for {p['target_effect']} needs n = {p['n_for_80_power']}" +
           (" (capped: the CPU budget, so this scale cannot resolve that effect)" if p["cap_binds"] else "") + ".",
           "", "## Learning rate, tuned on validation (sampled pass@1 / greedy accuracy)", "",
           "| method | " + " | ".join(f"lr {lr:g}" for lr in payload["lrs"]) + " | chosen |",
           "|---|" + "---:|" * (len(payload["lrs"]) + 1)]
  for m in payload["methods"]:
    rows = {r["lr"]: r for r in payload["tuning"] if r["method"] == m}
    if rows:
      chosen = next(r for r in rows.values() if r["chosen"])
      lines.append(f"| {m} | " + " | ".join(
          f"{rows[lr]['validation_pass1']:.3f} / {rows[lr]['validation']:.3f}" if lr in rows else "—"
          for lr in payload["lrs"]) + f" | {chosen['lr']:g}{' (grid edge)' if chosen['at_grid_edge'] else ''} |")
  for kind, title in (("pass1", "sampled pass@1"), ("accuracy", "greedy accuracy")):
    lines += ["", f"## Held-out {title}, mean ± sample std (n)", "", "| policy | lr | " + " | ".join(SETS) + " |",
              "|---|---:|" + "---:|" * len(SETS)]
    for r in payload["final"]:
      lr = "—" if r["lr"] is None else f"{r['lr']:g}"
      lines.append(f"| {r['method']} | {lr} | " + " | ".join(stats.fmt(r[f"{kind}_{s}"]) for s in SETS) + " |")
  lines += ["", "Differences (positive: A better), paired by seed (the SFT row: each seed's own SFT policy): " +
            stats.PAIRED_NOTE + ".", "", "| metric | A - B | difference |", "|---|---|---|"]
  for c in payload["comparisons"]:
    lines.append(f"| {c['metric']} | {c['a']} - {c['b']} | {stats.fmt_paired(c)} |")
  diag = [r for r in payload["final"] if r.get("diagnostics")]
  if diag:
    lines += ["", "Diagnostics, each run's mean over its steps: " + "; ".join(
        f"{r['method']}: " + ", ".join(f"{k} {stats.fmt(v)}" for k, v in r["diagnostics"].items()) for r in diag)
        + "."]
  return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- main


def main(exp: Experiment, argv=None) -> None:
  parser = flags.parser(exp.doc, methods=tuple(exp.methods), seeds=(), workdir=exp.workdir)
  parser.add_argument("--stage", choices=("pilot", "main"), default="main")
  parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field of the SFT config (repeatable)")
  parser.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in exp.lrs), help="the tuning grid of lrs")
  parser.add_argument("--pilot", default=os.path.join(exp.here, "pilot.json"),
                      help="the pilot's file: written by --stage pilot, read by --stage main (N and the tuned lrs)")
  parser.add_argument("--pilot-seeds", default=",".join(map(str, PILOT_SEEDS)),
                      help="the pilot's seeds (disjoint from the tuning seed and the final seeds 0 .. N-1)")
  parser.add_argument("--keep-runs", default=os.path.join(exp.here, "main_runs"),
                      help="the main stage's finished seeds (SFT and every run), copied here as each completes "
                           "(committed: a fresh --workdir imports them and the pilot's runs, and goes on)")
  parser.add_argument("--smoke", action="store_true", help="a tiny run of both stages (pipeline check, no numbers)")
  args = parser.parse_args(argv)
  methods = flags.split_list(args.methods, allowed=tuple(exp.methods), flag="--methods")
  if exp.baseline not in methods:
    raise SystemExit(f"--methods must include the baseline {exp.baseline!r}")
  lrs = flags.split_list(args.lrs, float, flag="--lrs")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(experiment=exp.module, smoke=args.smoke, sets=flags.parse_sets(args.set),
                sft_sets=flags.parse_sets(args.sft_set))
  probe = dict(common, method=exp.baseline, seed=0, lr=0.0, sft_dir="", sft_seed=0)
  common["config_digest"] = flags.config_digest(sft_config(exp, probe), grpo_config(exp, probe))  # bad --set fails
  for m in methods:
    grpo_config(exp, dict(probe, method=m))
  overrides = {k: common[k] for k in ("smoke", "sets", "sft_sets", "config_digest")}

  def grid(runs, train: Callable, report_only: bool = args.report_only, strict: bool = False) -> list[dict]:
    return runner.finished_or_trained(runs, train, workdir, args.jobs, report_only, overrides, strict=strict)

  pilot_seeds = PILOT_SEEDS[:2] if args.smoke else flags.split_list(args.pilot_seeds, int, flag="--pilot-seeds")
  if len(pilot_seeds) < 2 or min(pilot_seeds) < exp.max_seeds or TUNE_SEED in pilot_seeds:
    raise SystemExit(f"--pilot-seeds: at least 2, none of them {TUNE_SEED} or a final seed (< {exp.max_seeds})")
  main_stage = args.stage == "main" and not args.smoke
  if main_stage:  # the pilot's file first: the main stage trains nothing before it is read and matches
    fixed = results.read_pilot(args.pilot, "tunes the lrs and fixes N")
    for kept in (os.path.join(os.path.dirname(os.path.abspath(args.pilot)), "pilot_runs"), args.keep_runs):
      runner.import_kept(kept, workdir)
    if fixed["lrs"] != lrs or not set(methods) <= set(fixed["best_lr"]):
      raise SystemExit(f"{args.pilot}: tuned over --lrs {fixed['lrs']} for the methods {list(fixed['best_lr'])}, "
                       f"not {lrs} for {methods}")
  read_only = args.report_only or main_stage  # the main stage reads the pilot stage's tuning runs
  strict = main_stage and not args.report_only  # then trains the final runs: all under the current config
  if strict:
    runner.refuse_other_digests(fixed["sfts"] + fixed["runs"], overrides, args.pilot)
  tune_sft = grid(sft_runs([TUNE_SEED], common), train_sft, report_only=read_only, strict=strict)
  tuning = grid(grpo_runs("tune", methods, {m: lrs for m in methods}, [TUNE_SEED], common, workdir), train_grpo,
                report_only=read_only, strict=strict)
  runner.require_grid_finished("tuning", tune_sft + tuning, 1 + len(methods) * len(lrs),
                               f" in {workdir}; run --stage pilot (again: it resumes)")
  best, tuning_table = select(exp, tuning, methods, lrs)
  print("tuned lr:", best, flush=True)
  if args.stage == "pilot" or args.smoke:
    sfts = grid(sft_runs(pilot_seeds, common), train_sft)
    pilot = grid(grpo_runs("pilot", methods, {m: [best[m]] for m in methods}, pilot_seeds, common, workdir),
                 train_grpo)
    runner.require_grid_finished("pilot", sfts + pilot, len(pilot_seeds) * (1 + len(methods)),
                                 "; run the stage again (it resumes) before N can be fixed")
    estimate = power(exp, pilot, methods)
    path = os.path.join(out, "pilot.json") if args.smoke else args.pilot
    results.write_json(path, dict(power=estimate, methods=methods, settings={m: exp.methods[m] for m in methods},
                                 lrs=lrs, best_lr=best, tuning=tuning_table,
                                 sft_curves={s["sft_seed"]: sft_curve(runner.run_dir(workdir, s))
                                             for s in tune_sft + sfts},
                                 sfts=tune_sft + sfts, runs=tuning + pilot), tune_sft + tuning + sfts + pilot)
    if not args.smoke:
      results.copy_run_files(workdir, tune_sft + tuning + sfts + pilot,
                             os.path.join(os.path.dirname(path), "pilot_runs"))
    print(f"pilot: N = {estimate['n']} (80% power needs {estimate['n_for_80_power']}; {path})", flush=True)
    if not args.smoke:
      return
  if args.smoke:
    n, how = 2, "smoke run: 2 seeds (a check that the pipeline runs; no conclusions)"
  else:
    estimate, n = fixed["power"], fixed["power"]["n"]
    if {m: fixed["best_lr"][m] for m in methods} != best:
      raise SystemExit(f"{args.pilot}: its tuned lrs {fixed['best_lr']} are not those of the tuning runs in "
                       f"{workdir}, {best} (another workdir?); the main stage runs at the pilot's")
    how = (f"N = {n} fixed before the main runs by the pilot's power estimate ({os.path.relpath(args.pilot)}: 80% "
           f"power for {exp.target} on {PRIMARY}, paired t, alpha 0.05, from the pilot's largest paired sd, each "
           "method at its tuned lr)")
  seeds = list(range(n))
  sfts, final = seed_by_seed(
      seeds, lambda s: sft_runs([s], common),
      lambda s: grpo_runs("final", [m for m in methods if m in best], {m: [best[m]] for m in best}, [s], common,
                          workdir),
      grid, workdir, keep=args.keep_runs if main_stage and not args.report_only else None)
  final = with_diagnostics(exp, final, workdir)
  comps = stats.holm_adjust(comparisons(exp, final, sfts, methods))
  payload = dict(
      design=dict(stages=STAGES, tuning_seed=TUNE_SEED,
                  reported_seeds=seeds, summary="mean ± sample std (n)"),
      methods=methods, settings={m: exp.methods[m] for m in methods}, sets=common["sets"],
      sft_sets=common["sft_sets"], lrs=lrs, best_lr=best, tuning=tuning_table, power=estimate,
      final=summary_rows(exp, final, sfts, methods), comparisons=comps, statistics=stats.statistics(comps, how),
      sft_curves={s["sft_seed"]: sft_curve(runner.run_dir(workdir, s)) for s in tune_sft + sfts},
      provenance=results.provenance(tune_sft + tuning + sfts + final, os.path.join(exp.here, "run.py")))
  everything = tune_sft + tuning + sfts + final
  results.write_json(os.path.join(out, "results.json"), payload, everything, report_only=args.report_only)
  results.copy_run_files(workdir, everything, out)
  results.write_markdown(out, exp.title, markdown(payload), "Per-run files: `runs/`.",
                         os.path.join(exp.here, "discussion.md"))
  print(f"results in {out}")

