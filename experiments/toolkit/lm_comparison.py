"""Residual schemes compared as language models, each at its own validation-tuned learning rate (shared by
`experiments/siamese_vs_prenorm` and `experiments/residual_schemes_lm`).

Three phases, each a grid of `jaxpt.train("pretrain", ...)` runs of one config (`Experiment.config`), on one corpus:
1. tune:  every scheme x lr x the tuning seeds. Each scheme's lr is the one with the lowest mean final
          *validation* loss (the held-out rows the run evaluates every eval_every steps); the test rows are not
          looked at.
2. final: every scheme at its tuned lr x the reported seeds (disjoint from the tuning seeds). Reported: the final
          *test* loss (held-out rows after the validation rows, from the first that starts a new paragraph);
          paired per-seed statistics (same seed = same data order and init seed) for `Experiment.comparisons`.
3. depth: every scheme at its tuned lr at the `Experiment.depths`, seed 0; with seed 0 of the final runs: the
          gradient norm reaching each block and the residual-stream norm by depth, at init and after training
          (`experiments.toolkit.probes`, on the first validation batch).

A scheme is written `norm_scheme[:n][+moe][@layers]`: n = model.hc_streams (the multi-stream schemes), `+moe`
replaces every MLP with MOE_EXPERTS experts of half the width, top-MOE_TOP_K routed (the same active MLP FLOPs),
`@layers` sets model.num_layers (else the config's). A run dict may also set `num_layers` and `warmup_steps`
(`experiments/depth_sweep`: depth and warm-up are grid axes there).

Every run records, beside its losses, its logged gradient norms (`grad_norm_summary`: the global norm before
clipping, as metrics.jsonl has it) and the unigram loss of the corpus (`unigram_loss`: the validation loss of a
model that ignores context, the line a run that learned nothing from context stays above).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os

import numpy as np

import jaxpt

from experiments.toolkit import flags, results, runner, stats
from experiments.toolkit import tuning as tuning_lib
from experiments.toolkit.tuning import final_runs, scheme_color, tune_runs  # noqa: F401 (this module's API)

PHASES = ("tune", "final", "depth")
DATA_LINKS = ("tfds", "tokenizer", "data")  # the data layer's caches inside a workdir
MOE_EXPERTS = 8
MOE_TOP_K = 2


@dataclasses.dataclass(frozen=True)
class Experiment(tuning_lib.Comparison):
  """What one LM comparison fixes (`tuning.Comparison`: its schemes are `norm_scheme[:n][+moe][@layers]` and its
  comparisons pair test losses); `main` runs it.

  Attributes:
    depths: the probe depths.
    corpus: the default data.path.
  """

  depths: tuple[int, ...]
  corpus: str


def parse_scheme(scheme: str) -> dict:
  """'hc:4+moe@24' -> {'norm_scheme': 'hc', 'hc_streams': 4, 'moe': True, 'num_layers': 24}."""
  rest, _, layers = scheme.partition("@")
  rest, _, moe = rest.partition("+")
  name, _, streams = rest.partition(":")
  if moe not in ("", "moe"):
    raise ValueError(f"scheme {scheme!r}: the only suffix is +moe")
  out = dict(norm_scheme=name, moe=bool(moe))
  if streams:
    out["hc_streams"] = int(streams)
  if layers:
    out["num_layers"] = int(layers)
  return out


def depth_runs(schemes, best_lr: dict, depths, common: dict) -> list[dict]:
  return [dict(common, name=f"depth{layers}/{s}/lr{best_lr[s]:g}/seed0", phase="depth", scheme=s, lr=best_lr[s],
               seed=0, num_layers=layers) for layers in depths for s in schemes]


def base_config(run: dict):
  """The experiment's config with the --set overrides."""
  return flags.apply_sets(importlib.import_module(run["config"]).get_config(), run["sets"])


def make_config(run: dict):
  """The experiment's config with the --set overrides, then this run's scheme (`parse_scheme`), lr, seed, depth
  (a depth run's `num_layers` wins over the scheme's @layers) and corpus."""
  config = base_config(run)
  scheme = parse_scheme(run["scheme"])
  config.model.norm_scheme = scheme["norm_scheme"]
  if "hc_streams" in scheme:
    config.model.hc_streams = scheme["hc_streams"]
  if scheme["moe"]:
    config.model.num_experts, config.model.experts_per_token = MOE_EXPERTS, MOE_TOP_K
    config.model.mlp_dim //= MOE_TOP_K
  config.model.num_layers = run.get("num_layers") or scheme.get("num_layers") or config.model.num_layers
  if run.get("warmup_steps") is not None:
    config.optim.warmup_steps = run["warmup_steps"]
  config.optim.learning_rate = run["lr"]
  config.seed = run["seed"]
  config.data.path = run["corpus"]
  return config


