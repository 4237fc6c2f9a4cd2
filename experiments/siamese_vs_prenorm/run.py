"""Pre-Norm vs Post-Norm vs SiameseNorm at a normal and a high learning rate, on two corpora, 3 seeds each.

Grid: norm_scheme {pre, post, siamese_post_pre, siamese_hybrid_pre} x lr {config.NORMAL_LR, config.HIGH_LR}
x seed {0, 1, 2} x corpus {tiny Shakespeare, the embedded default corpus}: 48 runs of the same budget (steps,
batch, sequence length, width, depth: `config.py`). Each run is the library's own `pretrain()` in its own workdir
`WORKDIR/<corpus>/lr<lr>/<scheme>/seed<seed>`; a run whose workdir holds `done.json` is skipped, so the script
is resumable. Then it writes `results.md`, `results.json` and `loss_curves.png` next to this file.

  python experiments/siamese_vs_prenorm/run.py [--workdir /tmp/siamese_vs_prenorm] [--jobs 2]
  python experiments/siamese_vs_prenorm/run.py --report-only      # rebuild table and plot from the workdirs

Speed: runs go to `--jobs` worker processes, each with single-threaded XLA (on this 2-core machine two
single-threaded workers train ~1.3x faster than one multi-threaded process). Each corpus is prepared (TFDS
build, tokenizer, packing) once under `WORKDIR/_data/<corpus>` and linked into every run's workdir, where the
data layer finds it in its cache. The JAX persistent compilation cache (`WORKDIR/_jax_cache`) lets seeds 1 and 2
reuse the executables compiled for seed 0. None of this changes what a run computes.

Divergence: a run counts as diverged if any logged train loss or eval loss is non-finite, or if its final eval
loss is above ln(model.vocab_size), the loss of a uniform predictor over the model's output vocabulary.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import math
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.siamese_vs_prenorm import config as config_lib  # noqa: E402

SCHEMES = ("pre", "post", "siamese_post_pre", "siamese_hybrid_pre")
SEEDS = (0, 1, 2)
CORPORA = ("shakespeare", "default")
DATA_LINKS = ("tfds", "tokenizer", "data")  # the data layer's caches inside a workdir
DONE_FILE = "done.json"
TIMING_FILE = "timing.json"
DEFAULT_SHAKESPEARE = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "tinyshakespeare"))


# ---------------------------------------------------------------------------------------------------- the grid


def lr_name(lr: float) -> str:
  return f"lr{lr:g}"


def grid(corpora, lrs, schemes, seeds) -> list[dict]:
  """One dict per run, seed-major, so that seed 0 of every setting compiles before seeds 1, 2 reuse it."""
  return [dict(corpus=c, lr=lr, scheme=s, seed=seed) for seed in seeds for c in corpora for lr in lrs
          for s in schemes]


def run_dir(workdir: str, run: dict) -> str:
  return os.path.join(workdir, run["corpus"], lr_name(run["lr"]), run["scheme"], f"seed{run['seed']}")


def corpus_path(corpus: str, shakespeare: str) -> str:
  """`data.path` of a corpus: '' (the embedded default) or the Shakespeare folder/file. A folder holding one file
  is held out over its paragraphs, exactly as the file itself would be (jaxpt.data.corpus.split_documents)."""
  return shakespeare if corpus == "shakespeare" else ""


def make_config(run: dict, shakespeare: str):
  """The shared config of `config.py` with this run's scheme, learning rate, seed and corpus."""
  config = config_lib.get_config()
  config.model.norm_scheme = run["scheme"]
  config.optim.learning_rate = run["lr"]
  config.seed = run["seed"]
  config.data.path = corpus_path(run["corpus"], shakespeare)
  return config


# ----------------------------------------------------------------------------------------------- training


def prepare_corpus(workdir: str, corpus: str, shakespeare: str) -> str:
  """Builds the TFDS source, tokenizer and packed rows of `corpus` once; returns the directory holding them."""
  from jaxpt.data.pipeline import LMData

  directory = os.path.join(workdir, "_data", corpus)
  config = make_config(dict(corpus=corpus, lr=config_lib.NORMAL_LR, scheme="pre", seed=0), shakespeare)
  LMData.create(config.data, vocab_size=config.model.vocab_size, workdir=directory, seed=0)
  return directory


