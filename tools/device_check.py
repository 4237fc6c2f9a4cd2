"""The prepared accelerator check: kernels, train step, sampler and GRPO step on one GPU (or TPU) in one command.

    python -m tools.device_check --out DIR [--budget-s 450] [--sections two_stream_norm,train_step] [--dry-run]

Writes one JSON per section into DIR and `summary.json` (device, versions, each section's status and headline
figures). A section that fails records its traceback and the next one runs; once `--budget-s` seconds have gone,
no new measurement starts and each section lists what it skipped. `--dry-run` runs the same code at tiny sizes
on CPU (interpret-mode kernels, no peers): the test suite runs it, so the check cannot rot.

Sections, in order (what they time is a median over repeated synchronised calls, warm-up excluded):
- `kernel_numerics`: the fused two-stream-norm kernels compiled for the device (not interpret mode) vs the XLA
  reference, both against the reference evaluated in float32: outputs and every input gradient, relative max error.
- `two_stream_norm`: `benchmarks/two_stream_norm.py` at d = 1024..8192, bf16 and fp32, forward and
  forward+backward: the Pallas kernels vs XLA's fusion of the reference vs tokamax's Triton norm (if it imports),
  achieved GB/s and % of the HBM peak; a trace of the Pallas and XLA paths at d 4096 (`kernel_trace.json.gz`).
- `kernel_tuning`: forward+backward at d 4096 and 8192 (bf16) under other Triton tilings (warps, chunk rows) than
  the default plan's, each checked against the default's outputs.
- `train_step`: jaxpt's train step (AdamW, fp32 master weights and optimizer state, bf16 compute) at ~350M and
  ~1B parameters: tokens/s and MFU (model FLOPs 6 N + 6 L d T per token over the device's dense bf16 peak),
  Pre-Norm (also with `attention_impl=jax`: cuDNN's fused attention) vs SiameseNorm with the kernel off
  (`reference`) and on (`pallas`), timed in alternation; a trace of one ~350M Pre-Norm step
  (`train_trace.json.gz`) and its 30 longest device ops.
- `grpo_step`: one `jaxpt grpo` trainer step (`benchmarks/grpo_step.py`: 8 prompts x 8 rollouts, d512) split into
  rollout / scoring / update, beside HF `generate` of the same rollouts.
- `sampler`: jaxpt's KV-cache sampler (bf16 rollouts) on the ~350M Pre-Norm model vs HF transformers `generate`
  on torch CUDA (eager, and the static cache that `generate` compiles), timed in alternation
  (`benchmarks/torch_cuda_peer.py`, persistent processes).
The traces end up in one `traces.tar` (the device returns at most 8 files). Compiles take minutes on a GPU (XLA
autotunes each new GEMM shape: 111 s for a train step on the H200): `--compile-cache` keeps them for a second
call on the same machine.

The device lacks some packages: `tools/fetch_device_wheels.sh` fetches them here into `.whl/` (ignored); carry
`.whl`, install them there first, and link `kernels/` where `pip install` would put it (`jaxpt.kernels`):

    ln -sfn ../kernels jaxpt/kernels && \
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
      PYTHONPATH=/tmp/site:. python3 -m tools.device_check --out $OUT --compile-cache .jax_cache
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import two_stream_norm as tsn
from benchmarks.common import alternating_seconds, compiled_step, matmul_gflops, median_seconds
from benchmarks.sampler import Peer, sampler_run, timed
from benchmarks.train_step import OPTIM
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params, param_count
from jaxpt.train.lm import make_lm_loss_fn
from jaxpt.train.optim import make_optimizer
from jaxpt.train.state import TrainState
from jaxpt.train.step import make_train_step

TORCH_PEER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "torch_cuda_peer.py")
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "flax", "optax", "orbax-checkpoint",
            "chex", "numpy", "ml_dtypes", "torch", "transformers", "triton", "tokamax", "ml_collections")
PEAK_BF16_TFLOPS = {  # device_kind substring -> dense bf16 peak, TFLOP/s (vendor figures)
    "H200": 989.4, "H100": 989.4, "A100": 312.0, "L4": 121.0, "TPU v6": 918.0, "TPU v5p": 459.0,
    "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v4": 275.0,
}
LM = dict(num_kv_heads=None, tie_embeddings=True, dtype="bfloat16", param_dtype="float32", max_seq_len=2048)


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
  trace_dir: str = ""  # where `two_stream_norm` writes its kernel trace ('' = none)


FULL = Sizes(
    norm_rows=16384, norm_dims=(1024, 2048, 4096, 8192), norm_repeats=10, norm_chain=10, tuning_dims=(4096, 8192),
    train_models={"350m": dict(vocab_size=32768, d_model=1024, num_layers=24, num_heads=16, mlp_dim=2816,
                               attention_query_chunk=512),
                  "1b": dict(vocab_size=32768, d_model=2048, num_layers=18, num_heads=16, mlp_dim=5632,
                             attention_query_chunk=512)},
    train_batch=(4, 2048), train_repeats=5, sampler=(32, 256, 256), rounds=3, grpo_overrides={}, peers=True)
DRY = Sizes(
    norm_rows=64, norm_dims=(128, 200), norm_repeats=1, norm_chain=2, tuning_dims=(128,),
    train_models={"tiny": dict(vocab_size=256, d_model=64, num_layers=2, num_heads=4, mlp_dim=128)},
    train_batch=(2, 32), train_repeats=1, sampler=(2, 8, 4), rounds=1,
    grpo_overrides={"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2,
                    "model.mlp_dim": 128, "data.prompts_per_step": 2,
                    "sampling.max_new_tokens": 4, "grpo.group_size": 2, "grpo.minibatches": 1},
    peers=False)


class Budget:
  """Seconds left of the check's budget; `spent()` is True once it is gone."""

  def __init__(self, seconds: float):
    self.deadline = time.monotonic() + seconds

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def spent(self) -> bool:
    return self.left() <= 0


