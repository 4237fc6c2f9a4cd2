"""The compute each committed experiment took (issue 31 item 5), read only from the committed per-run files:

    python3 experiments/compute.py            # rewrites experiments/compute.json
    python3 experiments/compute.py --table    # also prints the table of experiments/README.md

For every committed `done.json` of an experiment (its `results/runs/`, and the pilot and earlier-design folders
beside them: `pilot_runs*/`, `main_runs/`, `v1/`, ...; not `kept_runs/`, where an experiment still running keeps its
runs: it joins when its results are committed): the number of runs and the sum of their `wall_s`, in all and by
phase (tune, sft, final, ...). `wall_s` is one run's seconds from its start to its done.json, as the runner
measured it, so the sum is the time of the runs one after the other: not the grid's elapsed time (a grid with
`--jobs 2` ran two at once) nor its CPU time (a run alone may use both cores; other jobs on the machine stretched
some runs); data preparation and report building are left out. Each distinct file counts once: a copy within the
experiment (`results/runs/` repeats its kept runs) is skipped, and a file byte for byte another experiment's, earlier
in ORDER (`residual_schemes_lm` reuses `siamese_vs_prenorm`'s single-stream runs, the same computation), is reused,
not trained again: counted under `reused`. An experiment that records its compute otherwise (`bf16_rollouts`: one
program, no per-run files) is listed from its results.json's `compute` (its leading seconds join the total).
"""

from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run as a script
  sys.path.insert(0, REPO_ROOT)

from experiments.toolkit import results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "compute.json")
ORDER = ("siamese_vs_prenorm", "residual_schemes_lm", "siamese_vit", "siamese_vit_powered", "siamese_dit",
         "dir_debias", "grpo_vs_clipo", "grpo_vs_clipo_multipath", "policy_losses",
         "rlhf_reward_hacking")  # who first trained a run
IN_PROGRESS = "kept_runs"  # the folder of an experiment's runs while its stages are still running
RECORDED = ("bf16_rollouts",)  # experiments that state their compute in their results.json


def run_files(experiment: str) -> list[str]:
  """Every committed done.json of `experiment` outside `kept_runs/`."""
  paths = glob.glob(os.path.join(HERE, experiment, "**", "done.json"), recursive=True)
  return sorted(p for p in paths if IN_PROGRESS not in os.path.relpath(p, HERE).split(os.sep))


def experiment_row(experiment: str, seen: dict[str, str]) -> dict:
  """One experiment's timed runs, wall seconds (total and by phase), reused runs and runs recorded without a time
  (`untimed`); `seen` maps each done.json's sha256 to the experiment that first holds it (updated)."""
  by_phase: dict[str, list[float]] = collections.defaultdict(list)
  reused, untimed = collections.Counter(), 0
  for path in run_files(experiment):
    with open(path, "rb") as f:
      raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest in seen:
      if seen[digest] != experiment:
        reused[seen[digest]] += 1
      continue
    seen[digest] = experiment
    run = json.loads(raw)
    if run.get("wall_s") is None:  # recorded without a time (rlhf_reward_hacking v1's SFT)
      untimed += 1
      continue
    by_phase[run.get("phase") or "run"].append(float(run["wall_s"]))
  wall = sum(sum(v) for v in by_phase.values())
  return dict(experiment=experiment, runs=sum(len(v) for v in by_phase.values()), wall_s=round(wall),
              wall_h=round(wall / 3600, 2), by_phase={p: dict(runs=len(v), wall_s=round(sum(v)))
                                                      for p, v in sorted(by_phase.items())},
              reused=dict(reused), untimed=untimed)


def compute() -> dict:
  seen: dict[str, str] = {}
  rows = [experiment_row(e, seen) for e in ORDER]
  for experiment in RECORDED:
    with open(os.path.join(HERE, experiment, "results.json")) as f:
      rows.append(dict(experiment=experiment, recorded=json.load(f)["compute"]))
  total = sum(r["wall_s"] if "wall_s" in r else int(r["recorded"].split()[0]) for r in rows)
  return dict(note=__doc__.split("\n\n")[1].replace("\n", " "), experiments=rows,
              total=dict(runs=sum(r.get("runs", 0) for r in rows), wall_s=total, wall_h=round(total / 3600, 1)))


def table(result: dict) -> str:
  lines = ["| experiment | runs | wall time of its runs (h) | by phase (runs, h) | not counted |",
           "|---|---:|---:|---|---|"]
  for r in result["experiments"]:
    if "recorded" in r:
      lines.append(f"| {r['experiment']} | 1 program | {r['recorded']} | | |")
      continue
    phases = ", ".join(f"{p} {v['runs']}, {v['wall_s'] / 3600:.2f}" for p, v in r["by_phase"].items())
    skipped = [f"{n} reused runs of {e}" for e, n in r["reused"].items()]
    skipped += [f"{r['untimed']} run recorded without a time"] if r["untimed"] else []
    lines.append(f"| {r['experiment']} | {r['runs']} | {r['wall_h']:.2f} | {phases} | {', '.join(skipped)} |")
  t = result["total"]
  lines.append(f"| all | {t['runs']} | {t['wall_h']:.1f} | | |")
  return "\n".join(lines)


def main(argv=None) -> None:
  results.summary_main(__doc__, OUT, compute, table, "compute table", argv)


if __name__ == "__main__":
  main()
