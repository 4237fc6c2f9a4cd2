"""experiments/toolkit/rl_comparison.py (grpo_vs_clipo_multipath, policy_losses): the paired comparisons, the
pilot's power estimate and the lr selection against plain NumPy / scipy statements, the configs every method trains
with (checked, nothing compiled), and the --smoke pipeline of both stages (slow)."""

import dataclasses
import importlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

from experiments.toolkit import rl_comparison
from tests.runs import recording_grid
from jaxpt.config import from_section
from jaxpt.trainers.grpo import GRPORunConfig
from jaxpt.trainers.sft import SFTRunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("experiments.grpo_vs_clipo_multipath.run", "experiments.policy_losses.run")


@pytest.fixture(scope="module", params=MODULES)
def exp(request):
  return importlib.import_module(request.param).EXPERIMENT


def fake_runs(exp, seeds, rng):
  """GRPO runs of every method and SFT runs, with random validation / test pass@1 and greedy accuracy."""
  runs = [dict(method=m, seed=s, lr=1e-4, evals={f"eval_{k}_{split}": float(rng.uniform())
                                                 for k in rl_comparison.KINDS for split in rl_comparison.SETS})
          for m in exp.methods for s in seeds]
  sfts = [dict(sft_seed=s, evals={f"eval_{k}_{split}": float(rng.uniform())
                                  for k in rl_comparison.KINDS for split in rl_comparison.SETS}) for s in seeds]
  return runs, sfts


def test_comparisons_are_paired_by_seed(exp):
  rng = np.random.default_rng(0)
  runs, sfts = fake_runs(exp, range(6), rng)
  comps = rl_comparison.comparisons(exp, runs, sfts, list(exp.methods))
  methods = list(exp.methods)
  # per kind x set: (methods - 1) against the baseline + every method against its seed's SFT
  assert len(comps) == len(rl_comparison.KINDS) * len(rl_comparison.SETS) * (2 * len(methods) - 1)
  value = lambda rows, key, **match: [r["evals"][key] for r in rows if all(r[k] == v for k, v in match.items())]
  for c in comps:
    key = f"eval_{c['metric']}"
    a = np.array(value(runs, key, method=c["a"]), np.float64)
    b = np.array(value(sfts, key) if c["b"] == "sft" else value(runs, key, method=c["b"]), np.float64)
    d = a - b
    assert c["n"] == 6 and c["mean_diff"] == pytest.approx(d.mean(), abs=1e-12)
    t = sps.ttest_rel(a, b)
    assert c["p_t"] == pytest.approx(t.pvalue, rel=1e-9)
    half = sps.t.ppf(0.975, 5) * d.std(ddof=1) / math.sqrt(6)
    assert c["ci95"] == pytest.approx([d.mean() - half, d.mean() + half], rel=1e-9)


def test_power_fixes_n_from_the_largest_pilot_sd(exp):
  rng = np.random.default_rng(1)
  runs, _ = fake_runs(exp, (200, 201, 202), rng)
  estimate = rl_comparison.power(exp, runs, list(exp.methods))
  value = lambda m: np.array([r["evals"]["eval_pass1_validation"] for r in runs if r["method"] == m])
  sds = [np.std(value(m) - value(exp.baseline), ddof=1) for m in exp.methods if m != exp.baseline]
  sd = max(sds)
  assert estimate["sd_used"] == pytest.approx(sd, rel=1e-12)

  def power_at(n):  # the two-sided paired t test's power for the target, through scipy's noncentral t
    crit = sps.t.ppf(0.975, n - 1)
    nc = exp.target / sd * math.sqrt(n)
    return sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)

  needed = next(n for n in range(2, 100_000) if power_at(n) >= 0.8)
  assert estimate["n_for_80_power"] == needed
  assert estimate["n"] == min(max(needed, rl_comparison.MIN_SEEDS), exp.max_seeds)
  assert estimate["cap_binds"] == (needed > exp.max_seeds)
  small = [dict(r, evals=dict(r["evals"], eval_pass1_validation=0.5 + 1e-4 * r["seed"] * (r["method"] == "x")))
           for r in runs]
  assert rl_comparison.power(exp, small, list(exp.methods))["n"] == exp.max_seeds  # sd 0: no estimate, the cap


