"""experiments/depth_sweep (issue 31 item 3): the outcome rule, the (lr, warm-up) selection, the comparison family,
the paired statistics against scipy, N from the pilot, the verdicts; the lm_comparison pieces it added (warm-up in
the config, the unigram loss, the gradient-norm summary) against plain NumPy; both stages on recorded runs (the
exact McNemar p and Clopper-Pearson bounds of the trained rows, runs of another config_digest refused by the main
stage); and the --smoke pipeline (slow)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

from experiments.depth_sweep import run as sweep
from experiments.toolkit import lm_comparison
from tests.runs import recording_grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIGRAM = 5.9
VOCAB = 1024


def record(scheme, depth, seed, val, test=None, lr=1e-2, warmup=10, grad=1.0):
  """A run's done.json as `lm_comparison.train_one` writes it (the fields the report reads)."""
  return dict(scheme=scheme, num_layers=depth, seed=seed, lr=lr, warmup_steps=warmup, validation_loss=val,
              test_loss=val + 0.05 if test is None else test, vocab_size=VOCAB, unigram_loss=UNIGRAM, params=1000,
              probe_init={"block_grad_norms": [2.0 * grad] + [grad] * (depth - 1)}, grad_norm_max=3.0 * grad,
              grad_norm_last=grad)


# --------------------------------------------------------------------------------------- lm_comparison additions


def test_unigram_loss_is_the_add_one_unigram_cross_entropy():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 7, size=(5, 6))
  segments = (rng.uniform(size=(5, 6)) > 0.3).astype(np.int32)
  batches = [dict(targets=rng.integers(0, 7, size=(2, 6)), weights=(rng.uniform(size=(2, 6)) > 0.5) * 1.0)
             for _ in range(3)]
  vocab = 9  # ids 7 and 8 never occur: add-one gives them mass
  counts = [0] * vocab
  for t, s in zip(tokens.ravel().tolist(), segments.ravel().tolist()):
    counts[t] += s > 0
  total, nll, weight = sum(counts), 0.0, 0.0
  for b in batches:
    for t, w in zip(b["targets"].ravel().tolist(), b["weights"].ravel().tolist()):
      nll -= w * math.log((counts[t] + 1) / (total + vocab))
      weight += w
  assert lm_comparison.unigram_loss(tokens, segments, batches, vocab) == pytest.approx(nll / weight, rel=1e-12)


def test_grad_norm_summary_reads_the_logged_rows_and_flags_a_non_finite_one():
  rows = [dict(step=10, loss=5.0, grad_norm=2.0), dict(step=25, eval_loss=4.0), dict(step=20, grad_norm=5.0),
          dict(step=30, grad_norm=1.0)]
  assert lm_comparison.grad_norm_summary(rows) == dict(grad_norm_first=2.0, grad_norm_last=1.0, grad_norm_max=5.0,
                                                       grad_norm_mean=pytest.approx(8.0 / 3))
  bad = lm_comparison.grad_norm_summary(rows + [dict(step=40, grad_norm=math.nan)])
  assert bad["grad_norm_max"] == math.inf and bad["grad_norm_mean"] == math.inf
  assert all(math.isnan(v) for v in lm_comparison.grad_norm_summary([dict(step=1, loss=1.0)]).values())


def test_a_run_sets_depth_warmup_and_lr():
  run = dict(config=sweep.CONFIG, sets={}, scheme="mhc_lite:4", num_layers=24, lr=3e-3, warmup_steps=50, seed=200,
             corpus="c")
  config = lm_comparison.make_config(run)
  assert (config.model.norm_scheme, config.model.hc_streams, config.model.num_layers) == ("mhc_lite", 4, 24)
  assert (config.optim.learning_rate, config.optim.warmup_steps, config.seed, config.steps) == (3e-3, 50, 200, 200)
  assert lm_comparison.make_config(dict(run, warmup_steps=None)).optim.warmup_steps == 10  # the config's own
  names = [r["name"] for r in sweep.tune_runs(["pre", "post"], [6, 12], [1e-3, 1e-2], [10, 50], [100], {})]
  assert len(names) == len(set(names)) == 16