def device_peak(table: dict) -> float | None:
  kind = jax.devices()[0].device_kind
  return next((v for name, v in table.items() if name in kind), None)


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


# --- kernel numerics ---------------------------------------------------------------------------------------------

def relative_error(approx, truth) -> float:
  truth = np.asarray(truth, np.float64)
  return float(np.max(np.abs(np.asarray(approx, np.float64) - truth)) / max(np.max(np.abs(truth)), 1e-30))


def kernel_numerics(sizes: Sizes, budget: Budget) -> dict:
  """Per (d, dtype): the Pallas kernels' and the XLA reference's relative max error against the reference in
  float32, for the outputs (xh, y, h) and the gradients of every input (rows and norm weights). `ok`: the kernel's
  error is within 2x the reference's own (bf16) or 1e-4 (fp32: reduction order and the device's rsqrt)."""
  results, skipped = [], []
  for d in sizes.norm_dims:
    for dtype in (jnp.bfloat16, jnp.float32):
      if budget.spent():
        skipped.append(f"d={d} {jnp.dtype(dtype).name}")
        continue
      rows_in, norms, c, cts = tsn.inputs(sizes.norm_rows, d, dtype, "rmsnorm")
      as32 = lambda tree: jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), tree)
      truth = jax.jit(tsn.paths("reference")[1])(*as32(rows_in), c, norms, as32(cts))
      errors = {}
      for impl in ("pallas", "reference"):
        out = jax.jit(tsn.paths(impl)[1])(*rows_in, c, norms, cts)
        flat, flat_truth = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(truth)
        errors[impl] = max(relative_error(a, b) for a, b in zip(flat, flat_truth))
      limit = 2 * errors["reference"] if dtype == jnp.bfloat16 else 1e-4
      results.append({"d": d, "dtype": jnp.dtype(dtype).name, "rows": sizes.norm_rows,
                      "max_rel_error": {"pallas": errors["pallas"], "xla_reference": errors["reference"]},
                      "ok": errors["pallas"] <= max(limit, 1e-6)})
  return {"results": results, "skipped": skipped, "all_ok": all(r["ok"] for r in results)}


# --- two-stream-norm speed -----------------------------------------------------------------------------------------