def link_data(run_workdir: str, data_dir: str) -> None:
  """Points the run's data caches at the shared prepared corpus."""
  os.makedirs(run_workdir, exist_ok=True)
  for name in DATA_LINKS:
    link = os.path.join(run_workdir, name)
    if not os.path.lexists(link):
      os.symlink(os.path.join(data_dir, name), link)


def init_worker(cache_dir: str) -> None:
  """Per worker process: the persistent compilation cache, quiet logs."""
  import jax
  from absl import logging

  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  logging.set_verbosity(logging.WARNING)


def train_one(run: dict, workdir: str, data_dir: str, shakespeare: str) -> dict:
  """Trains one run with `pretrain()` and writes its `done.json` summary; returns the summary."""
  import jax

  from jaxpt.train.pretrain import pretrain

  directory = run_dir(workdir, run)
  link_data(directory, data_dir)
  config = make_config(run, shakespeare)
  start = time.perf_counter()
  result = pretrain(config, directory)
  wall = time.perf_counter() - start
  if result.preempted:
    raise RuntimeError(f"{directory}: preempted at step {int(result.state.step)}")
  summary = dict(run, params=sum(int(p.size) for p in jax.tree.leaves(result.state.params)),
                 steps=config.steps, tokens=config.steps * config.data.batch_size * config.data.seq_len,
                 vocab_size=config.model.vocab_size, wall_s=wall)
  with open(os.path.join(directory, DONE_FILE), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def train_grid(runs: list[dict], workdir: str, shakespeare: str, jobs: int, command: str) -> None:
  """Trains every run without a `done.json`, `jobs` at a time, logging one line per finished run."""
  todo = [r for r in runs if not os.path.exists(os.path.join(run_dir(workdir, r), DONE_FILE))]
  print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished; training {len(todo)}", flush=True)
  if not todo:
    return
  data_dirs = {c: prepare_corpus(workdir, c, shakespeare) for c in sorted({r["corpus"] for r in todo})}
  library = library_version()  # the workers import jaxpt now and keep that code for the whole grid
  start = time.time()
  context = multiprocessing.get_context("spawn")
  with futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=init_worker,
                                   initargs=(os.path.join(workdir, "_jax_cache"),)) as pool:
    pending = {pool.submit(train_one, r, workdir, data_dirs[r["corpus"]], shakespeare): r for r in todo}
    for done, future in enumerate(futures.as_completed(pending), 1):
      run = pending[future]
      try:
        summary = future.result()
        status = f"{summary['wall_s']:.0f}s, final eval_loss {final_eval_loss(run_dir(workdir, run)):.4f}"
      except Exception as e:  # noqa: BLE001 -- one failed run must not stop the grid
        status = f"FAILED: {type(e).__name__}: {e}"
      print(f"[{done}/{len(todo)} {time.time() - start:.0f}s] {run_dir(workdir, run)}: {status}", flush=True)
  record_timing(workdir, time.time() - start, len(todo), jobs, command, library)


def library_version() -> str:
  """`git describe`-like id of the checkout the runs import: short HEAD, plus the edited jaxpt/ files if any."""
  import subprocess

  def git(*args):
    return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True).stdout

  edited = [line for line in git("status", "--porcelain", "--", "jaxpt").splitlines() if line.strip()]
  head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
  return head + (f" + uncommitted edits to {', '.join(line[3:] for line in edited)}" if edited else "")


def record_timing(workdir: str, wall: float, trained: int, jobs: int, command: str, library: str) -> None:
  """Appends this invocation's wall time to `WORKDIR/timing.json`."""
  path = os.path.join(workdir, TIMING_FILE)
  entries = json.load(open(path)) if os.path.exists(path) else []
  entries.append(dict(command=command, library=library, wall_s=wall, runs_trained=trained, jobs=jobs,
                      finished=time.strftime("%Y-%m-%d %H:%M:%S")))
  with open(path, "w") as f:
    json.dump(entries, f, indent=1)


# -------------------------------------------------------------------------------------------------- results