# ------------------------------------------------------------------------------------------ outcomes, selection


@pytest.mark.parametrize("val, expected", [(math.inf, "diverged"), (None, "diverged"), (math.nan, "diverged"),
                                           (math.log(VOCAB) + 1e-9, "diverged"), (6.5, "stalled"),
                                           (UNIGRAM - sweep.MARGIN + 1e-9, "stalled"),
                                           (UNIGRAM - sweep.MARGIN - 1e-9, "trained"), (3.0, "trained")])
def test_outcome_rule(val, expected):
  assert sweep.outcome(record("pre", 6, 0, val, test=1.0)) == expected


def test_select_takes_the_lowest_mean_validation_loss_over_lr_and_warmup_and_flags_edges():
  tuning = [record("pre", 6, seed, v, lr=lr, warmup=w) for lr, w, seed, v in (
      (1e-3, 10, 100, 5.0), (1e-3, 10, 101, 5.0), (1e-3, 50, 100, 4.0), (1e-3, 50, 101, 4.4),
      (1e-2, 10, 100, 3.9), (1e-2, 10, 101, math.inf), (1e-2, 50, 100, 4.1), (1e-2, 50, 101, 4.1))]
  tuning += [record("post", 6, seed, 4.0 + seed / 1000, lr=lr, warmup=w) for lr in (1e-3, 1e-2) for w in (10, 50)
             for seed in (100, 101)]
  best, table = sweep.select(tuning, ["pre", "post"], [6], [1e-3, 1e-2, 1e-1], [10, 50])
  # inf: worst; of 2 warm-ups either is an end, so no warm-up is flagged
  assert best["pre@6"] == dict(lr=1e-2, warmup_steps=50, lr_at_edge=False, warmup_at_edge=False)
  assert (best["post@6"]["lr"], best["post@6"]["warmup_steps"]) == (1e-3, 10)  # ties: the smaller lr, warm-up
  assert best["post@6"]["lr_at_edge"] and not best["post@6"]["warmup_at_edge"]
  assert [r["validation_loss"] for r in table if r["scheme"] == "pre"] == [5.0, 4.2, math.inf, 4.1]
  assert sum(r["chosen"] for r in table) == 2
  three = sweep.select(tuning, ["pre", "post"], [6], [1e-3, 1e-2], [10, 50, 100])[0]  # 2 lrs: no lr edge
  assert (three["pre@6"]["lr_at_edge"], three["pre@6"]["warmup_at_edge"]) == (False, False)  # 50: inside
  assert (three["post@6"]["lr_at_edge"], three["post@6"]["warmup_at_edge"]) == (False, True)  # 10: an end
  assert "grid edge" not in sweep.fmt_setting(best["pre@6"]) and sweep.fmt_setting(three["post@6"]) == (
      "0.001 / 10 (warm-up at grid edge)")


# ----------------------------------------------------------------------------------------------- comparisons


def test_comparison_plan_is_each_scheme_against_pre_by_depth_the_trend_and_stability():
  plan = sweep.comparison_plan(sweep.SCHEMES, [12, 6, 24])
  assert plan[:len(sweep.SCHEMES) - 1] == [("loss", s, "pre", 6) for s in sweep.SCHEMES[1:]]
  assert len([p for p in plan if p[0] == "loss"]) == (len(sweep.SCHEMES) - 1) * 3
  assert [p for p in plan if p[0] == "trend"] == [("trend", s, "pre", 24, 6) for s in sweep.SCHEMES[1:]]
  assert [p for p in plan if p[0] == "trained"] == [("trained", "siamese_post_pre", b, d) for d in (6, 12, 24)
                                                    for b in ("pre", "post")]
  assert sweep.comparison_plan(["pre", "post"], [6]) == [("loss", "post", "pre", 6)]


