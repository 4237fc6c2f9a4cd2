"""The design the scheme comparisons share (`lm_comparison`, `image_comparison`): every scheme x lr x tuning seed,
each scheme's lr chosen on a validation number, then every scheme at its lr x the reported seeds; one colour per
scheme in every plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from experiments.toolkit import flags, stats


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What every scheme comparison fixes (`lm_comparison.Experiment` and `image_comparison.Experiment` add theirs).

  Attributes:
    doc: the experiment's run.py docstring (its --help text).
    here: the experiment's folder (its discussion.md is read from there).
    config: module path of its config file (`get_config()`: the run config every run starts from).
    title: the results' title.
    schemes: the schemes compared, in table order.
    comparisons: the (A, B) scheme pairs whose paired per-seed difference of the test metric is reported; or a
      function of the run's schemes giving them (so --methods may name schemes outside `schemes`).
    lrs, tune_seeds, seeds: the default lr grid, tuning seeds and reported seeds.
    workdir: the default --workdir.
  """

  doc: str
  here: str
  config: str
  title: str
  schemes: tuple[str, ...]
  comparisons: tuple[tuple[str, str], ...] | Callable[[tuple[str, ...]], tuple[tuple[str, str], ...]]
  lrs: tuple[float, ...]
  tune_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  workdir: str

  def pairs(self, schemes) -> list[tuple[str, str]]:
    """The comparisons whose both schemes are among `schemes` (the ones run)."""
    schemes = tuple(schemes)
    pairs = self.comparisons(schemes) if callable(self.comparisons) else self.comparisons
    return [(a, b) for a, b in pairs if a in schemes and b in schemes]


def parser(doc: str, schemes, seeds, workdir: str, lrs, tune_seeds, phases: Sequence[str]) -> argparse.ArgumentParser:
  """`flags.parser` + --phases, --lrs (the tuning grid) and --tune-seeds, with these defaults."""
  p = flags.parser(doc, methods=schemes, seeds=seeds, workdir=workdir)
  p.add_argument("--phases", default=",".join(phases), help=f"comma-separated subset of {','.join(phases)}")
  p.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in lrs), help="the tuning grid of lrs")
  p.add_argument("--tune-seeds", default=",".join(map(str, tune_seeds)), help="tuning runs' seeds")
  return p


def parse_args(p: argparse.ArgumentParser, argv, phases: Sequence[str]) -> argparse.Namespace:
  """The parsed flags with args.phases, seeds, tune_seeds and lrs as lists; the reported seeds must not be tuning
  seeds."""
  args = p.parse_args(argv)
  args.phases = flags.split_list(args.phases, allowed=phases, flag="--phases")
  args.seeds = flags.split_list(args.seeds, int, flag="--seeds")
  args.tune_seeds = flags.split_list(args.tune_seeds, int, flag="--tune-seeds")
  args.lrs = flags.split_list(args.lrs, float, flag="--lrs")
  if set(args.seeds) & set(args.tune_seeds):
    raise SystemExit("--seeds and --tune-seeds overlap: the reported runs must not be the ones lr was chosen on")
  return args


def scheme_color(scheme: str, schemes) -> str:
  import matplotlib

  palette = matplotlib.colormaps["tab10" if len(schemes) <= 10 else "tab20"]
  return matplotlib.colors.to_hex(palette(list(schemes).index(scheme) % palette.N))


def tune_runs(schemes, lrs, tune_seeds, common: dict) -> list[dict]:
  return [dict(common, name=f"tune/{s}/lr{lr:g}/seed{seed}", phase="tune", scheme=s, lr=lr, seed=seed)
          for seed in tune_seeds for lr in lrs for s in schemes]


def final_runs(schemes, best_lr: dict, seeds, common: dict, per_seed: Callable[[int], dict] = lambda seed: {}
               ) -> list[dict]:
  """Every scheme at its tuned lr x `seeds`; `per_seed(seed)` adds fields to that seed's runs."""
  return [dict(common, name=f"final/{s}/lr{best_lr[s]:g}/seed{seed}", phase="final", scheme=s, lr=best_lr[s],
               seed=seed, **per_seed(seed)) for seed in seeds for s in schemes]


def select_lrs(summaries: list[dict], schemes, lrs, tune_seeds, column: str, name: str = "",
               higher_is_better: bool = False) -> tuple[dict, list[dict]]:
  """({scheme: the lr whose mean `column` over the tuning runs is best}, the tuning table: one row per scheme and lr
  with that summary under `name` (default `column`)). A non-finite value counts as the worst possible."""
  worst = -math.inf if higher_is_better else math.inf
  table, best = [], {}
  for scheme in schemes:
    rows = []
    for lr in lrs:
      values = [s[column] for s in summaries if s["scheme"] == scheme and s["lr"] == lr]
      values = [v if v is not None and math.isfinite(v) else worst for v in values]
      rows.append({"scheme": scheme, "lr": lr, name or column: stats.summary(values), "seeds": list(tune_seeds)})
    mean = lambda r: r[name or column]["mean"]
    chosen = (max if higher_is_better else min)(rows, key=lambda r: mean(r) if not math.isnan(mean(r)) else worst)
    best[scheme] = chosen["lr"]
    for r in rows:
      r["chosen"] = r is chosen
      r["at_grid_edge"] = r is chosen and r["lr"] in (min(lrs), max(lrs))
    table += rows
  return best, table


def tuning_markdown(tuning: list[dict], schemes, lrs, name: str, digits: int = 3) -> list[str]:
  """The tuning table: one row per scheme, 'mean ± std (n)' of `name` per lr, and the chosen lr."""
  lines = ["| scheme | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen |", "|---|" + "---:|" * (len(lrs) + 1)]
  for scheme in schemes:
    rows = [r for r in tuning if r["scheme"] == scheme]
    chosen = next(r for r in rows if r["chosen"])
    edge = " (grid edge)" if chosen["at_grid_edge"] else ""
    cells = " | ".join(stats.fmt(r[name], digits) for r in rows)
    lines.append(f"| {scheme} | {cells} | {chosen['lr']:g}{edge} |")
  return lines


def plot_tuning(ax, tuning: list[dict], name: str, schemes) -> None:
  """Mean ± std of `name` against lr (log axis), one line per scheme."""
  for scheme in dict.fromkeys(r["scheme"] for r in tuning):
    rows = [r for r in tuning if r["scheme"] == scheme]
    ax.errorbar([r["lr"] for r in rows], [r[name]["mean"] for r in rows], yerr=[r[name]["std"] for r in rows],
                color=scheme_color(scheme, schemes), marker="o", label=scheme, capsize=3)
  ax.set(xscale="log", xlabel="peak learning rate")


def plot_band(ax, curves: list[list[tuple[float, float]]], color: str, label: str) -> None:
  """The mean over runs of (step, value) curves (cut to the shortest) with a min-max band."""
  curves = [c for c in curves if c]
  if not curves:
    return
  n = min(len(c) for c in curves)
  steps = [p[0] for p in curves[0][:n]]
  values = np.array([[p[1] for p in c[:n]] for c in curves])
  ax.plot(steps, values.mean(0), color=color, label=label)
  ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.15, lw=0)


def save_figure(fig, axes, path: str) -> None:
  """Grid and legend on every axis of `axes`, tight layout, `path` at 110 dpi; closes `fig`."""
  import matplotlib.pyplot as plt

  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