def tokamax_runs() -> str:
  """'' when tokamax's Triton norm runs here, else why not."""
  if jax.default_backend() != "gpu":
    return "not a GPU"
  try:
    x = jnp.ones((8, 128), jnp.bfloat16)
    jax.block_until_ready(tsn.tokamax_boundary(x, x, x, 2.0, *[{"scale": jnp.ones((128,))}] * 3, eps=tsn.EPS))
    return ""
  except Exception as e:  # noqa: BLE001 -- any failure means: no tokamax peer, and why
    return f"{type(e).__name__}: {str(e)[:300]}"


def perfetto_trace(run: Callable[[], object], path: str) -> str:
  """A profiler trace (Perfetto JSON) of `run()` (warmed up first) written to `path`; returns its file name."""
  jax.block_until_ready(run())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(run())
    traces = [os.path.join(root, f) for root, _, files in os.walk(trace_dir) for f in files
              if f.endswith(".trace.json.gz")]
    if not traces:
      raise RuntimeError("the profiler wrote no Perfetto trace")
    shutil.copy(traces[0], path)
  return os.path.basename(path)


def kernel_trace(sizes: Sizes, out_dir: str, d: int = 4096) -> str:
  """A trace of three chained forward+backward calls each of the Pallas and XLA paths at bf16, d = `d`, in
  `out_dir/kernel_trace.json.gz`: the device time of each kernel, to see what limits it."""
  rows_in, norms, c, cts = tsn.inputs(sizes.norm_rows, d, jnp.bfloat16, "rmsnorm")
  runs = [tsn.chained(impl, sizes.norm_chain)[1] for impl in ("pallas", "reference")]
  return perfetto_trace(lambda: [run(*rows_in, c, norms, cts) for run in runs for _ in range(3)],
                        os.path.join(out_dir, "kernel_trace.json.gz"))


def trace_kernel_times(path: str, top: int | None = None) -> dict:
  """{op name: {calls, total_ms}} of the device ops in a Perfetto trace, longest first (the `top` longest); a CPU
  trace has no device: there, the XLA ops (events naming an `hlo_op`)."""
  import gzip
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and e["args"]["name"].startswith("/device:")}
  is_op = ((lambda e: e["pid"] in devices) if devices else (lambda e: "hlo_op" in e.get("args", {})))
  times = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and is_op(e):
      times[e["name"]].append(e["dur"] / 1e3)
  ranked = sorted(times.items(), key=lambda kv: -sum(kv[1]))
  return {name: {"calls": len(t), "total_ms": round(sum(t), 3)} for name, t in ranked[:top]}


def two_stream_norm(sizes: Sizes, budget: Budget) -> dict:
  timed_here = tsn.layout.resolve_platform() != "interpret"
  tokamax_error = tokamax_runs()
  peers = ("tokamax",) if not tokamax_error else ()
  results, skipped = [], []
  for dtype in ("bfloat16", "float32"):
    for d in sizes.norm_dims:
      if budget.spent():
        skipped.append(f"d={d} {dtype}")
        continue
      result = tsn.bench_dim(sizes.norm_rows, d, jnp.dtype(dtype), "rmsnorm", sizes.norm_repeats, timed_here,
                             sizes.norm_chain, peers)
      plan = tsn.layout.make_plan(sizes.norm_rows, d, itemsize=jnp.dtype(dtype).itemsize)
      result.update(dtype=dtype, plan={"d_pad": plan.d_pad, "block_rows": plan.block_rows,
                                       "chunk_rows": plan.chunk_rows, "grid": plan.grid})
      results.append(result)
  report = {"rows": sizes.norm_rows, "norm": "rmsnorm", "chain": sizes.norm_chain, "timed": timed_here,
            "tokamax": tokamax_error or "ran", "peak_bandwidth_GBps": tsn.peak_bandwidth(jax.devices()[0]),
            "results": results, "skipped": skipped}
  if sizes.trace_dir and not budget.spent():
    try:
      report["trace"] = kernel_trace(sizes, sizes.trace_dir)
      report["trace_device_ops"] = trace_kernel_times(os.path.join(sizes.trace_dir, report["trace"]))
    except Exception:  # noqa: BLE001 -- the figures above stand without the trace
      report["trace"] = traceback.format_exc().strip().splitlines()[-1]
  return report