def test_select_takes_validation_pass1_then_greedy_and_flags_the_edge(exp):
  lrs = [1e-5, 1e-4, 1e-3]
  rows = [dict(method=exp.baseline, lr=lr, evals={"eval_pass1_validation": p, "eval_accuracy_validation": g,
                                                  "eval_pass1_test": 1.0 - p})
          for lr, p, g in zip(lrs, (0.5, 0.6, 0.6), (0.9, 0.1, 0.2))]
  best, table = rl_comparison.select(exp, rows, [exp.baseline], lrs)
  assert best == {exp.baseline: 1e-3}  # ties on pass@1 go to greedy accuracy; test is never read
  assert [r["at_grid_edge"] for r in table] == [False, False, True]


def test_every_method_config_is_valid(exp):
  run = dict(experiment=exp.module, smoke=False, sets={}, sft_sets={}, sft_seed=0, sft_dir="", seed=0, lr=1e-4)
  sft = from_section(SFTRunConfig, rl_comparison.sft_config(exp, run), "config")
  assert sft.eval_split == "validation" and sft.task.name == "multipath"
  for method, sets in exp.methods.items():
    config = from_section(GRPORunConfig, rl_comparison.grpo_config(exp, dict(run, method=method)), "config")
    assert config.task == sft.task and config.model == sft.model
    for key, value in sets.items():
      section, field = key.split(".")
      assert getattr(getattr(config, section), field) == value


