"""PNG figures for a run's workdir: the `loss.png` curve, the reward model's `score_vs_length.png` and an RLHF
run's `reward_hacking.png`.

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


def plot_reward_hacking(rows: Iterable[Mapping], path: str) -> str:
  """An RLHF run's metrics rows against step: the reward model's score (`rm_score`) and the gold (verifier) score
  (`gold_score`) on the left axis, the mean response length (`response_length`, tokens) on the right: a reward
  model being hacked shows its score rising while the gold score falls or stalls."""
  rows = list(rows)
  fig = Figure(figsize=(6, 4))
  ax = fig.add_subplot()
  for key in ("rm_score", "gold_score"):
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if points:
      ax.plot(*zip(*points), "-", label=key)
  ax.set_xlabel("step")
  ax.set_ylabel("score")
  ax.grid(alpha=0.3)
  lengths = [(r["step"], r["response_length"]) for r in rows if r.get("response_length") is not None]
  handles, labels = ax.get_legend_handles_labels()
  if lengths:
    right = ax.twinx()
    (line,) = right.plot(*zip(*lengths), "--", color="grey", label="response_length")
    right.set_ylabel("response length (tokens)")
    handles, labels = handles + [line], labels + ["response_length"]
  if handles:
    ax.legend(handles, labels, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return path