def read_rows(directory: str) -> list[dict]:
  path = os.path.join(directory, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def final_eval_loss(directory: str) -> float:
  evals = [r["eval_loss"] for r in read_rows(directory) if "eval_loss" in r]
  return evals[-1] if evals else math.nan


def summarize_run(directory: str) -> dict | None:
  """The run's done.json plus its eval curve, final losses and divergence verdict; None if unfinished."""
  done = os.path.join(directory, DONE_FILE)
  if not os.path.exists(done):
    return None
  with open(done) as f:
    summary = json.load(f)
  rows = read_rows(directory)
  losses = [r["loss"] for r in rows if "loss" in r] + [r["eval_loss"] for r in rows if "eval_loss" in r]
  final = final_eval_loss(directory)
  threshold = math.log(summary["vocab_size"])
  nonfinite = not all(math.isfinite(v) for v in losses)
  summary.update(
      final_eval_loss=final, final_train_loss=next((r["loss"] for r in reversed(rows) if "loss" in r), math.nan),
      eval_curve=[[r["step"], r["eval_loss"]] for r in rows if "eval_loss" in r],
      nonfinite=nonfinite, diverged=nonfinite or not final <= threshold)
  return summary


def unigram_loss(workdir: str, corpus: str) -> float:
  """Eval loss of a unigram model (train-split target frequencies, add-0.5 smoothed over the model vocab) on the
  runs' held-out eval batches: the loss a model reaches by learning token frequencies alone. NaN if the corpus
  was not prepared under `workdir`."""
  import glob

  import numpy as np

  from jaxpt.data import packing

  packed = glob.glob(os.path.join(workdir, "_data", corpus, "data", "packed_*"))
  if not packed:
    return math.nan
  config = config_lib.get_config()
  load = lambda name: np.load(os.path.join(packed[0], f"{name}.npy"))  # noqa: E731
  train = packing.make_batch(load("train_tokens"), load("train_segments"))
  rows = config.data.eval_batches * config.data.batch_size
  held_out = packing.make_batch(load("eval_tokens")[:rows], load("eval_segments")[:rows])
  counts = np.bincount(train["targets"][train["weights"] > 0], minlength=config.model.vocab_size) + 0.5
  log_p = np.log(counts / counts.sum())
  return float(-log_p[held_out["targets"][held_out["weights"] > 0]].mean())


def mean_std(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (ddof=1; 0 for a single value); NaNs for no values."""
  if not values:
    return math.nan, math.nan
  mean = sum(values) / len(values)
  if len(values) == 1:
    return mean, 0.0
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def aggregate(runs: list[dict], workdir: str) -> list[dict]:
  """One row per (corpus, lr, scheme): params, final eval loss over the non-diverged seeds, diverged count."""
  cells: dict[tuple, list[dict]] = {}
  for run in runs:
    cells.setdefault((run["corpus"], run["lr"], run["scheme"]), []).append(run)
  table = []
  for (corpus, lr, scheme), members in cells.items():
    summaries = [s for s in (summarize_run(run_dir(workdir, r)) for r in members) if s is not None]
    kept = [s["final_eval_loss"] for s in summaries if not s["diverged"]]
    mean, std = mean_std(kept)
    table.append(dict(corpus=corpus, lr=lr, scheme=scheme, params=summaries[0]["params"] if summaries else None,
                      finished=len(summaries), planned=len(members), diverged=sum(s["diverged"] for s in summaries),
                      eval_loss_mean=mean, eval_loss_std=std, runs=summaries))
  return table


def fmt_loss(mean: float, std: float) -> str:
  return "—" if math.isnan(mean) else f"{mean:.4f} ± {std:.4f}"


def fmt_params(params: int | None) -> str:
  return "—" if params is None else f"{params:,}"


def table_markdown(table: list[dict]) -> str:
  lines = ["| corpus | lr | scheme | params | final eval loss (mean ± std, non-diverged seeds) | diverged |",
           "|---|---|---|---:|---:|---:|"]
  for row in table:
    finished = "" if row["finished"] == row["planned"] else f" ({row['finished']} finished)"
    lines.append(f"| {row['corpus']} | {row['lr']:g} | {row['scheme']} | {fmt_params(row['params'])} | "
                 f"{fmt_loss(row['eval_loss_mean'], row['eval_loss_std'])} | {row['diverged']}/{row['planned']}"
                 f"{finished} |")
  return "\n".join(lines)


def per_seed_markdown(table: list[dict]) -> str:
  lines = ["| corpus | lr | scheme | seed | final eval loss | final train loss | diverged | wall (s) |",
           "|---|---|---|---:|---:|---:|---|---:|"]
  for row in table:
    for s in row["runs"]:
      lines.append(f"| {s['corpus']} | {s['lr']:g} | {s['scheme']} | {s['seed']} | {s['final_eval_loss']:.4f} | "
                   f"{s['final_train_loss']:.4f} | {'yes' if s['diverged'] else 'no'} | {s['wall_s']:.0f} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- plot


COLORS = dict(zip(SCHEMES, ("tab:blue", "tab:red", "tab:green", "tab:purple")))


def plot_panel(ax, rows: list[dict], unigram: float) -> None:
  """One corpus x lr panel: per scheme, the mean eval curve of the non-diverged seeds with a min/max band, and
  each diverged seed's finite points dotted; the unigram loss, and ln(vocab) when a curve comes near it."""
  import numpy as np

  shown = [unigram] if math.isfinite(unigram) else []
  uniform = None
  for row in rows:
    color = COLORS.get(row["scheme"])
    label = f"{row['scheme']} ({row['diverged']}/{row['planned']} div.)"
    for s in row["runs"]:
      uniform = math.log(s["vocab_size"])
      if s["diverged"]:
        points = [(x, y) for x, y in s["eval_curve"] if math.isfinite(y)]
        ax.plot(*zip(*points) if points else ([], []), ":", color=color, lw=1.2)
        shown += [y for _, y in points]
    kept = [s["eval_curve"] for s in row["runs"] if not s["diverged"]]
    if not kept:
      ax.plot([], [], ":", color=color, label=label)
      continue
    n = min(len(c) for c in kept)
    steps = np.array([p[0] for p in kept[0][:n]])
    values = np.array([[p[1] for p in c[:n]] for c in kept])
    ax.plot(steps, values.mean(0), "-", color=color, lw=1.6, label=label)
    ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2, lw=0)
    shown += list(values.ravel())
  if math.isfinite(unigram):
    ax.axhline(unigram, color="black", ls="-.", lw=0.8, label="unigram model")
  if shown and uniform is not None:
    if max(shown) > uniform - 0.3:
      ax.axhline(uniform, color="gray", ls="--", lw=0.8, label="ln(vocab): divergence line")
    ax.set_ylim(min(shown) - 0.1, min(max(shown) + 0.1, uniform + 0.5))
  ax.set_xlabel("step")
  ax.set_ylabel("eval loss")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)


