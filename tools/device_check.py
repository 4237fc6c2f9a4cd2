"""The prepared accelerator check: kernels, train step, sampler and GRPO step on one GPU (or TPU) in one command.

    python -m tools.device_check --out DIR [--budget-s 340] [--deadline-s 400] [--grace-s 50]
                                 [--sections two_stream_norm,train_step] [--dry-run]

Writes one JSON per section into DIR and `summary.json` (device, versions, each section's status and headline
figures). A section that fails records its traceback and the next one runs; once `--budget-s` seconds have gone,
no new measurement starts and each section lists what it skipped. A measurement that started before then can run
long (a GRPO section's compiles took 286 s on an H200), so the command also keeps a deadline (`tools/deadline.py`):
at `--deadline-s` the running section is cut once XLA returns control and the rest are `not started`; if a call
into XLA has not returned `--grace-s` later, summary.json is written with what is known, the peers are killed and
the process exits (status 2). By default it ends within 450 s plus start-up, inside one 8-minute call.
`--dry-run` runs the same code at tiny sizes on CPU (interpret-mode kernels, no peers): the test suite runs it, so
the check cannot rot.

Sections, in order (`tools/device_kernels.py`, `tools/device_training.py`, `tools/device_engine.py`; what they
time is a median over repeated synchronised calls, warm-up excluded):
- `kernel_numerics`: the fused two-stream-norm kernels compiled for the device (not interpret mode) vs the XLA
  reference, both against the reference evaluated in float32: outputs and every input gradient, relative max error.
- `two_stream_norm`: `benchmarks/two_stream_norm.py` at d = 1024..8192, bf16 and fp32, forward and
  forward+backward: the Pallas kernels vs XLA's fusion of the reference vs tokamax's Triton norm (if it imports),
  achieved GB/s and % of the HBM peak; a trace of the Pallas and XLA paths at d 4096 (`kernel_trace.json.gz`).
- `kernel_tuning`: forward+backward at d 4096 and 8192 (bf16) under other Triton tilings (warps, chunk rows) than
  the default plan's, each checked against the default's outputs.
- `train_step`: jaxpt's train step (AdamW, fp32 master weights and optimizer state, bf16 compute) at ~350M and
  ~1B parameters: tokens/s and MFU (model FLOPs 6 N + 6 L d T per token over the device's dense bf16 peak),
  Pre-Norm (the default `attention_impl=auto`: cuDNN's fused attention; and jaxpt's own attention) vs SiameseNorm
  with the kernel off (`reference`) and on (`pallas`), timed in alternation; a trace of one ~350M Pre-Norm step and
  one SiameseNorm step (`train_<variant>_trace.json.gz`) and the 30 longest device ops of each.
- `grpo_step`: one `jaxpt grpo` trainer step (`benchmarks/grpo_step.py`: 8 prompts x 8 rollouts, d512) split into
  rollout / scoring / update, beside HF `generate` of the same rollouts.
- `engine`: the rollout engine vs the static sampler at issue 29's realistic point (`tools/device_engine.py`:
  long-tailed answer lengths, d512, bf16; each stage's seconds printed as it ends), with JAX's Pallas GPU paged
  attention kernel on a GPU; then a trace of one engine call and engines that each change one thing (whole page
  tables, a slot per rollout) against the static sampler.
- `sampler`: jaxpt's KV-cache sampler (bf16 rollouts) on the ~350M Pre-Norm model vs HF transformers `generate`
  on torch CUDA (eager, and the static cache that `generate` compiles), timed in alternation
  (`benchmarks/torch_cuda_peer.py`, persistent processes).
The traces end up in one `traces.tar` and the sections' JSONs in `sections.tar` (the device returns at most 8
files; a section's JSON is written loose as it ends and packed with the summary). Compiles take minutes on a GPU
(XLA autotunes each new GEMM shape: 111 s for a train step on the H200): `--compile-cache` keeps them for a second
call on the same warm machine (the folder must be git-ignored, as `.jax_cache/` is, or the device tool removes it
between calls).

The device lacks some packages: `tools/fetch_device_wheels.sh` fetches them here into `.whl/` (ignored); carry
`.whl`, install them there first, and link `kernels/` where `pip install` would put it (`jaxpt.kernels`):

    ln -sfn ../kernels jaxpt/kernels && \
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
      PYTHONPATH=/tmp/site:. python3 -m tools.device_check --out $OUT --compile-cache .jax_cache
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

import jax

from benchmarks import two_stream_norm as tsn
from tools.deadline import Deadline, DeadlineReached
from tools.device_engine import VARIANTS as ENGINE_VARIANTS, realistic_engine
from tools.device_kernels import kernel_numerics, kernel_tuning, two_stream_norm
from tools.device_traces import pack_sections, pack_traces
from tools.device_training import PEAK_BF16_TFLOPS, device_peak, grpo_step, sampler, train_step

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "flax", "optax", "orbax-checkpoint",
            "chex", "numpy", "ml_dtypes", "torch", "transformers", "triton", "tokamax", "ml_collections")


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What each section runs: the full check, or the dry run's tiny version of it."""
  norm_rows: int
  norm_dims: tuple[int, ...]
  norm_repeats: int
  norm_chain: int
  tuning_dims: tuple[int, ...]
  train_models: dict  # name -> ModelConfig fields
  train_batch: tuple[int, int]  # batch, seq
  train_repeats: int
  sampler: tuple[int, int, int]  # batch, prompt, new tokens
  rounds: int
  grpo_overrides: dict
  peers: bool
  engine_point: dict  # the engine section's point: `tools.device_engine.point_args` overrides
  trace_dir: str = ""  # where `two_stream_norm` writes its kernel trace ('' = none)