# ----------------------------------------------------------------------------------------------- training


def prepare_corpus(workdir: str, common: dict) -> str:
  """Builds the TFDS source, tokenizer and packed rows once; returns the directory holding them."""
  from jaxpt.data.pipeline import LMData

  directory = os.path.join(workdir, "_data")
  config = make_config(dict(common, scheme="pre", lr=1e-3, seed=0))
  LMData.create(config.data, vocab_size=config.model.vocab_size, workdir=directory, seed=0)
  return directory


def test_batches(data) -> list[dict]:
  """The test rows (config.py's docstring) in batches of data.batch_size (a last partial batch is dropped)."""
  from jaxpt.data import packing

  tokens, segments = data.held_out_rows()
  batch = data.config.batch_size
  first = data.config.eval_batches * batch
  while first < len(tokens) and tokens[first - 1, -1] != data.tokenizer.eos_id:
    first += 1  # the previous row's paragraph continues here: skip to the next paragraph start
  count = (len(tokens) - first) // batch
  if count < 1:
    raise ValueError(f"no test rows after the {first} validation rows: raise data.eval_fraction")
  return [packing.make_batch(tokens[first + i * batch:first + (i + 1) * batch],
                             segments[first + i * batch:first + (i + 1) * batch]) for i in range(count)]


def probe(model_config, params, batch) -> dict:
  from experiments.toolkit import probes

  return dict(block_grad_norms=probes.block_gradient_norms(model_config, params, batch).tolist(),
              stream_norms=probes.stream_norms(model_config, params, batch).tolist())


def unigram_loss(train_tokens: np.ndarray, train_segments: np.ndarray, batches: list[dict], vocab_size: int) -> float:
  """The token-weighted cross-entropy on `batches` of the add-one unigram model of the training rows:
  p(v) = (c_v + 1) / (C + V), c_v the count of token v in the rows' non-padding positions (segment > 0), C their
  total, V = vocab_size; loss = -sum_i w_i log p(target_i) / sum_i w_i over the batches' targets and weights."""
  counts = np.bincount(np.asarray(train_tokens)[np.asarray(train_segments) > 0], minlength=vocab_size)
  log_p = np.log(counts + 1.0) - np.log(counts.sum() + float(vocab_size))
  nll = sum(float(-(log_p[b["targets"]] * b["weights"]).sum()) for b in batches)
  return nll / sum(float(b["weights"].sum()) for b in batches)


def grad_norm_summary(rows: list[dict]) -> dict:
  """From metrics.jsonl rows (each a mean over its log_every steps): the first, last and largest logged global
  gradient norm and their mean over the run; inf where a logged one is not finite; NaNs when none was logged."""
  norms = np.asarray([r["grad_norm"] for r in rows if "grad_norm" in r], np.float64)
  if not norms.size:
    return dict(grad_norm_first=math.nan, grad_norm_last=math.nan, grad_norm_max=math.nan, grad_norm_mean=math.nan)
  finite = bool(np.all(np.isfinite(norms)))
  return dict(grad_norm_first=float(norms[0]), grad_norm_last=float(norms[-1]),
              grad_norm_max=float(norms.max()) if finite else math.inf,
              grad_norm_mean=float(norms.mean()) if finite else math.inf)


