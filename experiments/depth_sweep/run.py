"""Stability with depth (issue 31 items 3, 4): Pre/Post/HybridNorm, SiameseNorm (post_pre), mHC-lite and Sinkhorn mHC
LMs at DEPTHS layers of one small width, each (scheme, depth) over an lr x warm-up grid; divergence rate, final loss and
gradient norm by depth. SiameseNorm's core claim is that it keeps Pre-Norm's clean identity path (it trains where
Pre-Norm trains, at any depth) and Post-Norm's capacity (lower loss); this asks both where depth makes them differ.

The model, data and budget of `experiments/siamese_vs_prenorm/config.py` (d_model 64, 4 heads, MLP 256, seq 64,
batch 16, tiny Shakespeare, **200 steps: a limit of this CPU, stated as such**; every conclusion is about this
budget), `model.num_layers` set per run. The runs are `experiments.toolkit.lm_comparison.train_one`'s (final
validation and test loss, the per-block gradient-norm and stream-norm probes at init and at the end, the logged
global gradient norm before clipping, the corpus's unigram loss), trained by `toolkit.runner` (resumable per-run
dirs, `--jobs` workers).

Each run's outcome (`outcome`): "diverged" (a non-finite loss, gradient or parameter stopped it, or its final
validation loss is above ln(vocab), worse than uniform), "stalled" (final validation loss above the unigram loss
minus MARGIN = 0.1 nats: it learned nothing a context-free token-frequency model does not know; the unigram loss is
recomputed from the corpus and recorded by every run, its done.json's `unigram_loss`, the rule's only source: 5.949
for these validation rows when this was written, not a committed figure; the stalled Post-Norm and HybridNorm runs of
`residual_schemes_lm` ended at 5.948-5.952, its results/results.json), else "trained".

Stages (`--stage`), each resumable from its per-run files, so a stage can run over several sessions:
  pilot: tuning first: every scheme x depth x lr (LRS) x warm-up (WARMUPS, steps of linear warm-up before the
         cosine decay) x the tuning seeds; each (scheme, depth)'s (lr, warm-up) = argmin of the mean final
         *validation* loss (a non-finite one counts as +inf), flagged where it sits at the edge of an axis of 3 or
         more values (lr; warm-up only if given 3 or more: of 2 values, either is an edge). Warm-up is
         tuned jointly with lr for every scheme (issue 31 item 4: a 10-step warm-up at every lr stalled Post-Norm
         and HybridNorm from lr 1e-2 up). Then PILOT_SEEDS at each (scheme, depth)'s tuned (lr, warm-up); the
         paired sd over pilot seeds of the final validation loss (never test: N is a calibration) of
         siamese_post_pre - pre at each depth, the largest over depths, fixes N = the smallest n >= MIN_SEEDS
         whose two-sided paired t test has 80% power for TARGET (0.02 nats, the LM target of experiments/README.md)
         at the Bonferroni level 0.05 / m, m the number of comparisons of the report's Holm family (the level of
         Holm's strictest step; N at 0.05 is recorded beside it), capped at MAX_SEEDS (the CPU budget; a cap that
         binds is reported: "cannot resolve at this scale", with the n it would take). Written with the tuned
         settings, the tuning table and every run to `--pilot` (default `pilot.json` here, committed before any
         main run) and its per-run files to `pilot_runs/`.
  main:  N and the tuned (lr, warm-up) read from pilot.json (the tuning runs are read again, never retrained, and
         must give the same choice; they and the pilot file's runs must carry the current code's config_digest,
         `runner.refuse_other_digests`, or the stage stops before training: the final runs are trained with it).
         Seeds 0 .. N-1 of every (scheme, depth) at its tuned setting. Reported:
         - loss: final *test* loss (held-out rows after the validation rows), paired by seed, each scheme - pre at
           each depth; and the depth trend, (scheme - pre) at the deepest minus at the shallowest depth, per seed;
           a seed where either run diverged drops out of that pair (the count is reported);
         - stability: the share of the tuning grid (lr x warm-up x tuning seed) that trains, per scheme and depth,
           with the diverged and stalled counts, and paired by grid cell (the same lr, warm-up and seed) at each
           depth: trained(siamese_post_pre) - trained(pre) and - trained(post) (the sign-flip p of a 0/1
           difference is the exact McNemar test on the m discordant cells, exact at any number of cells
           (`stats.sign_flip_p`'s binomial case), its smallest attainable value 2 / 2^m; shown with the
           Clopper-Pearson bounds its verdict uses);
         - gradient norm by depth: the largest and the last logged global gradient norm (before clipping; each
           logged value is the mean over its log_every = 10 steps) of the main runs, and the init probe's gradient
           reaching the first over the last block;
         - every comparison with its 95% t interval, paired t and exact sign-flip p, Holm-adjusted over the whole
           report (`toolkit/stats.py`), and each claim's verdict (`CLAIMS`, `verdict`: supports / contradicts /
           cannot resolve at this scale, with the n that 80% power needs from the observed sd).
`--smoke`: both stages on a tiny model (2 depths, 2 lrs, 1 warm-up, 2 pilot seeds, N = 2), a pipeline check with
no numbers. `--stage timing` measures the CPU time of one run per (scheme, depth) (below).

Sizing: **measured once by `--stage timing` at 396022c on a loaded machine, not committed; rerun before relying on
them** (the rerun's `timing.json` goes to `experiments/depth_sweep/timing/`, the first command below, to be committed
with the pilot). Measured with `--stage timing --methods pre --depths 6,12,24,48` and `--stage timing --depths 24`, the
code of 396022c before its fresh-directory fix (the second command's pre run resumed the first's directory and is left
out), on this 2-core machine while other jobs held both cores: the CPU seconds of one single-threaded process, as a
--jobs 2 grid worker runs, with no compilation cache, at 10 and 50 steps, extrapolated linearly to 200; contention
slows the wall time, much less the CPU time). One 200-step run, CPU s (of which fixed: compile, probes,
evaluations): pre 46 (23) / 71 (29) / 112 (41) / 215 (56) at 6 / 12 / 24 / 48 layers (0.11 / 0.21 / 0.36 / 0.80 s a
step: linear in depth); at 24 layers post 124, hybrid 134,
siamese_post_pre 138, mhc_lite:4 204 (1.10 / 1.19 / 1.23 / 1.82 x pre; the other depths scaled by these ratios).
One run of each scheme: 294 / 450 / 712 / 1364 CPU s at 6 / 12 / 24 / 48 layers. Each (scheme, depth) has 20
tuning runs (5 lrs x 2 warm-ups x 2 tuning seeds), 3 pilot runs and N <= 8 main runs. At DEPTHS = 6 / 12 / 24:
pilot stage 23 x 1456 = 33,500 CPU s (9.3 h of CPU, 4.6 h on 2 cores), main stage at most 8 x 1456 = 11,600 CPU s
(1.6 h on 2 cores); in all about 6.3 h of 2 free cores, two or three 3-hour sessions (an upper bound on CPU time:
the grid's shared compilation cache saves part of each run's fixed seconds; other jobs on the cores stretch the
wall time). **48 layers does not fit**: it alone would add 31 x 1364 = 42,300 CPU s (+5.9 h on 2 cores, doubling
the experiment), so the sweep stops at 24; `--depths 6,12,24,48` runs it where the budget allows (the pilot then
reruns with it: the main stage refuses a pilot made for another grid). A 2-seed tuning grid was kept over a
deeper sweep because the stability claims are paired by tuning cell: with 10 cells no McNemar p can pass Holm's
strictest level over the report's 26 comparisons (0.05 / 26 = 0.0019, below the 2 / 2^10 = 0.00195 of all 10 cells
disagreeing in one direction; it was 22 comparisons, 0.0023, before Sinkhorn mHC joined), and no exact bound can
show non-inferiority within 0.2 (the Clopper-Pearson end for 0 of 10 cells is 0.31; of 20, 0.17).

Sessions: every finished tuning, pilot and final run is copied to `kept_runs/` (committed) as it finishes, and a
fresh workdir imports them (`runner.copy_finished`), so the ~6 h of runs span sessions whose machines keep nothing
(each run trains from scratch: its record and metrics are all a later stage reads).

Code: every run of this experiment trains on one model code, that of 1805869 (the gradient clip as a scalar factor and
SwiGLU's recomputed product, both later, change rounding) with mHC's Sinkhorn fix, from 9b67ee0 (branch
`depth-sweep-code`: 1805869 plus this file's SCHEMES (a26119b) plus mHC's Sinkhorn fix of beb4b7a; merged into main with
`-s ours`, so it stays reachable): `git worktree add /tmp/depth-code 9b67ee0`, then the commands below from there.
Sinkhorn mHC (`mhc:4`, issue 31 item 4) joined SCHEMES at a26119b, after 111 of seed 100's tuning runs and before any
pilot seed, so it is tuned on the same grid and counted in N's Holm family; it adds 1/5 to the runs above. Its first 21
tuning runs, at a26119b, hit a Sinkhorn underflow (0 / 0, NaN at lr 0.1): they are kept in
`kept_runs/superseded_exp_sinkhorn/` (its README) and all mhc:4 runs are trained at 9b67ee0, which changes only mHC's
forward (the other schemes' runs stand).

  python experiments/depth_sweep/run.py --stage timing --workdir /tmp/depth_timing --out experiments/depth_sweep/timing
  python experiments/depth_sweep/run.py --stage pilot [--workdir /tmp/depth_sweep] [--jobs 2]
  python experiments/depth_sweep/run.py --stage main --out experiments/depth_sweep/results
  python experiments/depth_sweep/run.py --smoke --workdir /tmp/depth_smoke --jobs 1
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments import power as power_lib  # noqa: E402
from experiments.toolkit import flags, lm_comparison, results, runner, stats  # noqa: E402

CONFIG = "experiments.depth_sweep.config"
SCHEMES = ("pre", "post", "hybrid", "siamese_post_pre", "mhc_lite:4", "mhc:4")
BASELINE, SIAMESE, POST = "pre", "siamese_post_pre", "post"
DEPTHS = (6, 12, 24)
LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
WARMUPS = (10, 50)
TUNE_SEEDS = (100, 101)
PILOT_SEEDS = (200, 201, 202)
MIN_SEEDS, MAX_SEEDS = 5, 8
TARGET = power_lib.LM_NATS  # nats of loss: the smallest SiameseNorm - Pre-Norm difference this means to detect
TARGET_TRAINED = 0.2  # share of the tuning grid: the smallest difference in the share that trains to detect
MARGIN = 0.1
EDGE_MIN_VALUES = 3  # a tuned value is flagged at its grid's edge only on an axis of this many values or more
SMOKE = {"steps": 4, "log_every": 2, "eval_every": 2, "checkpoint_every": 4, "model.d_model": 16,
         "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 32, "data.max_corpus_bytes": 300_000,
         "data.eval_batches": 2}
SMOKE_GRID = dict(depths=(1, 2), lrs=(1e-2, 1e-1), warmups=(1,), tune_seeds=(100,), pilot_seeds=(200, 201), n=2)
CORPUS = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "tinyshakespeare"))
STAGES = results.doc_section(__doc__, "Stages", "`--smoke`")  # results.json's design.stages, checked at import


# ---------------------------------------------------------------------------------------------------------- runs


def tune_runs(schemes, depths, lrs, warmups, seeds, common: dict) -> list[dict]:
  return [dict(common, name=f"tune/d{depth}/{s}/lr{lr:g}/wu{w}/seed{seed}", phase="tune", scheme=s,
               num_layers=depth, lr=lr, warmup_steps=w, seed=seed)
          for seed in seeds for depth in depths for lr in lrs for w in warmups for s in schemes]


def seed_runs(phase: str, best: dict, seeds, common: dict) -> list[dict]:
  """Every (scheme, depth) of `best` ({"scheme@depth": {"lr", "warmup_steps"}}) at its setting x `seeds`."""
  runs = []
  for seed in seeds:
    for key, chosen in best.items():
      scheme, depth = split_key(key)
      runs.append(dict(common, name=f"{phase}/d{depth}/{scheme}/lr{chosen['lr']:g}/wu{chosen['warmup_steps']}/"
                       f"seed{seed}", phase=phase, scheme=scheme, num_layers=depth, lr=chosen["lr"],
                       warmup_steps=chosen["warmup_steps"], seed=seed))
  return runs


def key_of(scheme: str, depth: int) -> str:
  return f"{scheme}@{depth}"


def split_key(key: str) -> tuple[str, int]:
  scheme, _, depth = key.rpartition("@")
  return scheme, int(depth)


# ------------------------------------------------------------------------------------------------------ outcomes


def outcome(run: dict) -> str:
  """'diverged' (non-finite, or final validation loss > ln(vocab)), 'stalled' (final validation loss above the
  corpus's unigram loss - MARGIN) or 'trained'."""
  loss = run["validation_loss"]
  if loss is None or not math.isfinite(loss) or loss > math.log(run["vocab_size"]):
    return "diverged"
  return "stalled" if loss > run["unigram_loss"] - MARGIN else "trained"


COMPACT = ("name", "phase", "scheme", "num_layers", "lr", "warmup_steps", "seed", "validation_loss", "unigram_loss",
           "vocab_size", "grad_norm_max", "grad_norm_last", "nonfinite_step", "wall_s", "config_digest")


def compact(run: dict) -> dict:
  """A run's row in pilot.json: its settings, final validation loss, outcome and gradient norms (the full record,
  probes included, is its done.json in pilot_runs/; its test loss is left out: the pilot reads validation only)."""
  return dict({k: run[k] for k in COMPACT if k in run}, outcome=outcome(run))


def finite_or_inf(value) -> float:
  return value if value is not None and math.isfinite(value) else math.inf


def at_edge(value, grid) -> bool:
  """Whether `value` is the smallest or largest of `grid`, an axis of EDGE_MIN_VALUES or more values (with two,
  every choice is an end: no optimum could be seen inside it, so nothing is flagged)."""
  return len(set(grid)) >= EDGE_MIN_VALUES and value in (min(grid), max(grid))


def select(tuning: list[dict], schemes, depths, lrs, warmups) -> tuple[dict, list[dict]]:
  """({"scheme@depth": {"lr", "warmup_steps", "lr_at_edge", "warmup_at_edge"}} with the lowest mean final
  validation loss over the tuning seeds (a non-finite loss counts as +inf), the tuning table; `at_edge` flags."""
  table, best = [], {}
  for depth in depths:
    for scheme in schemes:
      rows = []
      for lr in lrs:
        for w in warmups:
          runs = [r for r in tuning if (r["scheme"], r["num_layers"], r["lr"], r["warmup_steps"]) ==
                  (scheme, depth, lr, w)]
          if runs:
            losses = [finite_or_inf(r["validation_loss"]) for r in runs]
            rows.append(dict(scheme=scheme, num_layers=depth, lr=lr, warmup_steps=w, seeds=[r["seed"] for r in runs],
                             validation_loss=sum(losses) / len(losses), outcomes=[outcome(r) for r in runs]))
      if not rows:
        continue
      chosen = min(rows, key=lambda r: (r["validation_loss"], r["lr"], r["warmup_steps"]))
      for r in rows:
        r["chosen"] = r is chosen
      best[key_of(scheme, depth)] = dict(lr=chosen["lr"], warmup_steps=chosen["warmup_steps"],
                                         lr_at_edge=at_edge(chosen["lr"], lrs),
                                         warmup_at_edge=at_edge(chosen["warmup_steps"], warmups))
      table += rows
  return best, table


def stability_table(tuning: list[dict], schemes, depths) -> list[dict]:
  """Per (scheme, depth): the tuning grid's outcome counts, the share that trains and the lrs where it does."""
  rows = []
  for depth in depths:
    for scheme in schemes:
      runs = [r for r in tuning if r["scheme"] == scheme and r["num_layers"] == depth]
      if runs:
        counts = {o: sum(outcome(r) == o for r in runs) for o in ("trained", "stalled", "diverged")}
        rows.append(dict(scheme=scheme, num_layers=depth, runs=len(runs), trained_share=counts["trained"] / len(runs),
                         trained_lrs=sorted({r["lr"] for r in runs if outcome(r) == "trained"}), **counts))
  return rows


# --------------------------------------------------------------------------------------------------- comparisons


def comparison_plan(schemes, depths) -> list[tuple]:
  """The report's Holm family, in order: ("loss", a, b, depth) for each scheme - pre at each depth; ("trend", a,
  b, deepest, shallowest) for each scheme - pre; ("trained", siamese, b, depth) for b in (pre, post) at each depth
  (those run)."""
  depths = sorted(depths)
  others = [s for s in schemes if s != BASELINE]
  if BASELINE not in schemes:
    return []
  plan = [("loss", s, BASELINE, d) for d in depths for s in others]
  if len(depths) > 1:
    plan += [("trend", s, BASELINE, depths[-1], depths[0]) for s in others]
  if SIAMESE in schemes:
    plan += [("trained", SIAMESE, b, d) for d in depths for b in (BASELINE, POST) if b in schemes]
  return plan


def comparisons(final: list[dict], tuning: list[dict], plan) -> list[dict]:
  """The paired statistics of `plan` (`comparison_plan`), Holm-adjusted as one family. Loss and trend: test loss
  paired by seed over the seeds where no run of the pair (or quadruple) diverged; trained: 0/1 paired by tuning
  cell (lr, warm-up, seed)."""
  loss = {(r["scheme"], r["num_layers"], r["seed"]): r for r in final}
  cells = {(r["scheme"], r["num_layers"], r["lr"], r["warmup_steps"], r["seed"]): r for r in tuning}
  seeds = sorted({r["seed"] for r in final})
  ok = lambda s, d, seed: (s, d, seed) in loss and outcome(loss[(s, d, seed)]) != "diverged"
  test = lambda s, d, seed: loss[(s, d, seed)]["test_loss"]
  out = []
  for kind, a, b, *depth in plan:
    if kind == "loss":
      d = depth[0]
      used = [seed for seed in seeds if ok(a, d, seed) and ok(b, d, seed)]
      x, y = [test(a, d, seed) for seed in used], [test(b, d, seed) for seed in used]
      entry = dict(metric="test_loss", num_layers=d)
    elif kind == "trend":
      deep, shallow = depth
      used = [seed for seed in seeds if all(ok(s, d, seed) for s in (a, b) for d in (deep, shallow))]
      x = [test(a, deep, seed) - test(b, deep, seed) for seed in used]
      y = [test(a, shallow, seed) - test(b, shallow, seed) for seed in used]
      entry = dict(metric=f"test_loss_difference_{deep}_minus_{shallow}_layers", num_layers=deep,
                   shallow_layers=shallow)
    else:
      d = depth[0]
      keys = sorted(k[2:] for k in cells if k[:2] == (a, d) and (b, d) + k[2:] in cells)
      used = [list(k) for k in keys]
      x = [float(outcome(cells[(a, d) + k]) == "trained") for k in keys]
      y = [float(outcome(cells[(b, d) + k]) == "trained") for k in keys]
      entry = dict(metric="trained", num_layers=d, a_only=sum(i > j for i, j in zip(x, y)),
                   b_only=sum(j > i for i, j in zip(x, y)))
    if len(x) >= 2:
      dropped = len(seeds) - len(used) if kind != "trained" else 0
      out.append(dict(a=a, b=b, kind=kind, **entry, seeds=used, dropped_diverged=dropped, **stats.paired(x, y)))
  return stats.holm_adjust(out)


# ------------------------------------------------------------------------------------------------------- claims

# claim, the comparison (kind, a, b), the claimed sign (+1: a above b), the target effect, how it is judged
CLAIMS = (
    ("SiameseNorm: lower test loss than Pre-Norm at {d} layers", ("loss", SIAMESE, BASELINE), -1, TARGET,
     "superiority"),
    ("SiameseNorm's loss gain over Pre-Norm grows with depth ({d} vs {s} layers)", ("trend", SIAMESE, BASELINE),
     -1, TARGET, "superiority"),
    ("SiameseNorm trains on more of the lr x warm-up grid than Post-Norm at {d} layers", ("trained", SIAMESE, POST),
     +1, TARGET_TRAINED, "superiority"),
    ("SiameseNorm trains on as much of the lr x warm-up grid as Pre-Norm at {d} layers (within {t:g})",
     ("trained", SIAMESE, BASELINE), +1, TARGET_TRAINED, "non-inferiority"),
)


def share_upper_bound(k: int, n: int, level: float = 0.95) -> float:
  """The two-sided Clopper-Pearson (exact binomial) interval's upper end for a share of k of n: the
  (1 + level) / 2 quantile of Beta(k + 1, n - k); 1 for k = n."""
  from scipy import stats as scipy_stats

  return 1.0 if k >= n else float(scipy_stats.beta.ppf((1.0 + level) / 2.0, k + 1, n - k))


def verdict(c: dict, sign: int, effect: float, how: str) -> str:
  """A claim's verdict. Loss and trend (paired by seed): experiments/power.py's rule (t interval, Holm p_t).
  Trained (0/1 by cell; a t interval of 0/1 differences is degenerate when every cell agrees): with k_a cells where
  only A trains and k_b where only B does (d = (k_a - k_b) / n), the Holm-adjusted sign-flip p (the exact McNemar
  test on the k_a + k_b discordant cells, exact at any n) and exact bounds: d <= k_a / n <= U(k_a) and
  d >= -k_b / n >= -U(k_b), U the Clopper-Pearson upper end.
  Superiority (A trains on more): 'supports' where Holm sign-flip p < 0.05 and k_a > k_b, 'contradicts' where it is
  < 0.05 and k_b > k_a, 'contradicts a difference of the target's size' where U(k_a) < `effect`. Non-inferiority
  (A trains on at most `effect` less): 'supports' where U(k_b) < `effect`, 'contradicts' where Holm sign-flip p
  < 0.05 and k_b > k_a. Otherwise 'cannot resolve at this scale'. The exact bounds are each claim's own 95% bound,
  not adjusted for multiplicity (at Holm's strictest level, 0.05 / 26, no 20-cell grid could show non-inferiority
  within 0.2: U(0 of 20) would be 0.29); the p values are Holm-adjusted."""
  if c["kind"] != "trained":
    return power_lib.verdict(c, sign, effect)
  n, k_a, k_b = c["n"], c["a_only"], c["b_only"]
  significant = c["p_sign_flip_holm"] < power_lib.ALPHA
  if how == "superiority":
    if significant:
      return "supports" if k_a > k_b else "contradicts"
    if share_upper_bound(k_a, n) < abs(effect):
      return "contradicts a difference of the target's size"
  else:
    if share_upper_bound(k_b, n) < abs(effect):
      return "supports"
    if significant and k_b > k_a:
      return "contradicts"
  return "cannot resolve at this scale"


def claims(comps: list[dict]) -> list[dict]:
  """One row per CLAIMS entry and depth (trend: once) with its comparison, verdict and the n that 80% power needs
  (the paired t test from the observed sd; for the trained share a normal approximation, in tuning cells, only
  where the sd is not 0); a trained row adds the discordant counts k_a, k_b (`a_only`, `b_only`) and the bounds its
  verdict reads, `exact_bounds` = [-U(k_b), +U(k_a)] (`share_upper_bound`)."""
  rows = []
  for text, (kind, a, b), sign, effect, how in CLAIMS:
    for c in (c for c in comps if (c["kind"], c["a"], c["b"]) == (kind, a, b)):
      needed = stats.paired_n_for_power(c["std_diff"], sign * effect) if c["std_diff"] > 0 else math.inf
      exact = {} if kind != "trained" else dict(
          a_only=c["a_only"], b_only=c["b_only"], min_p_sign_flip=c["min_p_sign_flip"],
          exact_bounds=[-share_upper_bound(c["b_only"], c["n"]), share_upper_bound(c["a_only"], c["n"])])
      rows.append(dict(claim=text.format(d=c["num_layers"], s=c.get("shallow_layers"), t=effect), kind=kind, a=a,
                       b=b, metric=c["metric"], num_layers=c["num_layers"], target_effect=sign * effect, test=how,
                       mean_diff=c["mean_diff"], ci95=c["ci95"], **exact, p_t_holm=c["p_t_holm"],
                       p_sign_flip_holm=c["p_sign_flip_holm"], n=c["n"], verdict=verdict(c, sign, effect, how),
                       n_for_80_power=needed if math.isfinite(needed) else None,
                       unit="seeds" if kind != "trained" else "tuning cells"))
  return rows


# -------------------------------------------------------------------------------------------------------- power


def power(pilot: list[dict], depths, family_size: int) -> dict:
  """N from the pilot runs (module docstring): the largest paired sd over depths of the validation loss of
  siamese_post_pre - pre."""
  by = {(r["scheme"], r["num_layers"], r["seed"]): r for r in pilot}
  seeds = sorted({r["seed"] for r in pilot})
  sds = {}
  for d in depths:
    used = [s for s in seeds if all(k in by and outcome(by[k]) != "diverged" for k in ((SIAMESE, d, s),
                                                                                        (BASELINE, d, s)))]
    if len(used) >= 2:
      sds[str(d)] = stats.paired([by[(SIAMESE, d, s)]["validation_loss"] for s in used],
                                 [by[(BASELINE, d, s)]["validation_loss"] for s in used])["std_diff"]
  finite = [v for v in sds.values() if math.isfinite(v) and v > 0]
  sd = max(finite) if finite else math.nan
  alpha = power_lib.ALPHA / max(family_size, 1)
  needed = stats.paired_n_for_power(sd, TARGET, 0.8, alpha) if finite else math.inf
  needed_05 = stats.paired_n_for_power(sd, TARGET, 0.8) if finite else math.inf
  n = int(min(max(needed, MIN_SEEDS), MAX_SEEDS)) if math.isfinite(needed) else MAX_SEEDS
  return dict(outcome="validation_loss", comparison=f"{SIAMESE} - {BASELINE}, each depth", target_effect=TARGET,
              target_source="chosen here (experiments/README.md's LM target): 0.02 nats, a 2% perplexity change",
              pilot_seeds=seeds, pilot_sd_diff=sds, sd_used=sd, family_size=family_size, alpha=alpha,
              n_for_80_power=needed if math.isfinite(needed) else None,
              n_for_80_power_at_005=needed_05 if math.isfinite(needed_05) else None, n=n, min_seeds=MIN_SEEDS,
              max_seeds=MAX_SEEDS, cap_binds=bool(not math.isfinite(needed) or needed > MAX_SEEDS),
              detectable_effect_at_n=stats.detectable_effect(sd, n, 0.8, alpha) if finite else None)


# ------------------------------------------------------------------------------------------------------- report


def final_table(final: list[dict], schemes, depths) -> list[dict]:
  """Per (scheme, depth) at its tuned setting: outcomes, test / validation loss of the non-diverged seeds, the
  largest and last logged gradient norm, and the init probe's first-over-last block gradient."""
  rows = []
  for depth in depths:
    for scheme in schemes:
      runs = sorted((r for r in final if r["scheme"] == scheme and r["num_layers"] == depth), key=lambda r: r["seed"])
      if not runs:
        continue
      kept = [r for r in runs if outcome(r) != "diverged"]
      grads = [r["probe_init"]["block_grad_norms"] for r in runs]
      rows.append(dict(scheme=scheme, num_layers=depth, lr=runs[0]["lr"], warmup_steps=runs[0]["warmup_steps"],
                       params=runs[0]["params"], seeds=[r["seed"] for r in runs],
                       **{o: sum(outcome(r) == o for r in runs) for o in ("trained", "stalled", "diverged")},
                       test_loss=stats.summary([r["test_loss"] for r in kept]),
                       validation_loss=stats.summary([r["validation_loss"] for r in kept]),
                       grad_norm_max=stats.summary([r["grad_norm_max"] for r in kept]),
                       grad_norm_last=stats.summary([r["grad_norm_last"] for r in kept]),
                       init_grad_first_over_last=stats.summary([g[0] / g[-1] for g in grads])))
  return rows


def fmt_setting(chosen: dict) -> str:
  edge = [n for n, flag in (("lr", chosen["lr_at_edge"]), ("warm-up", chosen["warmup_at_edge"])) if flag]
  return f"{chosen['lr']:g} / {chosen['warmup_steps']}" + (f" ({', '.join(edge)} at grid edge)" if edge else "")


def markdown(payload: dict) -> str:
  p = payload["power"]
  lines = [payload["provenance"], "",
           f"**Budget: {payload['config']['steps']} steps at d_model {payload['config']['model']['d_model']} (a limit "
           "of this CPU; every conclusion is about this budget).** " + payload["statistics"]["n_fixed"] + ".", "",
           "## Stability: the lr x warm-up grid (tuning seeds " + str(payload["tune_seeds"]) + ")", "",
           f"Outcome of each run: trained / stalled (validation loss above the unigram loss - {MARGIN}) / diverged "
           "(non-finite, or above ln(vocab)).", "",
           "| layers | scheme | trained | stalled | diverged | share trained | lrs that train | tuned lr / warm-up |"
           " best validation loss |", "|---:|---|---:|---:|---:|---:|---|---|---:|"]
  for r in payload["stability"]:
    key = key_of(r["scheme"], r["num_layers"])
    chosen = payload["best"][key]
    best = min(t["validation_loss"] for t in payload["tuning"] if (t["scheme"], t["num_layers"]) ==
               (r["scheme"], r["num_layers"]))
    lines.append(f"| {r['num_layers']} | {r['scheme']} | {r['trained']} | {r['stalled']} | {r['diverged']} | "
                 f"{r['trained_share']:.2f} | {', '.join(f'{lr:g}' for lr in r['trained_lrs']) or '—'} | "
                 f"{fmt_setting(chosen)} | {best:.4f} |")
  lines += ["", f"## At the tuned setting: seeds {payload['reported_seeds']}", "",
            "| layers | scheme | params | test loss | validation loss | trained / stalled / diverged | max grad norm |"
            " last grad norm | init grad first/last block |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in payload["final"]:
    lines.append(f"| {r['num_layers']} | {r['scheme']} | {r['params']:,} | {stats.fmt(r['test_loss'], 4)} | "
                 f"{stats.fmt(r['validation_loss'], 4)} | {r['trained']} / {r['stalled']} / {r['diverged']} | "
                 f"{stats.fmt(r['grad_norm_max'])} | {stats.fmt(r['grad_norm_last'])} | "
                 f"{stats.fmt(r['init_grad_first_over_last'])} |")
  lines += ["", "Paired differences A - B (loss: test loss by seed, negative = A better; trained: 0/1 by tuning "
            "cell, positive = A trains more): " + stats.PAIRED_NOTE + ".", "",
            "| kind | layers | A - B | difference | diverged seeds left out |", "|---|---:|---|---|---:|"]
  for c in payload["comparisons"]:
    layers = f"{c['num_layers']} vs {c['shallow_layers']}" if c["kind"] == "trend" else str(c["num_layers"])
    lines.append(f"| {c['kind']} | {layers} | {c['a']} - {c['b']} | {stats.fmt_paired(c, 4)} | "
                 f"{c['dropped_diverged']} |")
  lines += ["", "## Verdicts", "", f"N: {p['n']} (80% power for {p['target_effect']} nats at alpha {p['alpha']:.2g} "
            f"needed {p['n_for_80_power']} from the pilot's sd {p['sd_used']:.4f}" +
            ("; capped by the CPU budget, so the loss claims cannot resolve that effect at this scale" if
             p["cap_binds"] else "") + ").", "",
            "Holm p: of the paired t test (loss, trend); of the exact sign-flip (McNemar) test on the k_a + k_b "
            "discordant cells (trained; k_a cells where only A trains, k_b where only B does; 'min': the smallest "
            "p those cells can reach). The interval: loss and trend, the 95% Student t interval of the mean; "
            "trained, the exact bounds the verdict reads, [-U(k_b), +U(k_a)], U the two-sided 95% Clopper-Pearson "
            "upper end of k of n cells, per claim, not multiplicity-adjusted (`verdict`).", "",
            "| claim | mean [interval] | Holm p | n | target | verdict | n for 80% |",
            "|---|---|---:|---:|---:|---|---:|"]
  for c in payload["claims"]:
    n80 = c["n_for_80_power"] if c["verdict"].startswith("cannot") and c["n_for_80_power"] else "—"
    if c["kind"] != "trained":
      value, p_holm = f"{c['mean_diff']:+.4f} [t 95%: {c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]", f"{c['p_t_holm']:.2g}"
    else:
      low, high = c["exact_bounds"]
      value = (f"{c['mean_diff']:+.4f} [-U(k_b), +U(k_a): {low:+.4f}, {high:+.4f}; k_a {c['a_only']}, "
               f"k_b {c['b_only']}]")
      p_holm = f"{c['p_sign_flip_holm']:.2g} (min {c['min_p_sign_flip']:.2g})"
    lines.append(f"| {c['claim']} | {value} | {p_holm} | {c['n']} {c['unit']} | {c['target_effect']:+g} | "
                 f"{c['verdict']} | {n80} |")
  return "\n".join(lines)


def plot(payload: dict, out: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from experiments.toolkit.tuning import scheme_color

  schemes = payload["schemes"]
  fig, axes = plt.subplots(1, 3, figsize=(14, 4))
  for scheme in schemes:
    color = scheme_color(scheme, schemes)
    rows = sorted((r for r in payload["stability"] if r["scheme"] == scheme), key=lambda r: r["num_layers"])
    axes[0].plot([r["num_layers"] for r in rows], [r["trained_share"] for r in rows], "o-", color=color,
                 label=scheme)
    rows = sorted((r for r in payload["final"] if r["scheme"] == scheme and r["test_loss"]["n"]),
                  key=lambda r: r["num_layers"])
    for ax, key in ((axes[1], "test_loss"), (axes[2], "grad_norm_max")):
      ax.errorbar([r["num_layers"] for r in rows], [r[key]["mean"] for r in rows],
                  yerr=[r[key]["std"] for r in rows], color=color, marker="o", capsize=3, label=scheme)
  axes[0].set(xlabel="layers", ylabel="share of the lr x warm-up grid that trains", xscale="log", ylim=(-0.05, 1.05),
              title="Stability")
  axes[1].set(xlabel="layers", ylabel="test loss (mean ± sd)", xscale="log", title="Loss at the tuned setting")
  axes[2].set(xlabel="layers", ylabel="largest logged grad norm", xscale="log", yscale="log",
              title="Gradient norm at the tuned setting")
  for ax in axes:
    ax.set_xticks(payload["depths"], [str(d) for d in payload["depths"]])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "depth_sweep.png"), dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------------- timing

def timed_child(run_json: str) -> None:
  """In a fresh single-threaded process: one `train_one` of `run_json`; prints {"cpu_s", "wall_s"}."""
  run = json.loads(run_json)
  os.makedirs(run["directory"], exist_ok=True)
  wall, cpu = time.perf_counter(), time.process_time()
  lm_comparison.train_one(run, run["directory"])
  print(json.dumps(dict(cpu_s=time.process_time() - cpu, wall_s=time.perf_counter() - wall)))


def timing(schemes, depths, steps: int, workdir: str, common: dict, counts: dict) -> dict:
  """CPU seconds of one run per (scheme, depth) at `steps` and 5 x `steps` steps (single-threaded XLA, no
  compilation cache: compile included; each in a new directory, so nothing resumes), extrapolated to the config's
  steps; and the experiment's total from `counts` (runs per (scheme, depth) of each stage)."""
  total_steps = lm_comparison.base_config(common).steps
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {runner.SINGLE_THREADED_XLA}".strip(),
             PYTHONPATH=REPO_ROOT)
  rows = []
  for depth in depths:
    for scheme in schemes:
      measured = {}
      for n in (steps, 5 * steps):
        os.makedirs(os.path.join(workdir, "timing"), exist_ok=True)
        directory = tempfile.mkdtemp(prefix=f"d{depth}_{scheme}_steps{n}_", dir=os.path.join(workdir, "timing"))
        run = dict(common, sets=dict(common["sets"], steps=n, eval_every=25, checkpoint_every=n), scheme=scheme,
                   num_layers=depth, lr=1e-3, warmup_steps=min(WARMUPS), seed=0, directory=directory)
        child = subprocess.run([sys.executable, "-c", "import sys; from experiments.depth_sweep.run import "
                                "timed_child; timed_child(sys.argv[1])", json.dumps(run)],
                               env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
        measured[n] = json.loads(child.stdout.strip().splitlines()[-1])
      per_step = (measured[5 * steps]["cpu_s"] - measured[steps]["cpu_s"]) / (4 * steps)
      fixed = measured[steps]["cpu_s"] - steps * per_step
      rows.append(dict(scheme=scheme, num_layers=depth, measured=measured, cpu_s_per_step=per_step,
                       cpu_s_fixed=fixed, cpu_s_run=fixed + total_steps * per_step))
      print(json.dumps(rows[-1]), flush=True)
  run_cpu = {key_of(r["scheme"], r["num_layers"]): r["cpu_s_run"] for r in rows}
  stages = {stage: sum(run_cpu[k] * c for k, c in per_key.items()) for stage, per_key in counts.items()}
  return dict(steps=[steps, 5 * steps], config_steps=total_steps, runs=rows, stage_cpu_s=stages,
              total_cpu_h=sum(stages.values()) / 3600, wall_h_on_2_cores=sum(stages.values()) / 3600 / 2)


# --------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> None:
  parser = flags.parser(__doc__, methods=SCHEMES, seeds=(), workdir="/tmp/depth_sweep")
  parser.add_argument("--stage", choices=("pilot", "main", "timing"), default="main")
  parser.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="model.num_layers of the sweep")
  parser.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in LRS), help="the tuning grid of peak lrs")
  parser.add_argument("--warmups", default=",".join(map(str, WARMUPS)), help="the tuning grid of warm-up steps")
  parser.add_argument("--tune-seeds", default=",".join(map(str, TUNE_SEEDS)), help="the tuning runs' seeds")
  parser.add_argument("--pilot-seeds", default=",".join(map(str, PILOT_SEEDS)),
                      help="the pilot's seeds (disjoint from the tuning seeds and the final seeds 0 .. N-1)")
  parser.add_argument("--pilot", default=os.path.join(HERE, "pilot.json"),
                      help="the pilot's file: written by --stage pilot, read by --stage main (N, tuned settings)")
  parser.add_argument("--corpus", default=CORPUS, help="data.path of every run")
  parser.add_argument("--timing-steps", type=int, default=10, help="--stage timing: steps of the shorter run")
  parser.add_argument("--keep-runs", default=os.path.join(HERE, "kept_runs"),
                      help="each finished tuning, pilot and final run is copied here as it finishes (committed: a "
                           "fresh --workdir imports them and goes on)")
  parser.add_argument("--smoke", action="store_true", help="a tiny run of both stages (pipeline check, no numbers)")
  args = parser.parse_args(argv)
  schemes = flags.split_list(args.methods, allowed=SCHEMES, flag="--methods")
  if BASELINE not in schemes:
    raise SystemExit(f"--methods must include the baseline {BASELINE!r}")
  grid = SMOKE_GRID if args.smoke else dict(
      depths=flags.split_list(args.depths, int, flag="--depths"), lrs=flags.split_list(args.lrs, float, flag="--lrs"),
      warmups=flags.split_list(args.warmups, int, flag="--warmups"),
      tune_seeds=flags.split_list(args.tune_seeds, int, flag="--tune-seeds"),
      pilot_seeds=flags.split_list(args.pilot_seeds, int, flag="--pilot-seeds"))
  depths, lrs, warmups = list(grid["depths"]), list(grid["lrs"]), list(grid["warmups"])
  tune_seeds, pilot_seeds = list(grid["tune_seeds"]), list(grid["pilot_seeds"])
  if len(pilot_seeds) < 2 or min(pilot_seeds) < MAX_SEEDS or set(pilot_seeds) & set(tune_seeds):
    raise SystemExit(f"--pilot-seeds: at least 2, none a tuning seed or a final seed (< {MAX_SEEDS})")
  if min(tune_seeds) < MAX_SEEDS:
    raise SystemExit(f"--tune-seeds: none may be a final seed (< {MAX_SEEDS})")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(sets={**(SMOKE if args.smoke else {}), **flags.parse_sets(args.set)}, corpus=args.corpus,
                config=CONFIG, data_dir=os.path.join(workdir, "_data"), smoke=args.smoke)
  common["config_digest"] = flags.config_digest(lm_comparison.base_config(common))  # a bad --set fails here
  same = {k: common[k] for k in ("sets", "corpus", "config_digest", "smoke")}
  plan = comparison_plan(schemes, depths)

  if args.stage == "timing":
    lm_comparison.prepare_corpus(workdir, common)
    n_tune = len(lrs) * len(warmups) * len(tune_seeds)
    counts = {stage: {key_of(s, d): n for s in schemes for d in depths}
              for stage, n in (("tune", n_tune), ("pilot", len(pilot_seeds)), ("main_at_max_seeds", MAX_SEEDS))}
    measured = timing(schemes, depths, args.timing_steps, workdir, common, counts)
    results.write_json(os.path.join(out, "timing.json"), measured)
    print(json.dumps({k: v for k, v in measured.items() if k != "runs"}, indent=1))
    return

  keep = None if args.smoke or args.report_only else args.keep_runs
  if not args.smoke:
    runner.import_kept(args.keep_runs, workdir)

  def train(runs, report_only=args.report_only, strict=False):
    return runner.finished_or_trained(runs, lm_comparison.train_one, workdir, args.jobs, report_only, same,
                                      lambda s: f"{outcome(s)} val {s['validation_loss']:.4f}",
                                      before_training=lambda: lm_comparison.prepare_corpus(workdir, common),
                                      strict=strict, after_each=None if keep is None else (
                                          lambda summary: results.copy_run_files(workdir, [summary], keep)))

  main_stage = args.stage == "main" and not args.smoke
  strict = main_stage and not args.report_only  # it trains the final runs after reading the pilot's: one config
  if main_stage:  # the pilot's file first: the main stage trains nothing before it is read and matches
    fixed = results.read_pilot(args.pilot, "tunes lr and warm-up and fixes N")
    grid_now = dict(schemes=schemes, depths=depths, lrs=lrs, warmups=warmups, tune_seeds=tune_seeds)
    if {k: fixed[k] for k in grid_now} != grid_now:
      raise SystemExit(f"{args.pilot}: made for { {k: fixed[k] for k in grid_now} }, not {grid_now}")
    if strict:
      runner.refuse_other_digests(fixed["runs"], same, args.pilot)
  tuning = train(tune_runs(schemes, depths, lrs, warmups, tune_seeds, common),
                 report_only=args.report_only or main_stage, strict=strict)
  runner.require_grid_finished(
      "tuning", tuning, len(schemes) * len(depths) * len(lrs) * len(warmups) * len(tune_seeds),
      f" in {workdir}; run --stage pilot (again: it resumes)")
  best, tuning_table = select(tuning, schemes, depths, lrs, warmups)
  print("tuned (lr, warm-up):", {k: (v["lr"], v["warmup_steps"]) for k, v in best.items()}, flush=True)
  if args.stage == "pilot" or args.smoke:
    pilot = train(seed_runs("pilot", best, pilot_seeds, common))
    runner.require_grid_finished("pilot", pilot, len(best) * len(pilot_seeds), "; run the stage again (it resumes)")
    estimate = power(pilot, depths, len(plan))
    path = os.path.join(out, "pilot.json") if args.smoke else args.pilot
    results.write_json(path, dict(power=estimate, schemes=schemes, depths=depths, lrs=lrs, warmups=warmups,
                                  tune_seeds=tune_seeds, best=best, tuning=tuning_table,
                                  stability=stability_table(tuning, schemes, depths),
                                  runs=[compact(r) for r in tuning + pilot]),
                       tuning + pilot)
    if not args.smoke:
      results.copy_run_files(workdir, tuning + pilot, os.path.join(os.path.dirname(path), "pilot_runs"))
    print(f"pilot: N = {estimate['n']} (80% power needs {estimate['n_for_80_power']}; {path})", flush=True)
    if not args.smoke:
      return
  if args.smoke:
    n, estimate = SMOKE_GRID["n"], estimate
    how = "smoke run: 2 seeds (a check that the pipeline runs; no conclusions)"
  else:
    estimate, n = fixed["power"], fixed["power"]["n"]
    if fixed["best"] != best:
      raise SystemExit(f"{args.pilot}: its tuned settings are not those of the tuning runs in {workdir} (another "
                       "workdir?); the main stage runs at the pilot's")
    how = (f"N = {n} fixed before the main runs by the pilot's power estimate ({os.path.relpath(args.pilot)}: 80% "
           f"power for {TARGET} nats of validation loss, siamese_post_pre - pre, paired t at alpha "
           f"{estimate['alpha']:.2g} (0.05 / the {len(plan)} comparisons), from the pilot's largest paired sd)")
  seeds = list(range(n))
  final = train(seed_runs("final", best, seeds, common))
  comps = comparisons(final, tuning, plan)
  payload = dict(
      design=dict(stages=STAGES, margin=MARGIN,
                  summary="mean ± sample std (n)"),
      schemes=schemes, depths=depths, lrs=lrs, warmups=warmups, tune_seeds=tune_seeds, reported_seeds=seeds,
      sets=common["sets"], best=best, tuning=tuning_table, stability=stability_table(tuning, schemes, depths),
      power=estimate, final=final_table(final, schemes, depths), comparisons=comps,
      statistics=stats.statistics(comps, how), claims=claims(comps),
      config=lm_comparison.base_config(common).to_dict(),
      provenance=results.provenance(tuning + final, os.path.join(HERE, "run.py")))
  results.write_json(os.path.join(out, "results.json"), payload, tuning + final, report_only=args.report_only)
  results.copy_run_files(workdir, tuning + final, out)
  plot(payload, out)
  results.write_markdown(out, "Stability with depth: Pre/Post/HybridNorm, SiameseNorm, mHC-lite (CPU)",
                         markdown(payload), "Plot: `depth_sweep.png`.", os.path.join(HERE, "discussion.md"))
  print(f"results in {out}")


if __name__ == "__main__":
  main()