FULL = Sizes(
    norm_rows=16384, norm_dims=(1024, 2048, 4096, 8192), norm_repeats=10, norm_chain=10, tuning_dims=(4096, 8192),
    train_models={"350m": dict(vocab_size=32768, d_model=1024, num_layers=24, num_heads=16, mlp_dim=2816,
                               attention_query_chunk=512),
                  "1b": dict(vocab_size=32768, d_model=2048, num_layers=18, num_heads=16, mlp_dim=5632,
                             attention_query_chunk=512)},
    train_batch=(4, 2048), train_repeats=5, sampler=(32, 256, 256), rounds=3, grpo_overrides={}, peers=True,
    engine_point={})
DRY = Sizes(
    norm_rows=64, norm_dims=(128, 200), norm_repeats=1, norm_chain=2, tuning_dims=(128,),
    train_models={"tiny": dict(vocab_size=256, d_model=64, num_layers=2, num_heads=4, mlp_dim=128)},
    train_batch=(2, 32), train_repeats=1, sampler=(2, 8, 4), rounds=1,
    grpo_overrides={"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2,
                    "model.mlp_dim": 128, "data.prompts_per_step": 2,
                    "sampling.max_new_tokens": 4, "grpo.group_size": 2, "grpo.minibatches": 1},
    peers=False, engine_point=dict(model="tiny", prompts=2, group=2, min_prompt=4, max_prompt=8, median=3, max_new=8,
                                   slots=4, page_size=4))


class Budget:
  """Seconds left of the check's budget; `spent()` is True once it is gone."""

  def __init__(self, seconds: float):
    self.deadline = time.monotonic() + seconds

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def spent(self) -> bool:
    return self.left() <= 0


def environment() -> dict:
  """Device, driver and package versions."""
  device = jax.devices()[0]
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  info = {"backend": jax.default_backend(), "device_kind": device.device_kind, "device_count": jax.device_count(),
          "platform_version": getattr(device.client, "platform_version", ""), "python": sys.version.split()[0],
          "versions": versions, "peak_bandwidth_GBps": tsn.peak_bandwidth(device),
          "peak_bf16_tflops": device_peak(PEAK_BF16_TFLOPS)}
  stats = device.memory_stats() or {}
  if "bytes_limit" in stats:
    info["memory_limit_gib"] = round(stats["bytes_limit"] / 2 ** 30, 1)
  if shutil.which("nvidia-smi"):
    query = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    info["nvidia_smi"] = dict(zip(query.split(","), (v.strip() for v in out.split(","))))
  return info


# --- driver --------------------------------------------------------------------------------------------------------

SECTIONS = {"kernel_numerics": kernel_numerics, "two_stream_norm": two_stream_norm, "kernel_tuning": kernel_tuning,
            "train_step": train_step, "grpo_step": grpo_step, "engine": realistic_engine, "sampler": sampler}