def train_one(run: dict, directory: str) -> dict:
  """One pretraining run; -> final validation and test loss, the probes at init and at the end, the gradient-norm
  summary and the corpus's unigram loss (`grad_norm_summary`, `unigram_loss`)."""
  from jaxpt.models.transformer import TransformerLM, param_count
  from jaxpt.trainers.lm import make_lm_evaluator
  from jaxpt.engine.loop import NonFiniteError

  for name in DATA_LINKS:
    link = os.path.join(directory, name)
    if not os.path.lexists(link):
      os.symlink(os.path.join(run["data_dir"], name), link)
  config = make_config(run)
  setup = jaxpt.build("pretrain", config, directory)
  probe_batch = setup.data.eval_batches()[0]
  init_params = setup.training.init_state().params
  train_tokens, train_segments = setup.data.train_rows()
  summary = dict(probe_init=probe(setup.config.model, init_params, probe_batch), params=param_count(init_params),
                 vocab_size=setup.config.model.vocab_size,
                 unigram_loss=unigram_loss(train_tokens, train_segments, setup.data.eval_batches(),
                                           setup.config.model.vocab_size))
  try:
    result = jaxpt.train("pretrain", config, directory, built=setup)
  except NonFiniteError as e:  # diverged: recorded as such (infinite losses), not retried
    return dict(summary, validation_loss=math.inf, test_loss=math.inf, nonfinite_step=e.step, probe_final=None,
                **grad_norm_summary(results.read_metrics(directory)))
  runner.require_finished(result, directory)
  batches = test_batches(setup.data)
  test = make_lm_evaluator(TransformerLM(setup.config.model), batches)(result.state)
  rows = results.read_metrics(directory)
  evals = [r for r in rows if "eval_loss" in r]
  summary.update(validation_loss=evals[-1]["eval_loss"], test_loss=float(test["eval_loss"]),
                 test_tokens=int(sum(b["weights"].sum() for b in batches)),
                 probe_final=probe(setup.config.model, result.state.params, probe_batch), **grad_norm_summary(rows))
  return summary


def diverged(summary: dict) -> bool:
  """Non-finite validation/test loss, or final validation loss above ln(vocab) (a uniform predictor)."""
  values = (summary["validation_loss"], summary["test_loss"])
  return not all(math.isfinite(v) for v in values) or summary["validation_loss"] > math.log(summary["vocab_size"])


# ------------------------------------------------------------------------------------------------ selection


def select_lrs(summaries: list[dict], schemes, lrs, tune_seeds) -> tuple[dict, list[dict]]:
  """({scheme: lr with the lowest mean final validation loss}, the tuning table)."""
  return tuning_lib.select_lrs(summaries, schemes, lrs, tune_seeds, "validation_loss")


# -------------------------------------------------------------------------------------------------- results


def final_table(summaries: list[dict], schemes, pairs) -> tuple[list[dict], list[dict]]:
  """(per-scheme rows, paired comparisons) of the final runs."""
  by_scheme = {s: sorted((r for r in summaries if r["scheme"] == s), key=lambda r: r["seed"]) for s in schemes}
  rows = [dict(scheme=s, lr=runs[0]["lr"], params=runs[0]["params"], diverged=sum(map(diverged, runs)),
               test_loss=stats.summary([r["test_loss"] for r in runs if not diverged(r)]),
               validation_loss=stats.summary([r["validation_loss"] for r in runs if not diverged(r)]),
               seeds=[r["seed"] for r in runs])
          for s, runs in by_scheme.items() if runs]
  comparisons = []
  for a, b in pairs:
    if by_scheme.get(a) and by_scheme.get(b):
      seeds = sorted({r["seed"] for r in by_scheme[a] if not diverged(r)} &
                     {r["seed"] for r in by_scheme[b] if not diverged(r)})  # pairs where neither diverged
      loss = {k: {r["seed"]: r["test_loss"] for r in by_scheme[k]} for k in (a, b)}
      comparisons.append(dict(a=a, b=b, metric="test_loss", seeds=seeds,
                              **stats.paired([loss[a][i] for i in seeds], [loss[b][i] for i in seeds])))
  return rows, stats.holm_adjust(comparisons)


def depth_table(summaries: list[dict], final: list[dict], schemes) -> list[dict]:
  """Per (depth, scheme): test loss and the probes of seed 0 (seed 0 of the final runs at their own depth)."""
  rows = []
  main = [dict(s, num_layers=len(s["probe_init"]["block_grad_norms"])) for s in final if s["seed"] == 0]
  for s in sorted(summaries + main, key=lambda r: (r["num_layers"], list(schemes).index(r["scheme"]))):
    if s["probe_final"] is None:  # diverged
      rows.append(dict(num_layers=s["num_layers"], scheme=s["scheme"], lr=s["lr"], test_loss=s["test_loss"],
                       diverged=True))
      continue
    grads = {when: s[f"probe_{when}"]["block_grad_norms"] for when in ("init", "final")}
    rows.append(dict(num_layers=s["num_layers"], scheme=s["scheme"], lr=s["lr"], test_loss=s["test_loss"],
                     diverged=False, grad_first_over_last=grads["final"][0] / grads["final"][-1],
                     grad_first_over_last_init=grads["init"][0] / grads["init"][-1],
                     probe_init=s["probe_init"], probe_final=s["probe_final"]))
  return rows