def test_comparisons_pair_by_seed_and_by_cell_against_scipy_and_holm():
  rng = np.random.default_rng(1)
  schemes, depths, seeds = ["pre", "post", "siamese_post_pre"], [6, 24], range(6)
  final = [record(s, d, seed, float(rng.normal(4.5, 0.1))) for s in schemes for d in depths for seed in seeds]
  final = [dict(r, test_loss=r["validation_loss"] + float(rng.normal(0, 0.05))) for r in final]
  diverged = next(r for r in final if (r["scheme"], r["num_layers"], r["seed"]) == ("post", 24, 3))
  diverged.update(validation_loss=math.inf, test_loss=math.inf)
  cells = [(lr, w, seed) for lr in sweep.LRS for w in sweep.WARMUPS for seed in sweep.TUNE_SEEDS]  # 20 cells
  tuning = [record(s, d, seed, float(rng.choice([4.5, 5.95, math.inf])), lr=lr, warmup=w)
            for s in schemes for d in depths for lr, w, seed in cells]
  plan = sweep.comparison_plan(schemes, depths)
  comps = sweep.comparisons(final, tuning, plan)
  assert [(c["kind"], c["a"], c["b"], c["num_layers"]) for c in comps] == [(p[0], p[1], p[2], p[3]) for p in plan]
  test = {(r["scheme"], r["num_layers"], r["seed"]): r["test_loss"] for r in final}
  trained = {(r["scheme"], r["num_layers"], r["lr"], r["warmup_steps"], r["seed"]): sweep.outcome(r) == "trained"
             for r in tuning}
  for c in comps:
    if c["kind"] == "loss":
      used = [s for s in seeds if not (c["a"] == "post" and c["num_layers"] == 24 and s == 3)]
      a = np.array([test[(c["a"], c["num_layers"], s)] for s in used])
      b = np.array([test[(c["b"], c["num_layers"], s)] for s in used])
    elif c["kind"] == "trend":
      used = [s for s in seeds if not (c["a"] == "post" and s == 3)]
      a = np.array([test[(c["a"], 24, s)] - test[(c["b"], 24, s)] for s in used])
      b = np.array([test[(c["a"], 6, s)] - test[(c["b"], 6, s)] for s in used])
    else:
      a = np.array([trained[(c["a"], c["num_layers"]) + cell] for cell in sorted(cells)], np.float64)
      b = np.array([trained[(c["b"], c["num_layers"]) + cell] for cell in sorted(cells)], np.float64)
      used = [list(cell) for cell in sorted(cells)]
    d = a - b
    if c["kind"] == "trained":  # the exact McNemar test on the discordant cells (not a Monte Carlo at 20 cells)
      k_a, k_b = int(np.sum(d > 0)), int(np.sum(d < 0))
      assert (c["a_only"], c["b_only"], c["n"]) == (k_a, k_b, 20) and c["sign_flip_exact"]
      assert c["p_sign_flip"] == pytest.approx(sps.binomtest(k_a, k_a + k_b, 0.5).pvalue if k_a + k_b else 1.0,
                                               rel=1e-12)
      assert c["min_p_sign_flip"] == pytest.approx(min(1.0, 2 / 2 ** (k_a + k_b)))
    assert c["seeds"] == used and c["n"] == len(used)
    assert c["dropped_diverged"] == (1 if c["a"] == "post" and c["kind"] != "trained" and (
        c["kind"] == "trend" or c["num_layers"] == 24) else 0)
    assert c["mean_diff"] == pytest.approx(d.mean(), abs=1e-12)
    if d.std() > 0:
      assert c["p_t"] == pytest.approx(sps.ttest_rel(a, b).pvalue, rel=1e-9)
      half = sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
      assert c["ci95"] == pytest.approx([d.mean() - half, d.mean() + half], rel=1e-9)
  ps = np.array([c["p_t"] for c in comps])
  order = np.argsort(ps)
  holm = np.maximum.accumulate(np.minimum(1.0, (len(ps) - np.arange(len(ps))) * ps[order]))
  assert [c["p_t_holm"] for c in comps] == pytest.approx(list(holm[np.argsort(order)]), rel=1e-12)