def plot(table: list[dict], corpora, lrs, unigram: dict, path: str) -> None:
  """Panels corpus (rows) x lr (columns), see `plot_panel`."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(corpora), len(lrs), figsize=(5.2 * len(lrs), 3.9 * len(corpora)), squeeze=False,
                           sharex=True)
  for i, corpus in enumerate(corpora):
    for j, lr in enumerate(lrs):
      plot_panel(axes[i][j], [r for r in table if r["corpus"] == corpus and r["lr"] == lr],
                 unigram.get(corpus, math.nan))
      axes[i][j].set_title(f"{corpus}, peak lr {lr:g}")
  fig.suptitle("Eval loss: mean over non-diverged seeds, band = min/max; dotted = diverged seeds", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------------------------------- report


def write_report(runs: list[dict], args, command: str) -> list[dict]:
  """results.json, results.md (table + per-seed table, command, wall time) and loss_curves.png.

  The command reported is the one that trained the last runs (from `WORKDIR/timing.json`), else `command`.
  """
  table = aggregate(runs, args.workdir)
  corpora = [c for c in CORPORA if any(r["corpus"] == c for r in runs)]
  lrs = sorted({r["lr"] for r in runs})
  timing_path = os.path.join(args.workdir, TIMING_FILE)
  timing = json.load(open(timing_path)) if os.path.exists(timing_path) else []
  command = timing[-1]["command"] if timing else command
  unigram = {c: unigram_loss(args.workdir, c) for c in corpora}
  config = config_lib.get_config()
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(dict(command=command, timing=timing, config=json.loads(config.to_json_best_effort()),
                   divergence_rule="non-finite train/eval loss, or final eval loss > ln(model.vocab_size)",
                   unigram_eval_loss=unigram, table=table), f, indent=1)
  plot(table, corpora, lrs, unigram, os.path.join(args.out, "loss_curves.png"))
  wall = sum(t["wall_s"] for t in timing)
  with open(os.path.join(args.out, "results.md"), "w") as f:
    f.write(RESULTS_TEMPLATE.format(
        steps=config.steps, batch=config.data.batch_size, seq=config.data.seq_len,
        tokens=config.steps * config.data.batch_size * config.data.seq_len, layers=config.model.num_layers,
        d_model=config.model.d_model, heads=config.model.num_heads, mlp=config.model.mlp_dim,
        vocab=config.model.vocab_size, warmup=config.optim.warmup_steps, end=config.optim.end_lr_fraction,
        wd=config.optim.weight_decay, clip=config.optim.grad_clip, z=config.loss.z_loss,
        eval_batches=config.data.eval_batches, eval_every=config.eval_every,
        uniform=math.log(config.model.vocab_size), command=command,
        wall=f"{wall / 60:.1f} min" if timing else "(not recorded)",
        library="; ".join(t.get("library", "(not recorded)") for t in timing) or "(not recorded)",
        invocations="; ".join(f"{t['runs_trained']} runs in {t['wall_s'] / 60:.1f} min with {t['jobs']} jobs"
                              for t in timing),
        unigram=", ".join(f"{c} {v:.3f}" for c, v in unigram.items()),
        table=table_markdown(table), per_seed=per_seed_markdown(table),
        discussion=open(DISCUSSION_FILE).read().strip() if os.path.exists(DISCUSSION_FILE) else "(to be written)"))
  return table


DISCUSSION_FILE = os.path.join(HERE, "discussion.md")

RESULTS_TEMPLATE = """# SiameseNorm vs Pre-Norm vs Post-Norm, small scale (CPU)