def tuning_configs(rows: int, d: int, itemsize: int) -> list[dict]:
  """Triton tilings to try beside the default plan: warps 4..32 at the default chunk, and at 4x the chunk rows."""
  plan = tsn.layout.make_plan(rows, d, itemsize=itemsize)
  configs = []
  for chunk in (plan.chunk_rows, 4 * plan.chunk_rows):
    block = max(chunk, plan.block_rows)
    configs += [{"chunk_rows": chunk, "block_rows": block, "num_warps": w} for w in (4, 8, 16, 32)]
  return configs


def kernel_tuning(sizes: Sizes, budget: Budget) -> dict:
  """The fused boundary's forward+backward (bf16) under other Triton tilings than the default plan's: per tiling
  the time per boundary, its ratio to the default's, and its largest difference from the default's outputs."""
  timed_here = tsn.layout.resolve_platform() == "gpu"
  results, skipped = [], []
  for d in sizes.tuning_dims:
    rows_in, norms, c, cts = tsn.inputs(sizes.norm_rows, d, jnp.bfloat16, "rmsnorm")
    default_run = tsn.chained("pallas", sizes.norm_chain)[1]
    default_out = default_run(*rows_in, c, norms, cts)
    seconds = lambda run: (median_seconds(lambda: run(*rows_in, c, norms, cts), sizes.norm_repeats, warmup=1)
                           / sizes.norm_chain) if timed_here else None
    default_s, xla_s = seconds(default_run), seconds(tsn.chained("reference", sizes.norm_chain)[1])
    entry = {"d": d, "default_plan": dataclasses.asdict(tsn.layout.make_plan(sizes.norm_rows, d, itemsize=2)),
             "default_ms": default_s and round(default_s * 1e3, 4), "xla_ms": xla_s and round(xla_s * 1e3, 4),
             "tilings": []}
    for tiling in tuning_configs(sizes.norm_rows, d, itemsize=2):
      if budget.spent():
        skipped.append(f"d={d} {tiling}")
        continue
      try:
        run = tsn.chained("pallas", sizes.norm_chain, **tiling)[1]
        out = run(*rows_in, c, norms, cts)
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                   for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(default_out)))
        took = seconds(run)
        entry["tilings"].append(dict(tiling, ms=took and round(took * 1e3, 4), max_abs_diff_vs_default=diff,
                                     vs_default=took and round(took / default_s, 3)))
      except Exception:  # noqa: BLE001 -- a tiling Triton refuses (too many registers, ...) is a finding
        entry["tilings"].append(dict(tiling, error=traceback.format_exc().strip().splitlines()[-1][:500]))
    timed_tilings = [t for t in entry["tilings"] if t.get("ms")]
    if timed_tilings:
      entry["best"] = min(timed_tilings, key=lambda t: t["ms"])
    results.append(entry)
  return {"rows": sizes.norm_rows, "dtype": "bfloat16", "timed": timed_here, "results": results, "skipped": skipped}


# --- train step ------------------------------------------------------------------------------------------------

TRAIN_VARIANTS = {"pre": dict(norm_scheme="pre"),
                  "pre_jax_attention": dict(norm_scheme="pre", attention_impl="jax"),  # cuDNN's fused attention
                  "siamese_post_pre": dict(norm_scheme="siamese_post_pre", kernel="reference"),
                  "siamese_post_pre_pallas": dict(norm_scheme="siamese_post_pre", kernel="pallas")}


def lm_config(fields: dict, **extra) -> ModelConfig:
  fields = {**LM, **fields, **extra}
  fields["num_kv_heads"] = fields["num_kv_heads"] or fields["num_heads"]
  return ModelConfig(**fields)