def test_share_upper_bound_is_the_clopper_pearson_end():
  for k, n in ((0, 10), (0, 20), (3, 20), (20, 20)):
    assert sweep.share_upper_bound(k, n) == pytest.approx(sps.binomtest(k, n).proportion_ci(0.95, "exact").high,
                                                          rel=1e-9)


def test_verdicts():
  loss = dict(kind="loss", ci95=[-0.05, -0.01], p_t_holm=0.01)
  assert sweep.verdict(loss, -1, 0.02, "superiority") == (
      "supports (the direction; the target's size is inside the interval)")
  assert sweep.verdict(dict(loss, ci95=[-0.05, -0.03]), -1, 0.02, "superiority") == "supports"
  assert sweep.verdict(dict(loss, ci95=[-0.05, -0.03], p_sign_flip_holm=0.3, p_sign_flip=0.06, min_p_sign_flip=0.06,
                            n=5), -1, 0.02, "superiority") == (
      "supports (t test alone: sign-flip p 0.06, Holm 0.3, its minimum at n = 5 is 0.06)")
  assert sweep.verdict(dict(loss, p_t_holm=0.2), -1, 0.02, "superiority") == "cannot resolve at this scale"
  assert sweep.verdict(dict(loss, ci95=[-0.01, 0.3], p_t_holm=0.5), -1, 0.02, "superiority") == (
      "contradicts a difference of the target's size")
  cell = lambda n, a, b, p: dict(kind="trained", n=n, a_only=a, b_only=b, p_sign_flip_holm=p)
  # 0 of 20 cells lost: U = 0.168 < 0.2; 0 of 10: U = 0.308 (a grid where every cell agrees proves nothing)
  assert sweep.verdict(cell(20, 0, 0, 1.0), +1, 0.2, "non-inferiority") == "supports"
  assert sweep.verdict(cell(10, 0, 0, 1.0), +1, 0.2, "non-inferiority") == "cannot resolve at this scale"
  assert sweep.verdict(cell(20, 0, 9, 0.004), +1, 0.2, "non-inferiority") == "contradicts"
  assert sweep.verdict(cell(20, 9, 0, 0.004), +1, 0.2, "superiority") == "supports"
  assert sweep.verdict(cell(20, 0, 9, 0.004), +1, 0.2, "superiority") == "contradicts"
  assert sweep.verdict(cell(20, 0, 2, 0.5), +1, 0.2, "superiority") == "contradicts a difference of the target's size"
  assert sweep.verdict(cell(20, 3, 0, 0.25), +1, 0.2, "superiority") == "cannot resolve at this scale"
  rows = sweep.claims([dict(loss, a="siamese_post_pre", b="pre", metric="test_loss", num_layers=12, mean_diff=-0.03,
                            std_diff=0.1, n=5, p_sign_flip_holm=0.3)])
  assert len(rows) == 1 and rows[0]["claim"].endswith("12 layers")
  assert rows[0]["verdict"] == ("supports (the direction; the target's size is inside the interval) "
                                "(t test alone: the sign-flip p does not pass Holm)")
  assert rows[0]["n_for_80_power"] == next(n for n in range(2, 10_000) if power_at(0.1, -0.02, n) >= 0.8)
  assert "exact_bounds" not in rows[0]
  trained = dict(cell(20, 3, 1, 0.6), a="siamese_post_pre", b="pre", metric="trained", num_layers=6, mean_diff=0.1,
                 std_diff=0.4, ci95=[-0.1, 0.3], p_t_holm=0.5, min_p_sign_flip=0.125)
  row = sweep.claims([trained])[0]
  upper = lambda k: sps.binomtest(k, 20).proportion_ci(0.95, "exact").high
  assert row["exact_bounds"] == pytest.approx([-upper(1), upper(3)], rel=1e-9)
  assert (row["a_only"], row["b_only"], row["min_p_sign_flip"]) == (3, 1, 0.125)


def power_at(sd, effect, n, alpha=0.05):
  """The two-sided paired t test's power, through scipy's noncentral t."""
  crit = sps.t.ppf(1 - alpha / 2, n - 1)
  nc = effect / sd * math.sqrt(n)
  return sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)


