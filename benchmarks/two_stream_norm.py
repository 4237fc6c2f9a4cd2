"""Fused two-stream-norm boundary (kernels/two_stream_norm) vs the unfused XLA path, side by side.

    python -m benchmarks.two_stream_norm [--rows 16384] [--dims 1024,2048,4096] [--dtype bfloat16]
                                         [--norm rmsnorm] [--repeats 20]

The boundary (siamese_post_pre / hybrid_pre middle): p = xh_prev + z/c ; xh = LN_post(p) ; y = y_prev + z ;
h = LN_in(xh + LN_pre(y)), on `[rows, d]` rows. Per d it reports forward and forward+backward:
- `xla`: the reference op sequence under jit (XLA fuses what it can); bytes = XLA's compiled cost_analysis();
- `pallas`: the fused kernels; bytes = the kernels' own reads/writes (rows, row statistics, weight partials);
- on GPU/TPU: median times, achieved bytes/s, % of the device's peak memory bandwidth, and xla/pallas ratios.
On CPU the kernels run in interpret mode, whose timings mean nothing: it prints the byte counts only.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from benchmarks.common import median_seconds
from jaxpt.kernels.two_stream_norm import layout
from jaxpt.kernels.two_stream_norm import post_pre_boundary

EPS = 1e-5
# d-wide row passes per token per boundary (spec, "Hot path"): unfused ops vs one fused kernel
THEORETICAL_PASSES = {"unfused_fwd_plus_bwd": 34, "fused_fwd_plus_bwd_spec": 12,
                      "fused_this_kernel": {"fwd": "3 reads + 3 writes = 6", "bwd": "6 reads + 3 writes = 9"}}
PEAK_BANDWIDTH_GBS = {  # device_kind substring -> HBM bandwidth, GB/s (vendor figures)
    "H200": 4800, "H100": 3350, "A100": 2039, "L4": 300, "A10": 600,
    "TPU v6": 1640, "TPU v5p": 2765, "TPU v5 lite": 819, "TPU v5e": 819, "TPU v4": 1200,
}


def peak_bandwidth(device) -> float | None:
  kind = device.device_kind
  return next((bw for name, bw in PEAK_BANDWIDTH_GBS.items() if name in kind), None)


def inputs(rows: int, d: int, dtype, norm: str):
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  row = lambda k: jax.random.normal(k, (rows, d), jnp.float32).astype(dtype)
  params = lambda k: dict({"scale": 1.0 + 0.1 * jax.random.normal(k, (d,))},
                          **({"bias": jnp.zeros((d,))} if norm == "layernorm" else {}))
  rows_in = [row(k) for k in keys[:3]]
  cotangents = [row(k) for k in keys[3:6]]
  return rows_in, [params(k) for k in keys[:3]], jnp.float32(2.0), cotangents


def paths(impl: str):
  def forward(xp, yp, z, c, norms):
    return post_pre_boundary(xp, yp, z, c, *norms, eps=EPS, impl=impl)

  def forward_backward(xp, yp, z, c, norms, cts):
    outs, vjp = jax.vjp(forward, xp, yp, z, c, norms)
    return outs, vjp(tuple(cts))

  return jax.jit(forward), jax.jit(forward_backward)


def kernel_bytes(rows: int, d: int, itemsize: int, platform: str) -> dict:
  """What the fused kernels read and write: forward xh_prev, y_prev, z -> xh, y, h + statistics; backward
  xh_prev, z, y, statistics, dxh, dy, dh -> dxh_prev, dy_prev, dz + per-block weight partials."""
  plan = layout.make_plan(rows, d, platform, itemsize=itemsize)
  row = plan.rows_pad * plan.d_pad * itemsize
  stats = plan.rows_pad * layout.SLOTS * 4
  params = layout.SLOTS * plan.d_pad * 4
  forward = 6 * row + stats + params
  backward = 9 * row + stats + params + plan.grid * layout.SLOTS * plan.d_pad * 4
  return {"fwd": forward, "fwd_bwd": forward + backward}


def xla_bytes(fn, *args) -> float:
  analysis = fn.lower(*args).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis.get("bytes accessed", float("nan")))


def bench_dim(rows: int, d: int, dtype, norm: str, repeats: int, timed: bool) -> dict:
  rows_in, norms, c, cts = inputs(rows, d, dtype, norm)
  itemsize = jnp.dtype(dtype).itemsize
  row_bytes = rows * d * itemsize
  xla_fwd, xla_fb = paths("reference")
  pallas_fwd, pallas_fb = paths("pallas")
  xla = {"fwd": xla_bytes(xla_fwd, *rows_in, c, norms), "fwd_bwd": xla_bytes(xla_fb, *rows_in, c, norms, cts)}
  fused = kernel_bytes(rows, d, itemsize, None)
  result = {"d": d, "bytes": {
      "xla": xla, "pallas": fused,
      "row_passes": {path: {k: round(v / row_bytes, 2) for k, v in b.items()}
                     for path, b in (("xla", xla), ("pallas", fused))},
      "xla_over_pallas": {k: round(xla[k] / fused[k], 3) for k in xla}}}
  if not timed:
    return result
  peak = peak_bandwidth(jax.devices()[0])
  times = {
      "xla": {"fwd": median_seconds(lambda: xla_fwd(*rows_in, c, norms), repeats, warmup=2),
              "fwd_bwd": median_seconds(lambda: xla_fb(*rows_in, c, norms, cts), repeats, warmup=2)},
      "pallas": {"fwd": median_seconds(lambda: pallas_fwd(*rows_in, c, norms), repeats, warmup=2),
                 "fwd_bwd": median_seconds(lambda: pallas_fb(*rows_in, c, norms, cts), repeats, warmup=2)},
  }
  result["time_ms"] = {p: {k: round(v * 1e3, 4) for k, v in t.items()} for p, t in times.items()}
  achieved = {p: {k: (xla if p == "xla" else fused)[k] / t[k] / 1e9 for k in t} for p, t in times.items()}
  result["achieved_GBps"] = {p: {k: round(v, 1) for k, v in a.items()} for p, a in achieved.items()}
  if peak:
    result["pct_of_peak_bandwidth"] = {p: {k: round(100 * v / peak, 1) for k, v in a.items()}
                                       for p, a in achieved.items()}
  result["speedup_xla_over_pallas"] = {k: round(times["xla"][k] / times["pallas"][k], 3) for k in times["xla"]}
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=16384)
  parser.add_argument("--dims", default="1024,2048,4096")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--norm", default="rmsnorm", choices=("rmsnorm", "layernorm"))
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args(argv)
  platform = layout.resolve_platform()
  device = jax.devices()[0]
  timed = platform != "interpret"
  report = {
      "benchmark": "two_stream_norm post_pre boundary, fused Pallas vs unfused XLA",
      "backend": jax.default_backend(), "device": device.device_kind, "kernel_lowering": platform,
      "rows": args.rows, "dtype": args.dtype, "norm": args.norm,
      "peak_bandwidth_GBps": peak_bandwidth(device), "theoretical_row_passes": THEORETICAL_PASSES,
      "results": [bench_dim(args.rows, int(d), jnp.dtype(args.dtype), args.norm, args.repeats, timed)
                  for d in args.dims.split(",")],
  }
  if not timed:
    report["note"] = ("CPU: the Pallas kernels run in interpret mode, so timings are not meaningful and are "
                      "not taken; bytes are XLA's compiled cost_analysis() for the unfused reference path and "
                      "the fused kernels' own reads/writes.")
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
