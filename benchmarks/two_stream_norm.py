"""Fused two-stream-norm boundary (kernels/two_stream_norm) vs the unfused XLA path, side by side.

    python -m benchmarks.two_stream_norm [--rows 16384] [--dims 1024,2048,4096] [--dtype bfloat16]
                                         [--norm rmsnorm] [--repeats 20] [--chain 10] [--tokamax]

The boundary (siamese_post_pre / hybrid_pre middle): p = xh_prev + z/c ; xh = LN_post(p) ; y = y_prev + z ;
h = LN_in(xh + LN_pre(y)), on `[rows, d]` rows. Per d it reports forward and forward+backward:
- `xla`: the reference op sequence under jit (XLA fuses what it can); bytes = XLA's compiled cost_analysis();
- `pallas`: the fused kernels; bytes = the kernels' own reads/writes (rows, row statistics, weight partials);
- `tokamax` (with --tokamax, GPU only): the same boundary with tokamax's Triton norm (`tokamax.layer_norm`, the JAX
  team's Pallas kernel library) for each of the three norms and XLA for the adds, as a peer;
- on GPU/TPU: median times, achieved bytes/s, % of the device's peak memory bandwidth, and xla/pallas ratios.
A timed call runs the boundary `--chain` times in one jitted `fori_loop`, each iteration's outputs (forward) or
input gradients (forward+backward) feeding the next (as layers do), so a sub-millisecond kernel is not timed
together with the host's dispatch; the time reported is per boundary.
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


def tokamax_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, *, eps: float):
  """The boundary with tokamax's Triton norms (RMSNorm, or LayerNorm when the params hold a bias)."""
  import tokamax

  def norm(params, x):
    return tokamax.layer_norm(x, params["scale"], params.get("bias"), epsilon=eps, subtract_mean="bias" in params,
                              implementation="triton")

  inv_c = (1.0 / jnp.asarray(c, jnp.float32)).astype(xh_prev.dtype)
  xh, y = norm(post, xh_prev + z * inv_c), y_prev + z
  return xh, y, norm(in_norm, xh + norm(pre, y))


def paths(impl: str, **tiling):
  """(forward, forward_backward) of the boundary by `impl` ('reference' = XLA, 'pallas', 'tokamax'), unjitted;
  `tiling` (block_rows, chunk_rows, num_warps) goes to the Pallas kernels."""
  def forward(xp, yp, z, c, norms):
    if impl == "tokamax":
      return tokamax_boundary(xp, yp, z, c, *norms, eps=EPS)
    return post_pre_boundary(xp, yp, z, c, *norms, eps=EPS, impl=impl, **tiling)

  def forward_backward(xp, yp, z, c, norms, cts):
    outs, vjp = jax.vjp(forward, xp, yp, z, c, norms)
    return outs, vjp(tuple(cts))

  return forward, forward_backward


def chained(impl: str, iterations: int, **tiling):
  """(forward, forward_backward), jitted, each running the boundary `iterations` times in a `fori_loop`: the
  forward's outputs (xh, y, h) are the next iteration's (xh_prev, y_prev, z); forward+backward feeds the input
  gradients (dxh_prev, dy_prev, dz) back as inputs and sums the norm-weight gradients. `tiling`: see `paths`."""
  forward, forward_backward = paths(impl, **tiling)

  def run_forward(xp, yp, z, c, norms):
    return jax.lax.fori_loop(0, iterations, lambda _, rows: tuple(forward(*rows, c, norms)), (xp, yp, z))

  def run_forward_backward(xp, yp, z, c, norms, cts):
    def body(_, carry):  # the norm-weight gradients are summed, so none of the backward is dead code
      rows, weight_grads = carry
      grads = forward_backward(*rows, c, norms, cts)[1]
      return tuple(grads[:3]), jax.tree_util.tree_map(jnp.add, weight_grads, grads[4])

    return jax.lax.fori_loop(0, iterations, body, ((xp, yp, z), jax.tree_util.tree_map(jnp.zeros_like, norms)))

  return jax.jit(run_forward), jax.jit(run_forward_backward)


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


def bench_dim(rows: int, d: int, dtype, norm: str, repeats: int, timed: bool, chain: int = 10,
              peers: tuple[str, ...] = ()) -> dict:
  """Bytes (and, when `timed`, times) of the boundary on `[rows, d]` for XLA, Pallas and each of `peers`."""
  rows_in, norms, c, cts = inputs(rows, d, dtype, norm)
  itemsize = jnp.dtype(dtype).itemsize
  row_bytes = rows * d * itemsize
  xla_fwd, xla_fb = map(jax.jit, paths("reference"))
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
  times = {}
  for path, impl in [("xla", "reference"), ("pallas", "pallas"), *[(p, p) for p in peers]]:
    fwd, fwd_bwd = chained(impl, chain)
    times[path] = {"fwd": median_seconds(lambda: fwd(*rows_in, c, norms), repeats, warmup=2) / chain,
                   "fwd_bwd": median_seconds(lambda: fwd_bwd(*rows_in, c, norms, cts), repeats, warmup=2) / chain}
  result["time_ms"] = {p: {k: round(v * 1e3, 4) for k, v in t.items()} for p, t in times.items()}
  # a peer's bytes are not its own count: it is given the fused kernels' (the least any implementation must move)
  achieved = {p: {k: (xla if p == "xla" else fused)[k] / t[k] / 1e9 for k in t} for p, t in times.items()}
  result["achieved_GBps"] = {p: {k: round(v, 1) for k, v in a.items()} for p, a in achieved.items()}
  if peak:
    result["pct_of_peak_bandwidth"] = {p: {k: round(100 * v / peak, 1) for k, v in a.items()}
                                       for p, a in achieved.items()}
  for path in times:
    if path != "pallas":
      result[f"speedup_{path}_over_pallas"] = {k: round(times[path][k] / times["pallas"][k], 3)
                                               for k in times[path]}
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=16384)
  parser.add_argument("--dims", default="1024,2048,4096")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--norm", default="rmsnorm", choices=("rmsnorm", "layernorm"))
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--chain", type=int, default=10, help="boundaries per timed call (see above)")
  parser.add_argument("--tokamax", action="store_true", help="time tokamax's Triton norms too (GPU)")
  args = parser.parse_args(argv)
  platform = layout.resolve_platform()
  device = jax.devices()[0]
  timed = platform != "interpret"
  report = {
      "benchmark": "two_stream_norm post_pre boundary, fused Pallas vs unfused XLA",
      "backend": jax.default_backend(), "device": device.device_kind, "kernel_lowering": platform,
      "rows": args.rows, "dtype": args.dtype, "norm": args.norm,
      "peak_bandwidth_GBps": peak_bandwidth(device), "theoretical_row_passes": THEORETICAL_PASSES,
      "chain": args.chain,
      "results": [bench_dim(args.rows, int(d), jnp.dtype(args.dtype), args.norm, args.repeats, timed, args.chain,
                            ("tokamax",) if args.tokamax else ())
                  for d in args.dims.split(",")],
  }
  if not timed:
    report["note"] = ("CPU: the Pallas kernels run in interpret mode, so timings are not meaningful and are "
                      "not taken; bytes are XLA's compiled cost_analysis() for the unfused reference path and "
                      "the fused kernels' own reads/writes.")
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