Same budget for every run: {steps} steps x batch {batch} x seq {seq} = {tokens:,} training tokens; {layers} layers,
d_model {d_model}, {heads} heads, SwiGLU {mlp}, RMSNorm, RoPE, tied embeddings, vocab {vocab} (SentencePiece BPE
trained per corpus). AdamW (0.9, 0.95), weight decay {wd}, grad clip {clip}, z-loss {z}, linear warmup
{warmup} steps then cosine to {end} x peak lr. Eval loss: token NLL on {eval_batches} fixed held-out batches, every
{eval_every} steps. Corpora: tiny Shakespeare (1.1 MB) and the library's embedded default corpus (Python stdlib
sources, capped at 2 MB); Shakespeare is split into paragraphs, ~5% of them held out by content hash. Config:
`config.py`; grid and report: `run.py`. Params differ slightly by scheme (SiameseNorm adds norm weights).

**Diverged** = any logged train or eval loss non-finite, or final eval loss > ln({vocab}) = {uniform:.3f} (a
uniform predictor). Mean ± std (sample std, ddof=1) is over the non-diverged seeds of 3. Reference: a unigram
model (train token frequencies) scores {unigram} on the same eval batches; a run near it has learned
token frequencies only (it stalled, without diverging).

## Results

{table}

Plot: `loss_curves.png` (eval loss vs step per corpus x lr; mean over non-diverged seeds, band = min/max).

## What the numbers show

{discussion}

## Reproduce

    {command}

Wall time: {wall} on a shared 2-core CPU machine, no accelerator ({invocations}).
Library: jaxpt {library}.
`--report-only` rebuilds this file, `results.json` and the plot from the run workdirs.

## Per seed

{per_seed}
"""


# ----------------------------------------------------------------------------------------------------- main


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/siamese_vs_prenorm", help="root of the run workdirs")
  parser.add_argument("--shakespeare", default=DEFAULT_SHAKESPEARE,
                      help="tiny Shakespeare: its input.txt, or the folder holding it")
  parser.add_argument("--jobs", type=int, default=2, help="runs trained in parallel (worker processes)")
  parser.add_argument("--report-only", action="store_true", help="only rebuild results from existing workdirs")
  parser.add_argument("--schemes", default=",".join(SCHEMES))
  parser.add_argument("--lrs", default=f"{config_lib.NORMAL_LR:g},{config_lib.HIGH_LR:g}")
  parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
  parser.add_argument("--corpora", default=",".join(CORPORA))
  parser.add_argument("--out", default=HERE, help="where results.md/.json and loss_curves.png go")
  return parser.parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(argv)
  args.workdir = os.path.abspath(args.workdir)
  runs = grid(args.corpora.split(","), [float(v) for v in args.lrs.split(",")], args.schemes.split(","),
              [int(v) for v in args.seeds.split(",")])
  command = " ".join(["python experiments/siamese_vs_prenorm/run.py"] + [
      a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report-only"])
  if not args.report_only:
    if args.jobs > 1:  # one XLA thread per worker: the workers share the cores instead of contending
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                 " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    os.makedirs(args.workdir, exist_ok=True)
    train_grid(runs, args.workdir, args.shakespeare, args.jobs, command)
  table = write_report(runs, args, command)
  print(table_markdown(table))


if __name__ == "__main__":
  main()