def plot(tuning: list[dict], final: list[dict], depth: list[dict], out: str, workdir: str, schemes) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  tuning_lib.plot_tuning(axes[0], tuning, "validation_loss", schemes)
  axes[0].set(ylabel="final validation loss", title="Tuning: final validation loss by lr")
  for scheme in dict.fromkeys(r["scheme"] for r in final):
    curves = [[(row["step"], row["eval_loss"]) for row in results.read_metrics(runner.run_dir(workdir, r))
               if "eval_loss" in row] for r in final if r["scheme"] == scheme and not diverged(r)]
    tuning_lib.plot_band(axes[1], curves, scheme_color(scheme, schemes), scheme)
  axes[1].set(xlabel="step", ylabel="validation loss", title="Final runs at the tuned lr (mean, min-max band)")
  tuning_lib.save_figure(fig, axes, os.path.join(out, "loss_curves.png"))

  depths = sorted({r["num_layers"] for r in depth})
  fig, axes = plt.subplots(2, len(depths), figsize=(4.2 * len(depths), 7), squeeze=False)
  for j, layers in enumerate(depths):
    for r in (r for r in depth if r["num_layers"] == layers and not r["diverged"]):
      color = scheme_color(r["scheme"], schemes)
      for probe_key, style in (("probe_init", ":"), ("probe_final", "-")):
        grads = r[probe_key]["block_grad_norms"]
        axes[0][j].plot(range(len(grads)), grads, style, color=color,
                        label=r["scheme"] if probe_key == "probe_final" else None)
        norms = np.array(r[probe_key]["stream_norms"])
        for k in range(norms.shape[1]):  # stream 0 (SiameseNorm's x) solid, the others faded
          axes[1][j].plot(range(len(norms)), norms[:, k], style, color=color, alpha=1.0 if k == 0 else 0.45)
    axes[0][j].set(yscale="log", xlabel="block", ylabel="||dL/dθ_block||", title=f"{layers} layers: gradient "
                   "reaching each block")
    axes[1][j].set(yscale="log", xlabel="depth (0 = embedding)", ylabel="mean token ||stream||",
                   title=f"{layers} layers: residual-stream norms")
    for ax in (axes[0][j], axes[1][j]):
      ax.grid(alpha=0.3)
    axes[0][j].legend(fontsize=6)
  fig.suptitle("dotted: at init; solid: after training (seed 0, first validation batch)\nstreams: the first in "
               "full colour (SiameseNorm: x), the others faded (SiameseNorm: y; HC: streams 2..n)", fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "depth_probes.png"), dpi=110)
  plt.close(fig)


def markdown(payload: dict) -> str:
  lines = [payload["provenance"], "", "## Learning rate, tuned on validation", "",
           f"Final validation loss, tuning seeds {payload['design']['tuning_seeds']}.", ""]
  lines += tuning_lib.tuning_markdown(payload["tuning"], payload["schemes"], payload["lrs"], "validation_loss")
  lines += ["", "## Test loss at the tuned lr", "",
            "| scheme | lr | params | test loss (non-diverged seeds) | validation loss | diverged |",
            "|---|---:|---:|---:|---:|---:|"]
  for r in payload["final"]:
    lines.append(f"| {r['scheme']} | {r['lr']:g} | {r['params']:,} | {stats.fmt(r['test_loss'], 4)} | "
                 f"{stats.fmt(r['validation_loss'], 4)} | {r['diverged']}/{len(r['seeds'])} |")
  lines += ["", "Paired by seed, test loss of A minus B (negative: A better): " + stats.PAIRED_NOTE + "; wins/losses "
            "of A.", "",
            "| A | B | difference | wins / losses |", "|---|---|---|---:|"]
  for c in payload["comparisons"]:
    lines.append(f"| {c['a']} | {c['b']} | {stats.fmt_paired(c, 4)} | {c['wins']} / {c['losses']} |")
  if payload["depth"]:
    lines += ["", "## Depth (seed 0, each scheme at its tuned lr)", "",
              "| layers | scheme | test loss | grad first/last block, init | after training |",
              "|---:|---|---:|---:|---:|"]
    for r in payload["depth"]:
      ratios = ("diverged", "") if r["diverged"] else (f"{r['grad_first_over_last_init']:.3g}",
                                                        f"{r['grad_first_over_last']:.3g}")
      lines.append(f"| {r['num_layers']} | {r['scheme']} | {r['test_loss']:.4f} | {ratios[0]} | {ratios[1]} |")
  return "\n".join(lines)