def test_power_fixes_n_from_the_largest_siamese_sd_at_the_bonferroni_level():
  rng = np.random.default_rng(2)
  pilot = [record(s, d, seed, float(rng.normal(4.5, 0.02 if d == 6 else 0.01)))
           for s in ("pre", "siamese_post_pre") for d in (6, 12) for seed in (200, 201, 202)]
  estimate = sweep.power(pilot, [6, 12], family_size=10)
  value = lambda s, d: np.array([r["validation_loss"] for r in pilot if (r["scheme"], r["num_layers"]) == (s, d)])
  sds = [np.std(value("siamese_post_pre", d) - value("pre", d), ddof=1) for d in (6, 12)]
  assert estimate["sd_used"] == pytest.approx(max(sds), rel=1e-12) and estimate["alpha"] == 0.005
  needed = next(n for n in range(2, 100_000) if power_at(max(sds), sweep.TARGET, n, 0.005) >= 0.8)
  assert estimate["n_for_80_power"] == needed
  assert estimate["n_for_80_power_at_005"] == next(n for n in range(2, 100_000)
                                                   if power_at(max(sds), sweep.TARGET, n) >= 0.8)
  assert estimate["n"] == min(max(needed, sweep.MIN_SEEDS), sweep.MAX_SEEDS)
  assert estimate["cap_binds"] == (needed > sweep.MAX_SEEDS)


def test_timing_extrapolates_cpu_seconds_linearly_from_two_lengths(tmp_path, monkeypatch):
  """The child processes replaced by a record whose CPU time is 3 s + 0.25 s a step x depth: the fit, the 200-step
  extrapolation and the stage totals are the real code."""
  seen = []

  def child(command, env, cwd, capture_output, text, check):
    run = json.loads(command[-1])
    seen.append(run["directory"])
    assert sweep.runner.SINGLE_THREADED_XLA in env["XLA_FLAGS"]
    assert run["sets"]["checkpoint_every"] == run["sets"]["steps"]
    cpu = 3.0 + 0.25 * run["sets"]["steps"] * run["num_layers"]
    return subprocess.CompletedProcess(command, 0, stdout=f"log line\n{json.dumps(dict(cpu_s=cpu, wall_s=1.0))}\n")

  monkeypatch.setattr(sweep.subprocess, "run", child)
  common = dict(sets={}, corpus="c", config=sweep.CONFIG)
  counts = {"tune": {"pre@2": 4, "post@4": 4}, "main": {"pre@2": 5, "post@4": 5}}
  out = sweep.timing(["pre", "post"], [2, 4], 10, str(tmp_path), common, counts)
  assert len(seen) == len(set(seen)) == 8 and all(os.path.isdir(d) for d in seen)  # a new directory each
  row = {(r["scheme"], r["num_layers"]): r for r in out["runs"]}
  for (scheme, depth), r in row.items():
    assert r["cpu_s_per_step"] == pytest.approx(0.25 * depth) and r["cpu_s_fixed"] == pytest.approx(3.0)
    assert r["cpu_s_run"] == pytest.approx(3.0 + 200 * 0.25 * depth)
  assert out["stage_cpu_s"] == pytest.approx({"tune": 4 * 103 + 4 * 203, "main": 5 * 103 + 5 * 203})
  assert out["wall_h_on_2_cores"] == pytest.approx((9 * 103 + 9 * 203) / 3600 / 2)


# ------------------------------------------------------------------------------------------- recorded stages


