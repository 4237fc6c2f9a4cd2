"""PNG figures for a run's workdir: the `loss.png` curve and the reward model's `score_vs_length.png`.

Object-oriented matplotlib only (`Figure` + `Figure.savefig`): no pyplot, no `matplotlib.use`, so drawing here
leaves the global backend (e.g. a notebook's inline one) alone. The library imports this module lazily, inside
the function that writes a PNG, so importing `jaxpt.engine` or `jaxpt.trainers` never imports matplotlib.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from matplotlib.figure import Figure


def plot_loss(rows: Iterable[Mapping], path: str) -> str:
  """Draws train `loss` and `eval_loss` of metrics rows ({step, loss, eval_loss, ...}) against step into `path`."""
  rows = list(rows)
  fig = Figure(figsize=(6, 4))
  ax = fig.add_subplot()
  for key, style in (("loss", "-"), ("eval_loss", "o-")):
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if points:
      ax.plot(*zip(*points), style, label=key, markersize=3)
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  ax.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return path


def plot_score_vs_length(path: str, chosen_scores, rejected_scores, chosen_lengths, rejected_lengths,
                         title: str = "") -> str:
  """Scatter of reward score against response length, chosen and rejected responses in two colours."""
  fig = Figure(figsize=(5, 4))
  ax = fig.add_subplot()
  ax.scatter(chosen_lengths, chosen_scores, s=8, alpha=0.6, label="chosen")
  ax.scatter(rejected_lengths, rejected_scores, s=8, alpha=0.6, label="rejected")
  ax.set_xlabel("response length (tokens)")
  ax.set_ylabel("reward score")
  if title:
    ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return path
