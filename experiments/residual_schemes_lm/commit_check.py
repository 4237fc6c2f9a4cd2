"""Do the commits that trained residual_schemes_lm's runs train them identically? (issue 31 item 5: "a test showing
the commits train identically", the alternative to a rerun at one commit.)

The committed runs (`results/runs/*/done.json`, `environment.git_head`) were trained at seven commits: the
single-stream schemes' final runs at 679dbd2, the multi-stream and MoE ones at 9f01e46, tuning runs at five more.
For every scheme, this trains one short run (40 steps of the experiment's config, evaluated at steps 20 and 40) at
the scheme's committed final lr and seed 0, at every commit that trained any of that scheme's runs and at the last
one, REFERENCE, each from a detached worktree of that commit, with that commit's own harness
(`experiments/siamese_vs_prenorm/run.py` where the runs were trained by it, else
`experiments/toolkit/lm_comparison.py`: both have `prepare_corpus(workdir, common)` and `train_one(run,
directory)`) and its own data preparation (corpus, tokenizer, packed rows), on this machine, and compares each
commit's logged training losses, validation losses and test loss with REFERENCE's, bit for bit. Equal everywhere:
those commits train the scheme's runs identically, so the report's pairs compare runs of one computation. Any
difference is listed (the scheme, commit and first differing value). Each run's first logged row (step 10, the
mean over steps 1-10, all inside the 10-step warm-up, so the same whatever the run's length) is also compared with
the committed final run of that scheme at seed 0 (`results/runs/final/<scheme>/lr<lr>/seed0/metrics.jsonl`):
equal, this machine reproduces the committed runs themselves. A control shows that the comparison can fail: the
first scheme checked is also trained at CONTROL, a later commit whose gradient clip rounds differently, and must
differ from REFERENCE (`control`).

    python experiments/residual_schemes_lm/commit_check.py [--workdir /tmp/commit_check] \
        [--out experiments/residual_schemes_lm/results/commit_check.json] [--schemes pre,hc:2]

Each worktree is `git worktree add --detach` under the workdir (removed at the end); one run takes 20-40 s here (a
MoE one about 2 min). `--one` is the worker the check runs inside each worktree (its current directory).
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
REFERENCE = "9f01e46"  # the last commit that trained any of the runs
CONTROL = "a97cd59"  # a later commit that trains differently (the gradient clip as one scalar factor: other rounding)
HARNESS = {"8beaf73": "siamese_vs_prenorm", "679dbd2": "siamese_vs_prenorm"}  # else lm_comparison
SETS = {"steps": 40, "log_every": 10, "eval_every": 20, "checkpoint_every": 40}
SEED = 0
ROW_KEYS = ("accuracy", "grad_norm", "loss", "lr", "nll", "nonfinite", "z_loss")  # a logged row's training values
RUNS = os.path.join(HERE, "results", "runs")
CORPUS = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "tinyshakespeare"))


def committed_final_run(scheme: str) -> tuple[float, dict]:
  """(lr, first logged row's ROW_KEYS) of the committed final run of `scheme` at SEED."""
  (path,) = glob.glob(os.path.join(RUNS, "final", scheme, "*", f"seed{SEED}", "done.json"))
  with open(path) as f:
    lr = json.load(f)["lr"]
  with open(os.path.join(os.path.dirname(path), "metrics.jsonl")) as f:
    first = json.loads(f.readline())
  return lr, {k: first[k] for k in ROW_KEYS}


def commits_by_scheme(runs_dir: str = RUNS) -> dict[str, list[str]]:
  """{scheme: the commits that trained its committed runs, then REFERENCE}, from each run's done.json."""
  found: dict[str, set[str]] = {}
  for path in sorted(glob.glob(os.path.join(runs_dir, "**", "done.json"), recursive=True)):
    with open(path) as f:
      run = json.load(f)
    found.setdefault(run["scheme"], set()).add(run["environment"]["git_head"][:7])
  return {scheme: sorted(commits - {REFERENCE}) + [REFERENCE] for scheme, commits in found.items()}


# ------------------------------------------------------------------------------------- the worker, in a worktree


def train_here(harness: str, scheme: str, lr: float, workdir: str, corpus: str) -> dict:
  """One SETS run of `scheme` at `lr` with this directory's code: its logged losses, validation losses, test loss
  and first logged row (ROW_KEYS)."""
  sys.path.insert(0, os.getcwd())
  module = importlib.import_module("experiments.siamese_vs_prenorm.run" if harness == "siamese_vs_prenorm"
                                   else "experiments.toolkit.lm_comparison")
  import jaxpt

  if not os.path.abspath(jaxpt.__file__).startswith(os.getcwd() + os.sep):
    raise SystemExit(f"jaxpt imported from {jaxpt.__file__}, not this worktree {os.getcwd()}")
  common = dict(sets=dict(SETS), corpus=corpus, config="experiments.residual_schemes_lm.config",
                data_dir=os.path.join(workdir, "_data"))
  module.prepare_corpus(workdir, common)
  directory = os.path.join(workdir, "run")
  os.makedirs(directory)
  summary = module.train_one(dict(common, name=f"check/{scheme}", phase="final", scheme=scheme, lr=lr, seed=SEED),
                             directory)
  with open(os.path.join(directory, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return dict(train_loss=[r["loss"] for r in rows if "loss" in r],
              eval_loss=[r["eval_loss"] for r in rows if "eval_loss" in r], test_loss=summary["test_loss"],
              first_row={k: rows[0][k] for k in ROW_KEYS})


# ------------------------------------------------------------------------------------------------ the check


def first_difference(got: dict, want: dict) -> str | None:
  """Where two runs' results first differ (None: bit for bit equal; NaN equals NaN)."""
  for key in ("train_loss", "eval_loss", "test_loss"):
    a, b = (x if isinstance(x, list) else [x] for x in (got[key], want[key]))
    if len(a) != len(b):
      return f"{key}: {len(a)} values against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
      if not (x == y or (math.isnan(x) and math.isnan(y))):
        return f"{key}[{i}]: {x!r} against {y!r}"
  return None


def run_at(commit: str, scheme: str, lr: float, workdir: str, corpus: str) -> dict:
  """The worker at `commit` (a detached worktree, made once) in a fresh workdir; its JSON."""
  tree = os.path.join(workdir, "trees", commit)
  if not os.path.isdir(tree):
    subprocess.run(["git", "-C", REPO_ROOT, "worktree", "add", "--detach", tree, commit], check=True,
                   capture_output=True)
    if os.path.isdir(os.path.join(tree, "kernels")) and not os.path.exists(os.path.join(tree, "jaxpt", "kernels")):
      os.symlink("../kernels", os.path.join(tree, "jaxpt", "kernels"))
  run_dir = os.path.join(workdir, "runs", commit, scheme.replace(":", "_").replace("+", "_"))
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", HARNESS.get(commit, "lm_comparison"),
                        scheme, repr(lr), run_dir, corpus], cwd=tree, capture_output=True, text=True, check=False)
  if out.returncode:
    raise SystemExit(f"{scheme} at {commit} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def check(schemes: list[str] | None, workdir: str, corpus: str) -> dict:
  plan = {scheme: commits for scheme, commits in commits_by_scheme().items() if not schemes or scheme in schemes}
  rows, control = [], None
  try:
    for scheme, commits in plan.items():
      lr, committed_row = committed_final_run(scheme)
      results = {commit: run_at(commit, scheme, lr, workdir, corpus) for commit in commits}
      for commit in commits:
        difference = None if commit == REFERENCE else first_difference(results[commit], results[REFERENCE])
        rows.append(dict(scheme=scheme, lr=lr, commit=commit, reference=REFERENCE,
                         identical=None if commit == REFERENCE else difference is None, first_difference=difference,
                         matches_committed_run=results[commit]["first_row"] == committed_row, **results[commit]))
        print(f"{scheme} at {commit} vs {REFERENCE}: {difference or 'identical'}; first row "
              f"{'equals' if rows[-1]['matches_committed_run'] else 'differs from'} the committed run's", flush=True)
      if control is None:
        difference = first_difference(run_at(CONTROL, scheme, lr, workdir, corpus), results[REFERENCE])
        control = dict(scheme=scheme, commit=CONTROL, reference=REFERENCE, first_difference=difference,
                       detected=difference is not None)
        print(f"control: {scheme} at {CONTROL} vs {REFERENCE}: {difference or 'identical (the check is blind)'}",
              flush=True)
  finally:
    for tree in glob.glob(os.path.join(workdir, "trees", "*")):
      subprocess.run(["git", "-C", REPO_ROOT, "worktree", "remove", "--force", tree], check=False,
                     capture_output=True)
  return dict(question="do the commits that trained residual_schemes_lm's runs train them identically?",
              method=__doc__.split("\n\n")[1].replace("\n", " "), sets=SETS, seed=SEED, plan=plan, rows=rows,
              all_identical=all(r["identical"] for r in rows if r["commit"] != REFERENCE),
              all_match_committed_runs=all(r["matches_committed_run"] for r in rows), control=control)


def main(argv=None) -> None:
  if argv is None and sys.argv[1:2] == ["--one"]:
    harness, scheme, lr, workdir, corpus = sys.argv[2:7]
    print(json.dumps(train_here(harness, scheme, float(lr), workdir, corpus)))
    return
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", default="/tmp/commit_check")
  parser.add_argument("--out", default=os.path.join(HERE, "results", "commit_check.json"))
  parser.add_argument("--schemes", default="", help="comma-separated subset (default: every scheme)")
  parser.add_argument("--corpus", default=CORPUS)
  args = parser.parse_args(argv)
  if os.path.exists(os.path.join(args.workdir, "runs")):
    raise SystemExit(f"{args.workdir} holds runs of an earlier check: give another --workdir")
  report = check([s for s in args.schemes.split(",") if s], args.workdir, args.corpus)
  sys.path.insert(0, REPO_ROOT)
  from experiments.toolkit import environment

  report["command"] = " ".join(["python", "experiments/residual_schemes_lm/commit_check.py", *sys.argv[1:]])
  report["environment"] = environment.environment()
  with open(args.out, "w") as f:
    json.dump(report, f, indent=1)
    f.write("\n")
  print(f"all identical: {report['all_identical']}; all match the committed runs: "
        f"{report['all_match_committed_runs']} ({args.out})")


if __name__ == "__main__":
  main()