def test_both_stages_with_recorded_runs(tmp_path, monkeypatch):
  """The pilot and main stages end to end, each run's training replaced by a record (the grid, resume, selection,
  N from pilot.json, the final seeds, the statistics and the report are the real code)."""
  rng = np.random.default_rng(3)
  trained = []

  def summarise(run):
    unstable = run["scheme"] == "post" and run["num_layers"] == 12 and run["lr"] > 1e-2
    val = math.inf if unstable else float(4.5 - 10 * run["lr"] + rng.normal(0, 0.002))
    return record(run["scheme"], run["num_layers"], run["seed"], val, lr=run["lr"], warmup=run["warmup_steps"])

  monkeypatch.setattr(sweep.runner, "run_grid", recording_grid(sweep.runner, summarise, trained))
  monkeypatch.setattr(sweep.lm_comparison, "prepare_corpus", lambda workdir, common: None)
  pilot = str(tmp_path / "pilot.json")
  kept = tmp_path / "kept"
  common = ["--keep-runs", str(kept), "--workdir", str(tmp_path / "w"), "--methods", "pre,post,siamese_post_pre",
            "--tune-seeds", "100",
            "--depths", "6,12", "--lrs", "1e-3,3e-2", "--warmups", "10", "--pilot", pilot]
  with pytest.raises(SystemExit, match="no pilot file"):
    sweep.main(common + ["--out", str(tmp_path / "none")])
  assert trained == []
  sweep.main(common + ["--stage", "pilot", "--out", str(tmp_path / "p")])
  assert len(trained) == 3 * 2 * 2 + 3 * 2 * 3  # tuning grid; 3 pilot seeds at each (scheme, depth)'s setting
  with open(pilot) as f:
    fixed = json.load(f)
  n = fixed["power"]["n"]
  assert n == sweep.MIN_SEEDS and fixed["power"]["family_size"] == 2 * 2 + 2 + 2 * 2
  assert fixed["best"]["post@12"]["lr"] == 1e-3 and fixed["best"]["pre@12"]["lr"] == 3e-2
  assert (tmp_path / "pilot_runs" / "runs" / "tune/d6/pre/lr0.001/wu10/seed100/done.json").exists()
  sweep.main(common + ["--out", str(tmp_path / "out")])
  assert len(trained) == 30 + 6 * n  # the tuning runs are the pilot stage's
  with open(tmp_path / "out" / "results.json") as f:
    payload = json.load(f)
  assert payload["reported_seeds"] == list(range(n)) and payload["power"]["n"] == n
  assert payload["statistics"]["n_fixed"].startswith(f"N = {n} fixed before the main runs")
  assert "Holm" in payload["statistics"]["multiplicity"] and "t interval" in payload["statistics"]["interval"]
  assert len(payload["comparisons"]) == fixed["power"]["family_size"]
  post12 = next(r for r in payload["stability"] if (r["scheme"], r["num_layers"]) == ("post", 12))
  assert (post12["trained"], post12["diverged"], post12["trained_share"]) == (1, 1, 0.5)
  assert {c["claim"] for c in payload["claims"]} >= {"SiameseNorm: lower test loss than Pre-Norm at 12 layers"}
  report = (tmp_path / "out" / "results.md").read_text()
  assert "| 12 | post | 1 | 0 | 1 | 0.50 | 0.001 |" in report and "## Verdicts" in report
  assert payload["design"]["stages"] == sweep.STAGES and sweep.STAGES.startswith("(`--stage`)")
  assert "  main:" in sweep.STAGES and sweep.STAGES.endswith("from the observed sd).")
  upper = lambda k, n: sps.binomtest(k, n).proportion_ci(0.95, "exact").high
  rows = [c for c in payload["claims"] if c["kind"] == "trained"]
  assert len(rows) == 4
  for c in rows:  # the trained rows show the Clopper-Pearson bounds their verdict reads, not a t interval
    comp = next(x for x in payload["comparisons"] if (x["kind"], x["b"], x["num_layers"]) == ("trained", c["b"],
                                                                                             c["num_layers"]))
    k_a, k_b, cells = comp["a_only"], comp["b_only"], comp["n"]
    line = next(line for line in report.splitlines() if line.startswith(f"| {c['claim']} |"))
    assert f"[-U(k_b), +U(k_a): {-upper(k_b, cells):+.4f}, {upper(k_a, cells):+.4f}; k_a {k_a}, k_b {k_b}]" in line
    assert f"(min {min(1.0, 2 / 2 ** (k_a + k_b)):.2g})" in line
  assert (tmp_path / "out" / "depth_sweep.png").exists()
  sweep.main(common + ["--out", str(tmp_path / "again")])
  assert len(trained) == 30 + 6 * n  # nothing trained twice
  assert len(list(kept.glob("runs/*/*/*/*/*/seed*/done.json")) + list(kept.glob("runs/final/*/*/seed*/done.json"))
             ) == len(trained)  # each run kept as it finished
  fresh = common[:3] + [str(tmp_path / "fresh")] + common[4:]  # a later session's machine: the kept files only
  sweep.main(fresh + ["--out", str(tmp_path / "fresh_out")])
  assert len(trained) == 30 + 6 * n  # every run imported, none trained
  with open(tmp_path / "fresh_out" / "results.json") as f:
    assert json.load(f)["comparisons"] == payload["comparisons"]
  tuned = tmp_path / "w" / "tune/d6/pre/lr0.001/wu10/seed100" / "done.json"
  kept = json.loads(tuned.read_text())
  digest = kept["config_digest"]
  tuned.write_text(json.dumps(dict(kept, config_digest="0ther")))
  with pytest.raises(SystemExit, match=rf"^tune/d6/pre/lr0.001/wu10/seed100 \(.*\): trained with config_digest 0ther, "
                                       rf"the current code's is {digest};"):
    sweep.main(common + ["--out", str(tmp_path / "stale")])
  sweep.main(common + ["--report-only", "--out", str(tmp_path / "stale_report")])  # a report only: a warning
  tuned.write_text(json.dumps(kept))
  stale = dict(fixed, runs=[dict(r, config_digest="0ther") if r["phase"] == "pilot" else r for r in fixed["runs"]])
  with open(pilot, "w") as f:
    json.dump(stale, f)
  with pytest.raises(SystemExit, match=r"^pilot/d6/pre/.*\(.*pilot.json\): trained with config_digest 0ther"):
    sweep.main(common + ["--out", str(tmp_path / "stale_pilot")])
  with open(pilot, "w") as f:
    json.dump(fixed, f)
  assert len(trained) == 30 + 6 * n
  with pytest.raises(SystemExit, match="made for"):  # another grid: refused before anything trains
    sweep.main(common[:-5] + ["1e-3,1e-1", "--warmups", "10", "--pilot", pilot, "--out", str(tmp_path / "g")])
  fixed["best"]["pre@6"]["lr"] = 1.0
  with open(pilot, "w") as f:
    json.dump(fixed, f)
  with pytest.raises(SystemExit, match="tuned settings"):
    sweep.main(common + ["--out", str(tmp_path / "changed")])
  assert len(trained) == 30 + 6 * n