def test_both_stages_with_recorded_runs(tmp_path, monkeypatch):
  """The pilot and main stages end to end, each run's training replaced by a record with random evals (the grid,
  resume, N from the pilot file, tuning, final seeds and report are the real code): N comes from pilot.json, the
  main stage trains seeds 0 .. N-1 at the tuned lrs, and a second invocation trains nothing (runs resume); a fresh
  workdir goes on from the kept seeds and the pilot's run files (a later session's machine), training only a seed
  that was not kept whole."""
  exp = importlib.import_module(MODULES[0]).EXPERIMENT
  rng = np.random.default_rng(3)
  trained = []

  def summarise(run):
    evals = {f"eval_{k}_{split}": float(rng.uniform(0.5, 0.51)) for k in rl_comparison.KINDS
             for split in rl_comparison.SETS}
    return dict(evals=evals, diagnostics={"accuracy": 0.5}, sft_curve=[])

  monkeypatch.setattr(rl_comparison.runner, "run_grid", recording_grid(rl_comparison.runner, summarise, trained))
  pilot = str(tmp_path / "pilot.json")
  kept = tmp_path / "kept"
  common = ["--workdir", str(tmp_path / "w"), "--lrs", "1e-5,1e-4", "--pilot", pilot, "--keep-runs", str(kept)]
  with pytest.raises(SystemExit, match="no pilot file"):
    rl_comparison.main(exp, common + ["--out", str(tmp_path / "none")])
  assert trained == []  # the main stage trains nothing before its pilot file is read
  rl_comparison.main(exp, common + ["--stage", "pilot", "--out", str(tmp_path / "p")])
  assert len(trained) == 1 + 2 * 2 + 3 * 3  # tuning SFT, 2 methods x 2 lrs; 3 SFTs, 2 methods x 3 pilot seeds
  with open(pilot) as f:
    fixed = json.load(f)
  n, best = fixed["power"]["n"], fixed["best_lr"]
  assert n == rl_comparison.MIN_SEEDS  # a pilot sd of ~0.005 needs fewer than MIN_SEEDS for 0.03
  assert set(best) == {"grpo", "clipo"}
  assert {r["lr"] for r in fixed["runs"] if r["phase"] == "pilot" and r["method"] == "clipo"} == {best["clipo"]}
  rl_comparison.main(exp, common + ["--out", str(tmp_path / "out")])
  assert len(trained) == 14 + n * 3  # N x (SFT + 2 methods): the tuning runs are the pilot stage's
  with open(tmp_path / "out" / "results.json") as f:
    payload = json.load(f)
  assert payload["design"]["reported_seeds"] == list(range(n)) and payload["power"]["n"] == n
  assert payload["statistics"]["n_fixed"].startswith(f"N = {n} fixed before the main runs")
  assert {(c["a"], c["b"]) for c in payload["comparisons"]} == {("clipo", "grpo"), ("grpo", "sft"), ("clipo", "sft")}
  assert all(c["n"] == n for c in payload["comparisons"])
  report = (tmp_path / "out" / "results.md").read_text()
  assert f"paired sd of pass1_validation ({payload['power']['sd_used']:.4f})" in report
  rl_comparison.main(exp, common + ["--out", str(tmp_path / "again")])
  assert len(trained) == 14 + 3 * n  # nothing trained twice
  assert sorted(os.listdir(kept / "runs" / "final")) == ["clipo", "grpo"]
  assert len(os.listdir(kept / "runs" / "sft")) == n
  fresh = common[:1] + [str(tmp_path / "fresh")] + common[2:]  # a later session's machine: the kept files only
  rl_comparison.main(exp, fresh + ["--out", str(tmp_path / "fresh_out")])
  assert len(trained) == 14 + 3 * n  # the pilot's and the kept runs imported: nothing trained
  with open(tmp_path / "fresh_out" / "results.json") as f:
    assert json.load(f)["comparisons"] == payload["comparisons"]
  for method in ("clipo", "grpo"):  # a session cut off during the last seed: that seed was not kept
    shutil.rmtree(kept / "runs" / "final" / method / f"lr{best[method]:g}" / f"seed{n - 1}")
  shutil.rmtree(kept / "runs" / "sft" / f"seed{n - 1}")
  rl_comparison.main(exp, common[:1] + [str(tmp_path / "fresh2")] + common[2:] + ["--out", str(tmp_path / "f2")])
  assert trained[-3:] == [f"sft/seed{n - 1}", f"final/grpo/lr{best['grpo']:g}/seed{n - 1}",
                          f"final/clipo/lr{best['clipo']:g}/seed{n - 1}"] and len(trained) == 14 + 3 * n + 3
  assert payload["design"]["stages"] == rl_comparison.STAGES and rl_comparison.STAGES.startswith("(`--stage`)")
  assert "  main:" in rl_comparison.STAGES and rl_comparison.STAGES.endswith("Holm-adjusted over the report.")
  for name in ("sft/seed100", "tune/clipo/lr0.0001/seed100"):  # the tuning runs the main stage only reads
    done = tmp_path / "w" / name / "done.json"
    kept = json.loads(done.read_text())
    done.write_text(json.dumps(dict(kept, config_digest="0ther")))
    with pytest.raises(SystemExit, match=rf"^{name} \(.*\): trained with config_digest 0ther, the current code's is "
                                         rf"{kept['config_digest']};"):
      rl_comparison.main(exp, common + ["--out", str(tmp_path / "stale")])
    rl_comparison.main(exp, common + ["--report-only", "--out", str(tmp_path / name.replace("/", "_"))])
    done.write_text(json.dumps(kept))
  for key in ("sfts", "runs"):  # the pilot file's runs, read for N
    with open(pilot, "w") as f:
      json.dump(dict(fixed, **{key: [dict(r, config_digest="0ther") for r in fixed[key]]}), f)
    with pytest.raises(SystemExit, match=r"\(.*pilot.json\): trained with config_digest 0ther"):
      rl_comparison.main(exp, common + ["--out", str(tmp_path / "stale_pilot")])
  with open(pilot, "w") as f:
    json.dump(fixed, f)
  assert len(trained) == 14 + 3 * n + 3
  with pytest.raises(SystemExit, match="tuned over --lrs"):  # another grid: refused before anything trains
    rl_comparison.main(exp, common[:3] + ["1e-5,3e-4"] + common[4:] + ["--out", str(tmp_path / "grid")])
  elsewhere = tmp_path / "elsewhere"  # a pilot file with no pilot_runs/ beside it
  elsewhere.mkdir()
  shutil.copy(pilot, elsewhere / "pilot.json")
  with pytest.raises(SystemExit, match="runs finished"):  # another workdir: its tuning runs are not trained
    rl_comparison.main(exp, ["--workdir", str(tmp_path / "w2"), "--lrs", "1e-5,1e-4", "--pilot",
                             str(elsewhere / "pilot.json"), "--out", str(tmp_path / "w2out")])
  fixed["best_lr"] = {"grpo": 1.0, "clipo": 1.0}
  with open(pilot, "w") as f:
    json.dump(fixed, f)
  with pytest.raises(SystemExit, match="tuned lrs"):
    rl_comparison.main(exp, common + ["--out", str(tmp_path / "changed")])
  assert len(trained) == 14 + 3 * n + 3


