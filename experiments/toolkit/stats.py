"""Summary and paired statistics over seeds, one convention for every experiment.

- `summary(values)`: mean ± sample standard deviation (ddof = 1) over n values, written "mean ± std (n)".
- `paired(a, b)`: a and b are per-seed values of two methods on the same seeds (same data order and init seed),
  d_i = a_i - b_i. Reported at every n:
  - the mean and sample std of d and the 95% Student t interval of mean(d): mean(d) ± t_{0.975, n-1} std(d) /
    sqrt(n) (`ci95`, `ci_method` "t");
  - the paired t statistic t = mean(d) / (std(d) / sqrt(n)) with its two-sided p from Student's t with n - 1
    degrees of freedom (`p_t`);
  - the two-sided sign-flip (permutation) p, the share of the 2^n sign patterns s whose |mean(s * d)| >= |mean(d)|,
    which assumes only that d is symmetric about 0 under the null (`p_sign_flip`). A zero d_i flips to itself, so
    only the m nonzero differences count: where they share one magnitude (0/1 outcomes paired, d in {-1, 0, 1}:
    k_a of +1, k_b of -1) the share is exactly the two-sided binomial p, P(|2X - m| >= |k_a - k_b|) with
    X ~ Binomial(m, 1/2) (the exact McNemar test), at any n; otherwise exact enumeration of the 2^m patterns up to
    m = SIGN_FLIP_EXACT_MAX_N, beyond that a Monte Carlo estimate from SIGN_FLIP_SAMPLES random patterns with a
    fixed seed (`sign_flip_method` says which, `sign_flip_exact` whether it is exact); its smallest possible value
    2 / 2^m (`min_p_sign_flip`; so 3 seeds can never give p < 0.25);
  - only at n >= BOOTSTRAP_MIN_N, beside them, a 95% percentile bootstrap interval of mean(d) (`bootstrap_ci95`;
    10,000 resamples of the n pairs, fixed seed). Below that it is too narrow (it ignores the t quantile and
    the sd's own uncertainty) and is not reported at all.
- `holm(ps)`: Holm's step-down adjustment of a family of p values (controls the family-wise error rate);
  `holm_adjust(comparisons)` adds `p_t_holm` and `p_sign_flip_holm` to each of an experiment's comparisons, the
  family being every paired comparison that experiment reports (`MULTIPLICITY`).
- Power of the two-sided paired t test at level alpha (issue 31 item 2), exact through the noncentral t: with
  n pairs, paired-difference sd and true mean difference `effect`, T ~ t'(df = n - 1, nc = effect / sd * sqrt(n))
  and power = P(|T| > t_{1 - alpha / 2, n - 1}) (`paired_power`); `paired_n_for_power` is the smallest n >= 2
  reaching a power, `detectable_effect` the smallest |effect| n pairs detect with that power. sd is a pilot's
  sample sd, so these are estimates that inherit its uncertainty.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_MIN_N = 20  # the percentile bootstrap interval is reported (beside the t interval) only from here on
SIGN_FLIP_EXACT_MAX_N = 16  # 65,536 patterns; beyond that a fixed random sample of patterns
SIGN_FLIP_SAMPLES = 200_000
SIGN_FLIP_METHODS = ("binomial", "enumeration", "monte carlo")  # `sign_flip_method`; the first two are exact
INTERVAL_METHOD = ("95% Student t interval of the mean paired difference (n - 1 degrees of freedom); paired t "
                   "test p and two-sided sign-flip p (exact enumeration of the 2^n sign patterns up to n = "
                   f"{SIGN_FLIP_EXACT_MAX_N}, Monte Carlo with {SIGN_FLIP_SAMPLES:,} patterns and a fixed seed "
                   f"beyond); a 95% percentile bootstrap interval beside them only at n >= {BOOTSTRAP_MIN_N}")
MULTIPLICITY = ("Holm step-down adjustment (p_t_holm, p_sign_flip_holm) over every paired comparison this "
                "results file reports")


def summary(values: Sequence[float]) -> dict:
  """{'mean', 'std' (sample, ddof = 1; 0 for one value), 'n'}; NaNs for no values."""
  x = np.asarray([v for v in values], np.float64)
  if x.size == 0:
    return dict(mean=math.nan, std=math.nan, n=0)
  return dict(mean=float(x.mean()), std=float(x.std(ddof=1)) if x.size > 1 else 0.0, n=int(x.size))


def fmt(values: Sequence[float] | dict, digits: int = 3) -> str:
  """'mean ± std (n)' of `values` (or of a `summary` dict)."""
  s = values if isinstance(values, dict) else summary(values)
  if not s["n"]:
    return "—"
  return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} ({s['n']})"


def sign_flip_method(d: np.ndarray) -> str:
  """How `sign_flip_p` computes the p of `d` (SIGN_FLIP_METHODS): 'binomial' where the nonzero differences share one
  magnitude, 'enumeration' where at most SIGN_FLIP_EXACT_MAX_N are nonzero, else 'monte carlo'."""
  d = np.asarray(d, np.float64)
  nonzero = np.abs(d[d != 0.0])
  if nonzero.size == 0 or np.all(nonzero == nonzero[0]):
    return "binomial"
  return "enumeration" if nonzero.size <= SIGN_FLIP_EXACT_MAX_N else "monte carlo"


def sign_flip_p(d: np.ndarray) -> float:
  """Two-sided p of the sign-flip test of mean(d) = 0 (module docstring): exact for one magnitude (binomial) or up to
  SIGN_FLIP_EXACT_MAX_N nonzero differences, a fixed-seed Monte Carlo estimate beyond."""
  d = np.asarray(d, np.float64)
  n = d.size
  observed = abs(d.mean())
  method = sign_flip_method(d)
  nonzero = d[d != 0.0]
  if method == "binomial":  # |sum(s * d)| = c |2X - m|, X the number of + signs among the m nonzero d_i
    m, excess = nonzero.size, abs(int(np.sum(nonzero > 0)) - int(np.sum(nonzero < 0)))
    return sum(math.comb(m, x) for x in range(m + 1) if abs(2 * x - m) >= excess) / 2 ** m
  if method == "enumeration":  # a zero d_i flips to itself: the 2^m patterns of the nonzero ones give the same share
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=nonzero.size)))
    means = np.abs(signs @ nonzero) / n
  else:
    signs = np.random.default_rng(0).choice((1.0, -1.0), size=(SIGN_FLIP_SAMPLES, n))
    means = np.abs(signs @ d) / n
  return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def t_test_p(d: np.ndarray) -> tuple[float, float]:
  """(t, two-sided p) of the paired t test; (nan, nan) for n < 2, (±inf, 0) for a nonzero constant d."""
  from scipy import stats

  d = np.asarray(d, np.float64)
  n = d.size
  if n < 2:
    return math.nan, math.nan
  std = d.std(ddof=1)
  if std == 0.0:
    return (0.0, 1.0) if d.mean() == 0.0 else (math.copysign(math.inf, d.mean()), 0.0)
  t = d.mean() / (std / math.sqrt(n))
  return float(t), float(2.0 * stats.t.sf(abs(t), df=n - 1))


def t_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float]:
  """Student t interval of mean(d): mean ± t_{(1 + level) / 2, n - 1} * std / sqrt(n); (nan, nan) for n < 2."""
  from scipy import stats

  d = np.asarray(d, np.float64)
  n = d.size
  if n < 2:
    return math.nan, math.nan
  half = stats.t.ppf((1.0 + level) / 2.0, df=n - 1) * d.std(ddof=1) / math.sqrt(n)
  return float(d.mean() - half), float(d.mean() + half)


def bootstrap_ci(d: np.ndarray, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
  """Percentile bootstrap interval of mean(d) (reported by `paired` only at n >= BOOTSTRAP_MIN_N)."""
  d = np.asarray(d, np.float64)
  rng = np.random.default_rng(seed)
  means = d[rng.integers(0, d.size, size=(BOOTSTRAP_RESAMPLES, d.size))].mean(axis=1)
  tail = (1.0 - level) / 2.0
  return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
  """Paired statistics of a - b over seeds (module docstring); a[i] and b[i] share seed i."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f"paired: need two equal-length 1-D sequences, got shapes {a.shape} and {b.shape}")
  d = a - b
  t, p_t = t_test_p(d)
  out = dict(n=int(d.size), mean_diff=float(d.mean()) if d.size else math.nan,
             std_diff=float(d.std(ddof=1)) if d.size > 1 else math.nan, t=t, p_t=p_t,
             ci95=list(t_interval(d)), ci_method="t",
             p_sign_flip=sign_flip_p(d) if d.size else math.nan, sign_flip_method=sign_flip_method(d),
             sign_flip_exact=sign_flip_method(d) != "monte carlo",
             min_p_sign_flip=min(1.0, 2.0 / 2 ** int(np.count_nonzero(d))),
             wins=int(np.sum(d < 0)), losses=int(np.sum(d > 0)))
  if d.size >= BOOTSTRAP_MIN_N:
    out["bootstrap_ci95"] = list(bootstrap_ci(d))
  return out