def build_train_step(cfg: ModelConfig, batch: int, seq: int) -> tuple[dict, Callable[[], jax.Array]]:
  """(facts, run) of a jitted, donated AdamW train step on a fixed random batch."""
  model = TransformerLM(cfg)
  params = init_params(cfg, jax.random.PRNGKey(0))
  optimizer, schedule = make_optimizer(OPTIM, total_steps=1000)
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(1))
  step = jax.jit(make_train_step(make_lm_loss_fn(model), optimizer, schedule), donate_argnums=0)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1), dtype=np.int32)
  data = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
          "weights": jnp.ones((batch, seq), jnp.float32)}
  start = time.perf_counter()
  memory, run = compiled_step(step, state, data)
  return {"params": param_count(params), "compile_s": round(time.perf_counter() - start, 1), "memory": memory}, run


def train_step(sizes: Sizes, budget: Budget) -> dict:
  batch, seq = sizes.train_batch
  peak = device_peak(PEAK_BF16_TFLOPS)
  report = {"batch": batch, "seq": seq, "compute": "bfloat16 compute, float32 params and AdamW state",
            "peak_bf16_tflops": peak, "models": {}, "skipped": []}
  if not budget.spent():
    n = 8192 if sizes.peers else 256
    report["matmul_bf16_tflops_measured"] = round(matmul_gflops(n, n, n, dtype=jnp.bfloat16) / 1e3, 1)
  for name, fields in sizes.train_models.items():
    try:
      report["models"][name] = train_model(fields, sizes, budget, peak, report["skipped"], name)
    except Exception:  # noqa: BLE001 -- e.g. out of memory: recorded, and the next size runs
      gc.collect()
      report["models"][name] = {"error": traceback.format_exc().strip().splitlines()[-1][:2000]}
  return report


def train_model(fields: dict, sizes: Sizes, budget: Budget, peak: float | None, skipped: list, name: str) -> dict:
  """One model size's variants, compiled, then timed in alternation."""
  batch, seq = sizes.train_batch
  runs, facts = {}, {}
  for variant, extra in TRAIN_VARIANTS.items():
    if budget.spent():
      skipped.append(f"{name} {variant}")
      continue
    cfg = lm_config(fields, **extra)
    facts[variant], runs[variant] = build_train_step(cfg, batch, seq)
    facts[variant]["flops_per_token"] = 6 * facts[variant]["params"] + 6 * cfg.num_layers * cfg.d_model * seq
  model = {"config": {**fields, "num_kv_heads": fields["num_heads"]}, "variants": {}}
  if not runs:
    return model
  times = alternating_seconds(runs, sizes.train_repeats)
  if sizes.trace_dir and name == next(iter(sizes.train_models)) and "pre" in runs and not budget.spent():
    trace = os.path.join(sizes.trace_dir, "train_trace.json.gz")
    model["trace"] = perfetto_trace(runs["pre"], trace)  # one Pre-Norm step: where the time goes
    model["trace_device_ops_top30"] = trace_kernel_times(trace, top=30)
  del runs
  gc.collect()
  for variant, f in facts.items():
    seconds = statistics.median(times[variant])
    entry = dict(f, step_ms=round(seconds * 1e3, 1), tokens_per_sec=round(batch * seq / seconds))
    tflops = f["flops_per_token"] * batch * seq / seconds / 1e12
    entry["model_tflops"] = round(tflops, 1)
    if peak:
      entry["mfu"] = round(tflops / peak, 3)
    model["variants"][variant] = entry
  if "pre" in facts:
    model["step_time_vs_pre"] = {v: round(e["step_ms"] / model["variants"]["pre"]["step_ms"], 3)
                                 for v, e in model["variants"].items() if v != "pre"}
  return model


# --- sampler and GRPO step beside HF generate ------------------------------------------------------------------------

def start_peers(sizes: Sizes, cfg_fields: dict, batch: int, prompt: int, new: int, log_dir: str) -> list[Peer]:
  """The torch CUDA `generate` peers (eager, static cache) as persistent processes, building while jaxpt compiles."""
  if not sizes.peers:
    return []
  dims = [cfg_fields["d_model"], cfg_fields["num_layers"], cfg_fields["num_heads"],
          cfg_fields.get("num_kv_heads") or cfg_fields["num_heads"], cfg_fields["mlp_dim"], cfg_fields["vocab_size"]]
  peers = []
  for mode in ("eager", "static"):
    stderr = open(os.path.join(log_dir, f"peer_{mode}.log"), "w")  # noqa: SIM115 -- kept open for the process
    peers.append(Peer(f"hf_{mode}", [sys.executable, TORCH_PEER, mode, *map(str, [batch, prompt, new, *dims])],
                      stderr=stderr))
  return peers