@pytest.mark.slow
def test_smoke_pipeline_runs_both_stages(tmp_path):
  """--smoke: a tiny pilot (2 seeds, N from it written) and main stage (2 seeds, report) of
  grpo_vs_clipo_multipath; then the same workdir reported again without training (runs are resumed, not redone)."""
  script = os.path.join(ROOT, "experiments", "grpo_vs_clipo_multipath", "run.py")
  args = [sys.executable, script, "--smoke", "--workdir", str(tmp_path / "w"), "--lrs", "1e-4", "--jobs", "1"]
  subprocess.run(args + ["--out", str(tmp_path / "out")], check=True, cwd=ROOT, capture_output=True, text=True)
  with open(tmp_path / "out" / "pilot.json") as f:
    pilot = json.load(f)
  assert pilot["power"]["pilot_seeds"] == [200, 201]
  assert sorted(r["phase"] for r in pilot["runs"]) == ["pilot"] * 4 + ["tune"] * 2  # 2 methods at lr 1e-4
  with open(tmp_path / "out" / "results.json") as f:
    payload = json.load(f)
  assert payload["design"]["reported_seeds"] == [0, 1]
  assert {r["method"] for r in payload["final"]} == {"sft", "grpo", "clipo"}
  assert {(c["a"], c["b"]) for c in payload["comparisons"]} == {("clipo", "grpo"), ("grpo", "sft"), ("clipo", "sft")}
  again = subprocess.run(args + ["--report-only", "--out", str(tmp_path / "again")], check=True, cwd=ROOT,
                         capture_output=True, text=True)
  assert "training" not in again.stdout  # --report-only: every run read from its done.json
  with open(tmp_path / "again" / "results.json") as f:
    assert json.load(f)["comparisons"] == payload["comparisons"]


def test_a_diagnostic_a_method_never_logs_is_left_out_of_its_row(exp):
  runs, sfts = fake_runs(exp, [0, 1, 2], np.random.default_rng(5))
  for r in runs:  # the baseline logs no CLIPO similarity (its runs record nan); the others log one
    r["diagnostics"] = {"accuracy": 0.5, "clipo_pos_sim": math.nan if r["method"] == exp.baseline else 0.9}
  rows = {r["method"]: r for r in rl_comparison.summary_rows(exp, runs, sfts, list(exp.methods))}
  assert set(rows[exp.baseline]["diagnostics"]) == {"accuracy"}
  assert all(set(rows[m]["diagnostics"]) == {"accuracy", "clipo_pos_sim"} for m in exp.methods if m != exp.baseline)


def test_a_diagnostic_added_after_a_run_finished_is_read_from_its_metrics(exp, tmp_path):
  """`with_diagnostics`: a run whose done.json predates a diagnostic key gets the key's mean over the metrics rows
  that log it (CLIPO's similarities over the steps with anchors), read from its metrics.jsonl; keys it has stay."""
  run = dict(name="final/x/seed0", diagnostics={"accuracy": 0.25})
  rows = [{"step": 1, "accuracy": 0.5, "clip_frac": 0.1, "clipo_pos_sim": 0.9, "clipo_num_anchors": 2},
          {"step": 2, "accuracy": 0.7, "clip_frac": 0.3, "clipo_pos_sim": 0.1, "clipo_num_anchors": 0}]
  os.makedirs(tmp_path / run["name"])
  with open(tmp_path / run["name"] / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  patched = dataclasses.replace(exp, diagnostics=("clip_frac", "clipo_pos_sim", "never_logged"))
  [got] = rl_comparison.with_diagnostics(patched, [run], str(tmp_path))
  assert got["diagnostics"]["accuracy"] == 0.25 and got["diagnostics"]["clip_frac"] == pytest.approx(0.2)
  assert got["diagnostics"]["clipo_pos_sim"] == 0.9 and math.isnan(got["diagnostics"]["never_logged"])