def paired_power(sd: float, effect: float, n: int, alpha: float = 0.05) -> float:
  """Power of the two-sided paired t test at level `alpha` with n pairs (module docstring); nan for n < 2."""
  from scipy import stats

  if n < 2:
    return math.nan
  if sd <= 0.0:
    return 1.0 if effect != 0.0 else alpha
  df = n - 1
  crit = stats.t.ppf(1.0 - alpha / 2.0, df)
  nc = abs(effect) / sd * math.sqrt(n)
  # P(T < -crit) as the upper tail at -nc (scipy's nct.cdf can return nan far in the lower tail)
  return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))


def paired_n_for_power(sd: float, effect: float, power: float = 0.8, alpha: float = 0.05) -> int | float:
  """The smallest n >= 2 whose two-sided paired t test at `alpha` has at least `power` for a true mean difference
  `effect` given the paired-difference sd (exact, noncentral t); inf for effect 0."""
  if effect == 0.0 or math.isnan(effect) or math.isnan(sd):
    return math.inf
  if paired_power(sd, effect, 2, alpha) >= power:
    return 2
  high = 4
  while paired_power(sd, effect, high, alpha) < power:  # power increases with n
    high *= 2
  low = high // 2  # power(low) < power <= power(high)
  while high - low > 1:
    mid = (low + high) // 2
    if paired_power(sd, effect, mid, alpha) >= power:
      high = mid
    else:
      low = mid
  return high