def ready_peers(peers: list[Peer], timeout: float, errors: dict) -> list[Peer]:
  """The peers that printed `ready` within `timeout` seconds (the rest are killed, their reason in `errors`)."""
  ready = []
  for peer in peers:
    outcome = {}
    waiter = threading.Thread(target=lambda p=peer: outcome.setdefault("error", _ready_error(p)))
    waiter.start()
    waiter.join(max(1.0, timeout))
    if waiter.is_alive():
      peer.proc.kill()
      waiter.join()
      errors[peer.name] = f"not ready within {timeout:.0f} s"
    elif outcome["error"]:
      errors[peer.name] = outcome["error"]
    else:
      ready.append(peer)
  return ready


def _ready_error(peer: Peer) -> str:
  try:
    peer.wait_ready()
    return ""
  except RuntimeError as e:
    return str(e)


def peer_log_tail(log_dir: str, peer: str) -> str:
  path = os.path.join(log_dir, f"peer_{peer.removeprefix('hf_')}.log")
  with open(path) as f:
    return f.read()[-1500:]


def sampler(sizes: Sizes, budget: Budget) -> dict:
  batch, prompt, new = sizes.sampler
  fields = next(iter(sizes.train_models.values()))
  report = {"batch": batch, "prompt": prompt, "new_tokens": new, "model": fields, "rollout_dtype": "bfloat16",
            "sampling": "temperature 1, no top-k/top-p, no EOS", "peer_errors": {}}
  if budget.spent():
    return dict(report, skipped=["all"])
  with tempfile.TemporaryDirectory() as logs:
    peers = start_peers(sizes, fields, batch, prompt, new, logs)
    cfg = lm_config(fields, norm_scheme="pre")
    params = init_params(cfg, jax.random.PRNGKey(0))
    runs = {"call": sampler_run(cfg, params, batch, prompt, new, "bfloat16"),
            "prefill": sampler_run(cfg, params, batch, prompt, 1, "bfloat16")}
    for fn in runs.values():
      jax.block_until_ready(fn())
    peers = ready_peers(peers, min(240.0, budget.left()), report["peer_errors"])
    for name in report["peer_errors"]:
      report["peer_errors"][name] += " | " + peer_log_tail(logs, name)
    times = collections.defaultdict(list)
    for r in range(sizes.rounds):
      for key, fn in runs.items():
        times[key].append(timed(fn))
      for peer in peers:
        times[peer.name].append(peer.seconds(r + 1))
    for peer in peers:
      report.setdefault("peer_settings", {})[peer.name] = peer.setting
      peer.close()
  med = {k: statistics.median(v) for k, v in times.items()}
  step = (med["call"] - med["prefill"]) / max(new - 1, 1)
  report["jaxpt"] = {"params": param_count(params), "call_ms": round(med["call"] * 1e3, 1),
                     "prefill_ms": round(med["prefill"] * 1e3, 1), "decode_step_ms": round(step * 1e3, 3),
                     "new_tokens_per_sec": round(batch * new / med["call"])}
  report["peers"] = {p: {"call_ms": round(med[p] * 1e3, 1), "new_tokens_per_sec": round(batch * new / med[p]),
                         "speedup_jaxpt_over_peer": round(statistics.median(
                             a / b for a, b in zip(times[p], times["call"])), 2)}
                     for p in med if p.startswith("hf_")}
  return report