@pytest.mark.slow
def test_smoke_pipeline_runs_both_stages(tmp_path):
  """--smoke: the tuning grid, pilot (N written) and main stage (report) of a tiny model, really trained; then the
  same workdir reported again without training."""
  script = os.path.join(ROOT, "experiments", "depth_sweep", "run.py")
  args = [sys.executable, script, "--smoke", "--methods", "pre,post,siamese_post_pre", "--workdir",
          str(tmp_path / "w"), "--jobs", "1"]
  subprocess.run(args + ["--out", str(tmp_path / "out")], check=True, cwd=ROOT, capture_output=True, text=True)
  with open(tmp_path / "out" / "pilot.json") as f:
    pilot = json.load(f)
  assert pilot["power"]["pilot_seeds"] == [200, 201] and len(pilot["runs"]) == 3 * 2 * 2 + 3 * 2 * 2
  with open(tmp_path / "out" / "results.json") as f:
    payload = json.load(f)
  assert payload["reported_seeds"] == [0, 1] and len(payload["final"]) == 3 * 2
  assert all(math.isfinite(r["unigram_loss"]) for r in pilot["runs"])
  assert all(r["grad_norm_last"] is not None for r in pilot["runs"] if r["validation_loss"] is not None)
  again = subprocess.run(args + ["--report-only", "--out", str(tmp_path / "again")], check=True, cwd=ROOT,
                         capture_output=True, text=True)
  assert "training" not in again.stdout
  with open(tmp_path / "again" / "results.json") as f:
    assert json.load(f)["comparisons"] == payload["comparisons"]
