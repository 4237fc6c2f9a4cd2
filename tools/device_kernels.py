"""`tools/device_check`'s kernel sections: the fused two-stream norm's numerics on the device, its speed beside XLA
and tokamax (with a trace of both), and Triton tilings other than the default plan's."""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import two_stream_norm as tsn
from benchmarks.common import median_seconds
from tools.device_traces import perfetto_trace, trace_kernel_times

if TYPE_CHECKING:
  from tools.device_check import Budget, Sizes


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


def kernel_trace(sizes: Sizes, out_dir: str, d: int = 4096) -> str:
  """A trace of three chained forward+backward calls each of the Pallas and XLA paths at bf16, d = `d`, in
  `out_dir/kernel_trace.json.gz`: the device time of each kernel, to see what limits it."""
  rows_in, norms, c, cts = tsn.inputs(sizes.norm_rows, d, jnp.bfloat16, "rmsnorm")
  runs = [tsn.chained(impl, sizes.norm_chain)[1] for impl in ("pallas", "reference")]
  return perfetto_trace(lambda: [run(*rows_in, c, norms, cts) for run in runs for _ in range(3)],
                        os.path.join(out_dir, "kernel_trace.json.gz"))


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