def grpo_step(sizes: Sizes, budget: Budget) -> dict:
  """`benchmarks/grpo_step.py`'s measurement (bf16 and fp32 rollouts) with HF generate of the same rollouts."""
  from benchmarks import grpo_step as grpo_bench  # the GRPO trainer imports tensorflow_datasets (carried wheels)
  from jaxpt.train.grpo import build_grpo
  if budget.spent():
    return {"skipped": ["all"]}
  config = grpo_bench.grpo_config("pre")
  config.update_from_flattened_dict(sizes.grpo_overrides)
  report = {"config": config.to_dict(), "peer_errors": {}}
  rows = config.data.prompts_per_step * config.grpo.group_size
  with tempfile.TemporaryDirectory() as workdir:
    peers = start_peers(sizes, config.model.to_dict(), rows, config.data.max_prompt_len, config.sampling.max_new_tokens,
                        workdir)
    base = build_grpo(config, os.path.join(workdir, "run"))
    state, batch = base.init_state(), base.prompts.batch(0)
    clock = collections.Counter()
    trainers = {dtype: grpo_bench.timed_trainer(base, clock, dtype) for dtype in ("bfloat16", "float32")}
    for trainer in trainers.values():  # compiles
      trainer.train_step(state, batch)
    peers = ready_peers(peers, min(240.0, budget.left()), report["peer_errors"])
    results = collections.defaultdict(list)
    for r in range(sizes.rounds):
      for dtype, trainer in trainers.items():
        results[dtype].append(grpo_bench.timed_step(trainer, clock, state, batch))
      for peer in peers:
        results[peer.name].append({"rollout": peer.seconds(r + 1)})
    for peer in peers:
      peer.close()
  for key, rs in results.items():
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    report[key] = {f"{k}_s": round(v, 3) for k, v in med.items() if k != "response_length"}
    if "step" in med:
      report[key]["share"] = {k: round(med[k] / med["step"], 3) for k in ("rollout", "scoring", "update")}
      report[key]["response_length"] = med["response_length"]
  for peer in (k for k in results if k.startswith("hf_")):
    report[f"rollout_bfloat16_vs_{peer}"] = round(report[peer]["rollout_s"] / report["bfloat16"]["rollout_s"], 2)
  return report


# --- driver --------------------------------------------------------------------------------------------------------

SECTIONS = {"kernel_numerics": kernel_numerics, "two_stream_norm": two_stream_norm, "kernel_tuning": kernel_tuning,
            "train_step": train_step, "grpo_step": grpo_step, "sampler": sampler}


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
  if name == "grpo_step":
    return {k: v for k, v in report.items() if k.startswith("rollout_") or k in ("bfloat16", "float32")}
  return {}


def pack_traces(out: str) -> list[str]:
  """Moves the sections' Perfetto traces into one `out/traces.tar` (the device returns at most 8 files)."""
  import tarfile
  traces = sorted(f for f in os.listdir(out) if f.endswith(".trace.json.gz") or f.endswith("_trace.json.gz"))
  if traces:
    with tarfile.open(os.path.join(out, "traces.tar"), "w") as tar:
      for name in traces:
        tar.add(os.path.join(out, name), arcname=name)
    for name in traces:
      os.remove(os.path.join(out, name))
  return traces


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.environ.get("OUT", "device_check_out"))
  parser.add_argument("--budget-s", type=float, default=450.0, help="no new measurement starts after this")
  parser.add_argument("--sections", default=",".join(SECTIONS))
  parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU, no peers (the test suite's run)")
  parser.add_argument("--compile-cache", default="", help="JAX's persistent compilation cache folder: a later call "
                      "on the same machine reuses the compiles (e.g. an ignored folder in the repository)")
  args = parser.parse_args(argv)
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before JAX's first allocation: peers share the GPU
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
  for name in args.sections.split(","):
    start = time.perf_counter()
    try:
      report = SECTIONS[name](sizes, budget)
      status = {"status": "ok", "headline": headline(name, report)}
    except Exception:  # noqa: BLE001 -- one section's failure is recorded and the next one runs
      report = {"error": traceback.format_exc()}
      status = {"status": "error", "error": traceback.format_exc().strip().splitlines()[-1]}
    status["seconds"] = round(time.perf_counter() - start, 1)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
      json.dump(dict(report, seconds=status["seconds"]), f, indent=1)
    summary["sections"][name] = status
    print(f"{name}: {status['status']} in {status['seconds']} s", flush=True)
  summary["traces"] = pack_traces(args.out)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps(summary, indent=1))
  return 0 if all(s["status"] == "ok" for s in summary["sections"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