def headline(name: str, report: dict) -> dict:
  """The few figures of a section that the summary repeats."""
  if name == "kernel_numerics":
    return {"all_ok": report["all_ok"], "worst_pallas_rel_error": max(
        (r["max_rel_error"]["pallas"] for r in report["results"]), default=None)}
  if name == "two_stream_norm":
    return {f"{r['dtype']} d={r['d']}": {k: r[k] for k in r if k.startswith(("speedup_", "pct_of_peak"))}
            for r in report["results"]}
  if name == "kernel_tuning":
    return {f"d={r['d']}": {"default_ms": r["default_ms"], "xla_ms": r["xla_ms"], "best": r.get("best")}
            for r in report["results"]}
  if name == "train_step":
    return {f"{m} {v}": {k: e.get(k) for k in ("tokens_per_sec", "mfu", "step_ms")}
            for m, model in report["models"].items() for v, e in model.get("variants", {}).items()}
  if name == "sampler":
    return {"jaxpt_new_tokens_per_sec": report.get("jaxpt", {}).get("new_tokens_per_sec"),
            **{p: e["speedup_jaxpt_over_peer"] for p, e in report.get("peers", {}).items()}}
  if name == "engine":
    speedups = ("speedup", "pallas_gpu_speedup", *(f"{name}_speedup" for name, *_ in ENGINE_VARIANTS))
    return {k: report.get(k) for k in speedups} | {
        "compile_s": {k: v for k, v in report.get("stages_s", {}).items() if k.startswith("compile")}}
  if name == "grpo_step":
    return {k: v for k, v in report.items() if k.startswith("rollout_") or k in ("bfloat16", "float32")}
  return {}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.environ.get("OUT", "device_check_out"))
  parser.add_argument("--budget-s", type=float, default=340.0, help="no new measurement starts after this")
  parser.add_argument("--deadline-s", type=float, default=400.0, help="the running section is cut here (once a call "
                      "into XLA returns) and no further one starts")
  parser.add_argument("--grace-s", type=float, default=50.0, help="the whole command stops this long after "
                      "--deadline-s, whatever runs (default: 450 s in all, under the 8 minutes of one call)")
  parser.add_argument("--sections", default=",".join(SECTIONS))
  parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU, no peers (the test suite's run)")
  parser.add_argument("--compile-cache", default="", help="JAX's persistent compilation cache folder: a later call "
                      "on the same machine reuses the compiles (e.g. an ignored folder in the repository)")
  args = parser.parse_args(argv)
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before JAX's first allocation: peers share the GPU
  if args.deadline_s <= 0 or args.grace_s < 0:
    parser.error("--deadline-s must be > 0 and --grace-s >= 0")
  unknown = set(args.sections.split(",")) - set(SECTIONS)
  if unknown:
    parser.error(f"--sections: unknown {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
  if args.compile_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(args.compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  sizes = dataclasses.replace(DRY if args.dry_run else FULL, trace_dir=args.out)
  budget = Budget(args.budget_s)
  os.makedirs(args.out, exist_ok=True)
  summary = {"command": " ".join(["python -m tools.device_check", *(argv if argv is not None else sys.argv[1:])]),
             "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "dry_run": args.dry_run,
             "environment": environment(), "sections": {}}
  names, running = args.sections.split(","), []
  hard_stop = lambda: write_summary(args.out, summary, cut=running[-1:], how=(
      f"stopped hard at {args.deadline_s + args.grace_s:g} s: a call into XLA had not returned (--grace-s)"))
  try:
    with Deadline(args.deadline_s, args.grace_s, hard_stop):
      for name in names:
        running.append(name)
        summary["sections"][name] = status = run_section(name, sizes, budget, args.out)
        running.pop()
        if status["status"] == "cut":
          break
  except DeadlineReached:  # outside a section's own handling (its bookkeeping): the running one counts as cut
    for name in running:
      summary["sections"].setdefault(name, {"status": "cut", "error": "cut at --deadline-s"})
  for name in names[len(summary["sections"]):]:
    summary["sections"][name] = {"status": "not started", "error": f"the --deadline-s {args.deadline_s:g} had passed"}
  write_summary(args.out, summary)
  print(json.dumps(summary, indent=1))
  return 0 if all(s["status"] == "ok" for s in summary["sections"].values()) else 1


def run_section(name: str, sizes: Sizes, budget: Budget, out: str) -> dict:
  """Runs one section, writes its JSON, returns its summary status (ok, error, or cut at the deadline)."""
  start = time.perf_counter()
  try:
    report = SECTIONS[name](sizes, budget)
    status = {"status": "ok", "headline": headline(name, report)}
  except DeadlineReached:
    report = {"error": "cut at --deadline-s"}
    status = {"status": "cut", "error": report["error"]}
  except Exception:  # noqa: BLE001 -- one section's failure is recorded and the next one runs
    report = {"error": traceback.format_exc()}
    status = {"status": "error", "error": traceback.format_exc().strip().splitlines()[-1]}
  status["seconds"] = round(time.perf_counter() - start, 1)
  with open(os.path.join(out, f"{name}.json"), "w") as f:
    json.dump(dict(report, seconds=status["seconds"]), f, indent=1)
  print(f"{name}: {status['status']} in {status['seconds']} s", flush=True)
  return status


def write_summary(out: str, summary: dict, cut: list[str] = (), how: str = "") -> None:
  """summary.json (with `cut`, the sections running when the command was stopped, marked so), traces.tar and
  sections.tar (the sections' JSONs)."""
  for name in cut:
    summary["sections"][name] = {"status": "cut", "error": how}
  summary["traces"] = pack_traces(out)
  pack_sections(out)
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)


if __name__ == "__main__":
  sys.exit(main())