def detectable_effect(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
  """The smallest |mean difference| that n pairs with paired-difference sd detect with `power` by the two-sided
  paired t test at `alpha` (the root of `paired_power` = power in the effect); nan for n < 2."""
  from scipy import optimize

  if n < 2 or math.isnan(sd):
    return math.nan
  if sd <= 0.0:
    return 0.0
  high = sd
  while paired_power(sd, high, n, alpha) < power:
    high *= 2.0
  return float(optimize.brentq(lambda e: paired_power(sd, e, n, alpha) - power, 0.0, high, xtol=1e-14 * high,
                               rtol=1e-12))


def holm(ps: Sequence[float]) -> list[float]:
  """Holm-adjusted p values, in the order of `ps`: the k-th smallest (k = 0, 1, ...) p becomes
  max over j <= k of min(1, (m - j) * p_(j)); a NaN p stays NaN and does not count in m."""
  ps = [float(p) if p is not None else math.nan for p in ps]
  valid = [i for i, p in enumerate(ps) if not math.isnan(p)]
  m = len(valid)
  adjusted = [math.nan] * len(ps)
  running = 0.0
  for rank, i in enumerate(sorted(valid, key=lambda i: ps[i])):
    running = max(running, min(1.0, (m - rank) * ps[i]))
    adjusted[i] = running
  return adjusted


def holm_adjust(comparisons: list[dict]) -> list[dict]:
  """Adds `p_t_holm` and `p_sign_flip_holm` (Holm over all of `comparisons`, one family) to each; returns them."""
  for key in ("p_t", "p_sign_flip"):
    for c, p in zip(comparisons, holm([c[key] for c in comparisons])):
      c[f"{key}_holm"] = p
  return comparisons


def fmt_paired(s: dict, digits: int = 3) -> str:
  """'-0.046 [t 95%: -0.110, +0.020], t = -1.2, p_t = 0.30 (Holm 0.90), sign-flip p = 0.38 (Holm 1; min 0.0078),
  n = 8' (+ '; bootstrap 95% [...]' at n >= BOOTSTRAP_MIN_N)."""
  def p(key):
    value = s.get(key)
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"

  def x(value):
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:+.{digits}f}"

  holm_t = f" (Holm {p('p_t_holm')})" if "p_t_holm" in s else ""
  t = "—" if s["t"] is None or math.isnan(s["t"]) else f"{s['t']:.2f}"
  holm_sf = f"Holm {p('p_sign_flip_holm')}; " if "p_sign_flip_holm" in s else ""
  text = (f"{x(s['mean_diff'])} [t 95%: {x(s['ci95'][0])}, {x(s['ci95'][1])}], "
          f"t = {t}, p_t = {p('p_t')}{holm_t}, sign-flip p = {p('p_sign_flip')} "
          f"({holm_sf}min {s['min_p_sign_flip']:.2g}), n = {s['n']}")
  if s.get("bootstrap_ci95"):
    text += f"; bootstrap 95% [{x(s['bootstrap_ci95'][0])}, {x(s['bootstrap_ci95'][1])}]"
  return text


PAIRED_NOTE = ("mean [95% Student t interval], paired t and its p, sign-flip p (Holm-adjusted p beside each, over "
               "every paired comparison of this report; 'min': the smallest sign-flip p the pairs can reach, 2 / 2^m "
               "for m nonzero differences; exact, except a Monte Carlo estimate beyond "
               f"{SIGN_FLIP_EXACT_MAX_N} nonzero differences of unequal size)")
SIGN_FLIP_NOTE = ("sign-flip p over the nonzero paired differences (zeros flip to themselves): the exact binomial p "
                  "where they share one magnitude (0/1 outcomes: the exact McNemar test on the discordant pairs) at "
                  f"any n; else exact enumeration up to {SIGN_FLIP_EXACT_MAX_N} of them, Monte Carlo beyond "
                  "(`sign_flip_method` per comparison)")
N_NOT_POWERED = ("the reported seeds are the experiment's defaults, set before its final runs; N was not computed "
                 "by a power analysis (issue 31 item 2)")


def statistics(comparisons: list[dict], how_n_fixed: str = N_NOT_POWERED) -> dict:
  """The `statistics` entry of a results file: n (per comparison), how N was fixed, the interval method and the
  multiplicity correction over `comparisons` (which `holm_adjust` has adjusted)."""
  return dict(n=sorted({c["n"] for c in comparisons}), n_fixed=how_n_fixed, interval=INTERVAL_METHOD,
              sign_flip=SIGN_FLIP_NOTE, multiplicity=f"{MULTIPLICITY} ({len(comparisons)} comparisons)")
