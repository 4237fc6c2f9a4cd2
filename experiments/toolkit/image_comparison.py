"""Residual schemes compared as image models, each at its own validation-tuned learning rate (shared by
`experiments/siamese_vit` (ViT classifiers, `jaxpt vit`) and `experiments/siamese_dit` (class-conditional DiTs,
`jaxpt dit`, scored by an FID-style metric)).

0. classifier (DiT only): one `jaxpt vit` run in WORKDIR/classifier, trained once, whose features every DiT run's
          FID-style metric uses (`jaxpt.trainers.fid`).
1. tune:  every scheme x lr x the tuning seeds. Each scheme's lr is the one with the best mean final *validation*
          metric (`Experiment.metric`: the eval on the validation split at the last step); the test split is not
          looked at.
2. final: every scheme at its tuned lr x the reported seeds (disjoint from the tuning seeds). Reported: the final
          *test* metric; paired per-seed statistics (same seed = same init, data order and draws) of the (A, B)
          pairs in `Experiment.comparisons`; curves of the eval metrics over training; for the ViT, the first
          reported seed's gradient norm reaching each block and residual-stream norm by depth at init and after training
          (`experiments.toolkit.probes`, on the first validation batch); for the DiT, that seed's samples (one row per
          class, the same sampling key for every scheme).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os

import numpy as np

import jaxpt

from experiments.toolkit import flags, results, runner, stats, tuning
from experiments.toolkit.tuning import scheme_color

PHASES = ("tune", "final")
SAMPLE_KEY = 1234  # the DiT samples grid: every scheme draws from PRNGKey(SAMPLE_KEY)
SAMPLES_PER_CLASS = 8
SAMPLES_FILE = "samples.npy"


@dataclasses.dataclass(frozen=True)
class Metric:
  """The reported number: done.json holds test_<key> (reported) and val_<key> (the selection)."""

  key: str            # e.g. "top1": done.json holds test_top1 and val_top1
  label: str          # e.g. "top-1 accuracy"
  higher_is_better: bool
  # the run's metrics.jsonl holds eval_<key> (test split) and eval_val_<key> (validation split)


@dataclasses.dataclass(frozen=True)
class Experiment(tuning.Comparison):
  """What one image comparison fixes (`tuning.Comparison`); `main` runs it.

  Attributes:
    kind: 'vit' or 'dit'.
    metric: the selected-on and reported metric.
    curves: (metrics.jsonl column, y label) pairs plotted over training for the final runs.
    classifier_config: (DiT) module path of the feature classifier's `jaxpt vit` config.
    how_n_fixed: how the number of reported seeds was fixed (the results file's `statistics.n_fixed`).
  """

  kind: str
  metric: Metric
  curves: tuple[tuple[str, str], ...]
  classifier_config: str = ""
  how_n_fixed: str = stats.N_NOT_POWERED


def make_config(run: dict):
  """The run's config module with the --set overrides, then its scheme, lr, seed (where the run sets them) and, for a
  DiT, the feature classifier's workdir."""
  config = flags.apply_sets(importlib.import_module(run["config"]).get_config(), run["sets"])
  if run.get("scheme"):
    config.model.norm_scheme = run["scheme"]
  if run.get("lr"):
    config.optim.learning_rate = run["lr"]
  config.seed = run["seed"]
  if run.get("classifier"):
    config.fid.classifier = run["classifier"]
  return config


def one_checkpoint(config, eval_every: int):
  """An experiment's run config: `config` (ml_collections) evaluated every `eval_every` steps, one synchronous
  checkpoint at the end, no progress bar."""
  config.eval_every = eval_every
  config.checkpoint_every = config.steps
  config.keep_checkpoints = 1
  config.async_checkpoints = False
  config.progress = False
  return config


# ----------------------------------------------------------------------------------------------- training


def last_eval(directory: str, column: str) -> dict:
  rows = [r for r in results.read_metrics(directory) if column in r]
  if not rows:
    raise RuntimeError(f"{directory}: no {column} in metrics.jsonl")
  return rows[-1]


def vit_probe(config, params, batch) -> dict:
  from experiments.toolkit import probes

  return dict(block_grad_norms=probes.vit_block_gradient_norms(config.model, config.vit, params, batch).tolist(),
              stream_norms=probes.vit_stream_norms(config.model, config.vit, params, batch).tolist())


def train_and_read(setup, directory: str, key: str, summary: dict):
  """Trains the built run `setup` in `directory`; -> (its final state, or None if it diverged; `summary` + test_<key>,
  val_<key>, test_loss, val_loss of the last eval: NaN where it diverged or the data has no validation split)."""
  from jaxpt.engine.loop import NonFiniteError

  try:
    result = jaxpt.train(setup.trainer, setup.config, directory, built=setup)
  except NonFiniteError as e:
    return None, dict(summary, diverged=True, nonfinite_step=e.step, val_loss=math.nan, test_loss=math.nan,
                      **{f"val_{key}": math.nan, f"test_{key}": math.nan})
  runner.require_finished(result, directory)
  row = last_eval(directory, f"eval_{key}")
  return result.state, dict(summary, diverged=False, val_loss=row.get("eval_val_loss", math.nan),
                            test_loss=row["eval_loss"], step=row["step"],
                            **{f"val_{key}": row.get(f"eval_val_{key}", math.nan), f"test_{key}": row[f"eval_{key}"]})


def train_vit_run(run: dict, directory: str) -> dict:
  """One `jaxpt vit` run; -> final validation and test top-1 / loss, and (run['probe']) the probes at init and at
  the end."""
  from jaxpt.models.transformer import param_count

  setup = jaxpt.build("vit", make_config(run), directory)
  init = setup.training.init_state().params
  batch = next(iter(setup.data.eval_batches("validation")))
  summary = dict(params=param_count(init))
  if run.get("probe"):
    summary["probe_init"] = vit_probe(setup.config, init, batch)
  state, summary = train_and_read(setup, directory, "top1", summary)
  if run.get("probe") and state is not None:
    summary["probe_final"] = vit_probe(setup.config, state.params, batch)
  return summary


def train_dit_run(run: dict, directory: str) -> dict:
  """One `jaxpt dit` run; -> final validation and test FID-style metric and diffusion loss; with run['samples'],
  `SAMPLES_PER_CLASS` images per class drawn from the final params with PRNGKey(SAMPLE_KEY), saved as samples.npy
  [classes, SAMPLES_PER_CLASS, H, W, C]."""
  import jax
  import jax.numpy as jnp

  from jaxpt.models.dit import DiT
  from jaxpt.models.transformer import param_count
  from jaxpt.trainers.dit import make_dit_sampler

  setup = jaxpt.build("dit", make_config(run), directory)
  state, summary = train_and_read(setup, directory, "fid", dict(params=param_count(setup.training.init_state().params)))
  if run.get("samples") and state is not None:
    config = setup.config
    sample = make_dit_sampler(config, DiT(config.model, config.dit))
    labels = jnp.repeat(jnp.arange(config.dit.num_classes, dtype=jnp.int32), SAMPLES_PER_CLASS)
    images = np.asarray(jax.device_get(sample(state.params, labels, jax.random.PRNGKey(SAMPLE_KEY))))
    np.save(os.path.join(directory, SAMPLES_FILE),
            images.reshape((config.dit.num_classes, SAMPLES_PER_CLASS) + images.shape[1:]))
  return summary


def train_one(run: dict, directory: str) -> dict:
  return (train_vit_run if run["kind"] == "vit" else train_dit_run)(run, directory)


# ------------------------------------------------------------------------------------------------ selection


def final_runs(schemes, best_lr: dict, seeds, common: dict) -> list[dict]:
  """The first reported seed (seed 0 where the seeds start there) of every scheme also probes (ViT) and saves samples
  (DiT)."""
  first = min(seeds)
  return tuning.final_runs(schemes, best_lr, seeds, common, lambda seed: dict(probe=seed == first,
                                                                              samples=seed == first))


def select_lrs(summaries: list[dict], schemes, lrs, tune_seeds, metric: Metric) -> tuple[dict, list[dict]]:
  """({scheme: lr with the best mean final validation metric}, the tuning table)."""
  return tuning.select_lrs(summaries, schemes, lrs, tune_seeds, f"val_{metric.key}", "validation",
                           metric.higher_is_better)


# -------------------------------------------------------------------------------------------------- results


def final_table(summaries: list[dict], schemes, pairs, metric: Metric) -> tuple[list[dict], list[dict]]:
  """(per-scheme rows, paired comparisons of the (A, B) `pairs`) of the final runs' test metric."""
  by_scheme = {s: sorted((r for r in summaries if r["scheme"] == s), key=lambda r: r["seed"]) for s in schemes}
  key = metric.key
  rows = [dict(scheme=s, lr=runs[0]["lr"], params=runs[0]["params"], diverged=sum(r["diverged"] for r in runs),
               test=stats.summary([r[f"test_{key}"] for r in runs if not r["diverged"]]),
               validation=stats.summary([r[f"val_{key}"] for r in runs if not r["diverged"]]),
               test_loss=stats.summary([r["test_loss"] for r in runs if not r["diverged"]]),
               seeds=[r["seed"] for r in runs])
          for s, runs in by_scheme.items() if runs]
  comparisons = []
  for a, b in pairs:
    if not by_scheme.get(a) or not by_scheme.get(b):
      continue
    ok = {k: {r["seed"]: r[f"test_{key}"] for r in by_scheme[k] if not r["diverged"]} for k in (a, b)}
    seeds = sorted(set(ok[a]) & set(ok[b]))  # pairs where neither diverged
    paired = stats.paired([ok[a][i] for i in seeds], [ok[b][i] for i in seeds])
    better, worse = paired["wins"], paired["losses"]  # wins: a - b < 0
    if metric.higher_is_better:
      better, worse = worse, better
    comparisons.append(dict(a=a, b=b, metric=f"test_{key}", seeds=seeds, **paired, a_better=better,
                            a_worse=worse))
  return rows, stats.holm_adjust(comparisons)


def real_reference(classifier_dir: str, config) -> dict:
  """The metric between real image sets, with the classifier's features (the floor a model could reach): the first
  fid.num_samples training images and the validation split, each against the test split."""
  from jaxpt.config import from_section
  from jaxpt.data.images import ImageData
  from jaxpt.trainers.dit import DiTRunConfig
  from jaxpt.trainers.fid import ClassifierFeatures, frechet_distance

  config = from_section(DiTRunConfig, config, "config")
  classifier = ClassifierFeatures.from_run(classifier_dir)
  data = ImageData.create(config.data, seed=0, image_size=config.dit.image_size)
  test = classifier.statistics(data.split_images("test"))
  train = data.split_images("train")[:config.fid.num_samples]
  out = dict(train_vs_test=frechet_distance(*classifier.statistics(train), *test), train_images=len(train))
  if "validation" in data.splits:
    out["validation_vs_test"] = frechet_distance(*classifier.statistics(data.split_images("validation")), *test)
  return out


def probe_table(final: list[dict], schemes) -> list[dict]:
  """The first reported seed's probes per scheme: gradient first block / last block at init and after training."""
  rows = []
  for s in sorted((s for s in final if s.get("probe_init") and s.get("probe_final")),
                  key=lambda s: list(schemes).index(s["scheme"])):
    grads = {when: s[f"probe_{when}"]["block_grad_norms"] for when in ("init", "final")}
    rows.append(dict(scheme=s["scheme"], seed=s["seed"], lr=s["lr"],
                     grad_first_over_last_init=grads["init"][0] / grads["init"][-1],
                     grad_first_over_last=grads["final"][0] / grads["final"][-1], probe_init=s["probe_init"],
                     probe_final=s["probe_final"]))
  return rows


def plot_curves(experiment: Experiment, rows: list[dict], final: list[dict], out: str, workdir: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  metric, schemes = experiment.metric, experiment.schemes
  fig, axes = plt.subplots(1, 1 + len(experiment.curves), figsize=(4.6 * (1 + len(experiment.curves)), 4))
  tuning.plot_tuning(axes[0], rows, "validation", schemes)
  axes[0].set(ylabel=f"final validation {metric.label}", title="Tuning (tuning seeds)")
  for ax, (column, label) in zip(axes[1:], experiment.curves):
    for scheme in dict.fromkeys(r["scheme"] for r in final):
      curves = [[(row["step"], row[column]) for row in results.read_metrics(runner.run_dir(workdir, r))
                 if column in row] for r in final if r["scheme"] == scheme and not r["diverged"]]
      tuning.plot_band(ax, curves, scheme_color(scheme, schemes), scheme)
    ax.set(xlabel="step", ylabel=label, title=f"{label}: reported seeds (mean, min-max)")
  tuning.save_figure(fig, axes, os.path.join(out, "curves.png"))


def plot_probes(rows: list[dict], out: str, schemes) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for r in rows:
    color = scheme_color(r["scheme"], schemes)
    for key, style in (("probe_init", ":"), ("probe_final", "-")):
      grads = r[key]["block_grad_norms"]
      axes[0].plot(range(len(grads)), grads, style, color=color, marker="o",
                   label=r["scheme"] if key == "probe_final" else None)
      norms = np.array(r[key]["stream_norms"])
      for k in range(norms.shape[1]):
        name = r["scheme"] + ((" x", " y")[k] if norms.shape[1] > 1 else "")
        axes[1].plot(range(len(norms)), norms[:, k], style, color=color, alpha=1.0 if k == 0 else 0.55,
                     marker="o" if k == 0 else "s", label=name if key == "probe_final" else None)
  axes[0].set(yscale="log", xlabel="block", ylabel="||dL/dθ_block||", title="Gradient reaching each block")
  axes[1].set(yscale="log", xlabel="depth (0 = patch embeddings)", ylabel="mean token ||stream||",
              title="Residual-stream norm")
  fig.suptitle(f"seed {rows[0]['seed']}, first validation batch; dotted: at init, solid: after training", fontsize=9)
  tuning.save_figure(fig, axes, os.path.join(out, "probes.png"))


def plot_samples(final: list[dict], out: str, workdir: str, schemes) -> bool:
  """samples.png: the first reported seed's samples of each scheme side by side, one row per class. False if none
  were saved."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  grids = [(s["scheme"], s["seed"], np.load(os.path.join(runner.run_dir(workdir, s), SAMPLES_FILE)))
           for s in sorted(final, key=lambda s: list(schemes).index(s["scheme"]))
           if s.get("samples") and os.path.exists(os.path.join(runner.run_dir(workdir, s), SAMPLES_FILE))]
  if not grids:
    return False
  fig, axes = plt.subplots(1, len(grids), figsize=(3.2 * len(grids), 4.2), squeeze=False)
  for ax, (scheme, _, images) in zip(axes[0], grids):
    classes, per_class, height, width = images.shape[:4]
    tiled = np.clip((images[..., 0] + 1) / 2, 0, 1).transpose(0, 2, 1, 3).reshape(classes * height, per_class * width)
    ax.imshow(tiled, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set(title=scheme, xticks=[], yticks=[(c + 0.5) * height for c in range(classes)],
           yticklabels=range(classes))
  fig.suptitle(f"seed {grids[0][1]} at the tuned lr: {per_class} samples per class (rows), PRNGKey({SAMPLE_KEY}) "
               "for every scheme", fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "samples.png"), dpi=110)
  plt.close(fig)
  return True


def markdown(payload: dict, experiment: Experiment) -> str:
  metric = experiment.metric
  lines = [payload["provenance"], ""]
  if payload.get("classifier"):
    c = payload["classifier"]
    lines += ["## Feature classifier", "",
              f"One `jaxpt vit` run (`{experiment.classifier_config}`, scheme {c['scheme']}, seed {c['seed']}), "
              f"shared by every DiT run: test top-1 {c['test_top1']:.4f}, validation top-1 {c['val_top1']:.4f}. "
              "The metric below is FID-style: the Fréchet distance of Gaussian fits of this classifier's pooled "
              f"features (not Inception-v3's), {payload['config']['fid']['num_samples']} generated images against "
              "the whole test (reported) or validation (selection) split; comparable only between runs scored "
              "with this classifier, not with published FIDs."]
    ref = payload["real_reference"]
    lines[-1] += (f" Real images against the test split with the same features: {ref['train_images']} training "
                  f"images {ref['train_vs_test']:.3f}" + (f", the validation split {ref['validation_vs_test']:.3f}"
                                                          if "validation_vs_test" in ref else "") + ".")
    lines.append("")
  better = "higher" if metric.higher_is_better else "lower"
  lines += ["## Learning rate, tuned on validation", "",
            f"Final validation {metric.label} ({better} is better), tuning seeds "
            f"{payload['design']['tuning_seeds']}.", ""]
  lines += tuning.tuning_markdown(payload["tuning"], payload["schemes"], payload["lrs"], "validation", 4)
  lines += ["", f"## Test {metric.label} at the tuned lr", "",
            f"| scheme | lr | params | test {metric.label} | validation {metric.label} | test loss | diverged |",
            "|---|---:|---:|---:|---:|---:|---:|"]
  for r in payload["final"]:
    lines.append(f"| {r['scheme']} | {r['lr']:g} | {r['params']:,} | {stats.fmt(r['test'], 4)} | "
                 f"{stats.fmt(r['validation'], 4)} | {stats.fmt(r['test_loss'], 4)} | "
                 f"{r['diverged']}/{len(r['seeds'])} |")
  sign = "positive" if metric.higher_is_better else "negative"
  lines += ["", f"Paired by seed, test {metric.label} of A minus B ({sign}"
            ": A better): " + stats.PAIRED_NOTE + "; seeds where A is better / worse.", "",
            "| A | B | difference | A better / worse |", "|---|---|---|---:|"]
  for c in payload["comparisons"]:
    lines.append(f"| {c['a']} | {c['b']} | {stats.fmt_paired(c, 4)} | {c['a_better']} / {c['a_worse']} |")
  if payload.get("probes"):
    lines += ["", "## Gradient reaching each block and residual-stream norm "
              f"(seed {payload['probes'][0].get('seed', 0)}, first validation batch)", "",
              "| scheme | grad per block, init | after training | grad first/last, init | after training | "
              "stream norm by depth after training (x; y) |", "|---|---|---|---:|---:|---|"]
    for r in payload["probes"]:
      fmt_list = lambda values: ", ".join(f"{v:.3g}" for v in values)
      norms = np.array(r["probe_final"]["stream_norms"])
      lines.append(f"| {r['scheme']} | {fmt_list(r['probe_init']['block_grad_norms'])} | "
                   f"{fmt_list(r['probe_final']['block_grad_norms'])} | {r['grad_first_over_last_init']:.3g} | "
                   f"{r['grad_first_over_last']:.3g} | " + "; ".join(fmt_list(norms[:, k])
                                                                      for k in range(norms.shape[1])) + " |")
  return "\n".join(lines)


def write_report(experiment: Experiment, args, schemes, out: str, classifier, tuning_summaries, best_lr, table,
                 final_summaries, base) -> None:
  workdir = os.path.abspath(args.workdir)
  final, comparisons = final_table(final_summaries, schemes, experiment.pairs(schemes), experiment.metric)
  probes = probe_table(final_summaries, experiment.schemes) if experiment.kind == "vit" else []
  everything = ([classifier] if classifier else []) + tuning_summaries + final_summaries
  payload = dict(
      design=dict(selection=f"each scheme's lr = the best over LRS of the mean final validation "
                            f"{experiment.metric.label} of the tuning seeds; reported numbers are test values of "
                            "the reported seeds", tuning_seeds=args.tune_seeds, reported_seeds=args.seeds,
                  statistic="paired by seed: t interval, t test and exact sign-flip test of the mean test "
                            f"{experiment.metric.label} difference (`statistics`)", summary="mean ± sample std (n)",
                  divergence="a non-finite loss, gradient or parameter during training"),
      sets=flags.parse_sets(args.set), schemes=list(schemes), lrs=args.lrs, best_lr=best_lr, tuning=table,
      final=final, comparisons=comparisons, statistics=stats.statistics(comparisons, experiment.how_n_fixed),
      probes=probes, config=base.to_dict(),
      provenance=results.provenance(everything, os.path.join(experiment.here, "run.py")))
  if classifier:
    payload["classifier"] = {k: classifier[k] for k in ("scheme", "seed", "test_top1", "val_top1", "params")}
    payload["classifier_sets"] = classifier["sets"]
    classifier_dir = runner.run_dir(workdir, classifier)
    previous = os.path.join(out, "results.json")
    if os.path.exists(os.path.join(classifier_dir, "config.json")) or not os.path.exists(previous):
      payload["real_reference"] = real_reference(classifier_dir, base)
    else:  # a report rebuilt from committed per-run files: the classifier's checkpoint is not committed
      payload["real_reference"] = json.load(open(previous))["real_reference"]
      payload["real_reference_source"] = "kept from the previous results.json (no classifier checkpoint here)"
  results.write_json(os.path.join(out, "results.json"), payload, everything,
                     report_only=args.report_only)
  results.copy_run_files(workdir, everything, out)
  plot_curves(experiment, table, final_summaries, out, workdir)
  files = ["`curves.png`"]
  if probes:
    plot_probes(probes, out, experiment.schemes)
    files.append("`probes.png`")
  if experiment.kind == "dit" and plot_samples(final_summaries, out, workdir, experiment.schemes):
    files.append("`samples.png`")
  results.write_markdown(out, experiment.title, markdown(payload, experiment), f"Plots: {', '.join(files)}.",
                         os.path.join(experiment.here, "discussion.md"))


# ----------------------------------------------------------------------------------------------------- main


def main(experiment: Experiment, argv=None) -> None:
  """The experiment's command line (`flags.parser` + --phases, --lrs, --tune-seeds; DiT: --classifier-set), its
  grid and its report."""
  parser = tuning.parser(experiment.doc, experiment.schemes, experiment.seeds, experiment.workdir, experiment.lrs,
                         experiment.tune_seeds, PHASES)
  if experiment.classifier_config:
    parser.add_argument("--classifier-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of the feature classifier's config (e.g. its data and image size)")
  args = tuning.parse_args(parser, argv, PHASES)
  schemes = flags.split_list(args.methods, allowed=experiment.schemes, flag="--methods")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  common = dict(sets=flags.parse_sets(args.set), config=experiment.config, kind=experiment.kind)
  base = make_config(dict(common, seed=0))  # a bad --set fails here, before training
  common["config_digest"] = flags.config_digest(base)
  describe = lambda s: f"val {experiment.metric.key} {s[f'val_{experiment.metric.key}']:.4f}"
  classifier = None
  if experiment.classifier_config:
    run = dict(name="classifier", phase="classifier", kind="vit", config=experiment.classifier_config,
               sets=flags.parse_sets(args.classifier_set), scheme="pre", seed=0)
    run["config_digest"] = flags.config_digest(make_config(run))
    [classifier] = runner.finished_or_trained([run], train_one, workdir, 1, args.report_only,
                                              {k: run[k] for k in ("sets", "config_digest")},
                                              lambda s: f"test top1 {s['test_top1']:.4f}") or [None]
    if classifier is None:
      raise SystemExit("the feature classifier has not been trained (run without --report-only)")
    common["classifier"] = runner.run_dir(workdir, run)
    common["classifier_digest"] = run["config_digest"]
  same = {k: common[k] for k in ("sets", "config_digest", "classifier_digest") if k in common}

  def grid(runs):
    return runner.finished_or_trained(runs, train_one, workdir, args.jobs, args.report_only, same, describe)

  tuning_summaries = grid(tuning.tune_runs(schemes, args.lrs, args.tune_seeds, common))
  best_lr, table = select_lrs(tuning_summaries, schemes, args.lrs, args.tune_seeds, experiment.metric)
  print("tuned lr:", best_lr, flush=True)
  final_summaries = grid(final_runs(schemes, best_lr, args.seeds, common)) if "final" in args.phases else []
  if final_summaries:
    write_report(experiment, args, schemes, out, classifier, tuning_summaries, best_lr, table, final_summaries, base)
    print(f"results in {out}")