def write_report(experiment: Experiment, args, schemes, common: dict, out: str, tuning_summaries, best_lr, tuning,
                 final_summaries, depth_summaries) -> None:
  workdir = os.path.abspath(args.workdir)
  pairs = experiment.pairs(schemes)
  final, comparisons = final_table(final_summaries, schemes, pairs)
  depth = depth_table(depth_summaries, final_summaries, schemes)
  payload = dict(
      design=dict(selection="each scheme's lr = argmin over LRS of the mean final validation loss of the tuning "
                            "seeds; reported numbers are test losses of the reported seeds",
                  tuning_seeds=args.tune_seeds, reported_seeds=args.seeds,
                  statistic="paired by seed: t interval, t test and exact sign-flip test of the mean test-loss "
                            "difference (`statistics`)", summary="mean ± sample std (n)",
                  divergence="non-finite loss, or final validation loss > ln(vocab)"),
      sets=flags.parse_sets(args.set), schemes=list(schemes), lrs=args.lrs, best_lr=best_lr, tuning=tuning,
      final=final, comparisons=comparisons, statistics=stats.statistics(comparisons), depth=depth,
      config=base_config(common).to_dict(),
      provenance=results.provenance(tuning_summaries + final_summaries + depth_summaries,
                                    os.path.join(experiment.here, "run.py")))
  results.write_json(os.path.join(out, "results.json"), payload,
                     tuning_summaries + final_summaries + depth_summaries, report_only=args.report_only)
  results.copy_run_files(workdir, [s for s in tuning_summaries + final_summaries + depth_summaries], out)
  colours = experiment.schemes + tuple(s for s in schemes if s not in experiment.schemes)  # one colour per scheme
  plot(tuning, final_summaries, depth, out, workdir, colours)
  results.write_markdown(out, experiment.title, markdown(payload), "Plots: `loss_curves.png`, `depth_probes.png`.",
                         os.path.join(experiment.here, "discussion.md"))


# ----------------------------------------------------------------------------------------------------- main


def main(experiment: Experiment, argv=None) -> None:
  """The experiment's command line (`flags.parser` + --phases, --lrs, --tune-seeds, --corpus), its grid, report."""
  parser = tuning_lib.parser(experiment.doc, experiment.schemes, experiment.seeds, experiment.workdir,
                             experiment.lrs, experiment.tune_seeds, PHASES)
  parser.add_argument("--corpus", default=experiment.corpus, help="data.path of every run")
  args = tuning_lib.parse_args(parser, argv, PHASES)
  phases = args.phases
  schemes = flags.split_list(args.methods, flag="--methods")
  for scheme in schemes:
    parse_scheme(scheme)
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(sets=flags.parse_sets(args.set), corpus=args.corpus, config=experiment.config,
                data_dir=os.path.join(workdir, "_data"))
  common["config_digest"] = flags.config_digest(base_config(common))  # a bad --set fails here, before training
  same = {k: common[k] for k in ("sets", "corpus", "config_digest")}  # what finished runs must share

  def grid(runs):
    return runner.finished_or_trained(runs, train_one, workdir, args.jobs, args.report_only,
                                      same, lambda s: f"val {s['validation_loss']:.4f}",
                                      before_training=lambda: prepare_corpus(workdir, common))

  tuning_summaries = grid(tune_runs(schemes, args.lrs, args.tune_seeds, common))
  best_lr, tuning = select_lrs(tuning_summaries, schemes, args.lrs, args.tune_seeds)
  print("tuned lr:", best_lr, flush=True)
  final_summaries = grid(final_runs(schemes, best_lr, args.seeds, common)) if "final" in phases else []
  depth_summaries = grid(depth_runs(schemes, best_lr, experiment.depths, common)) if "depth" in phases else []
  if final_summaries:
    write_report(experiment, args, schemes, common, out, tuning_summaries, best_lr, tuning, final_summaries,
                 depth_summaries)
    print(f"results in {out}")
