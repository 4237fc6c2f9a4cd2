"""The weight gradient's layout in `jaxpt.nn.dense.matmul`'s backward pass, timed in the whole train step.

    python -m benchmarks.dense_backward [--scheme pre] [--dtype float32|bfloat16] [--rounds 8]
                                        [--layers scanned,unrolled]

dw = x^T g for x [tokens, k], g [tokens, n], two ways: `direct` (jaxpt's: one dot contracting both operands'
leading `tokens` axis) and `transposed_copy` (the earlier one: a copy of x^T kept by `lax.optimization_barrier`,
then a plain dot). For each layer layout (`scanned`: the models' default `scan_layers=True`; `unrolled`:
`benchmarks/train_step.py`'s) both train steps are compiled (that benchmark's model and batch) and timed in
alternation, one step each per round; `direct_over_transposed_copy` is the median over rounds of the ratio of their
step seconds (below 1: the direct dot is faster). Prints one JSON.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

reuse_freed_host_memory()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from benchmarks import train_step  # noqa: E402
from benchmarks.common import alternating_seconds, machine_info, median_ratio  # noqa: E402
from jaxpt.nn import dense  # noqa: E402


def transposed_copy_backward(out_dtype, residuals, g):
  """`dense.matmul`'s backward with dw from a materialised copy of x^T (jaxpt's until 8581039)."""
  x, w = residuals
  x_transposed = lax.optimization_barrier(x.T)
  return (jnp.dot(g, w.T, preferred_element_type=jnp.float32).astype(x.dtype),
          jnp.dot(x_transposed, g, preferred_element_type=jnp.float32).astype(w.dtype))


def compile_both(scheme: str, dtype: str, scan_layers: bool) -> dict:
  """{"direct", "transposed_copy"}: each a `run()` of one train step compiled with that backward."""
  runs = {"direct": train_step.compile_scheme(scheme, dtype=dtype, scan_layers=scan_layers)[1]}
  dense.matmul.defvjp(dense._matmul_fwd, transposed_copy_backward)
  try:
    runs["transposed_copy"] = train_step.compile_scheme(scheme, dtype=dtype, scan_layers=scan_layers)[1]
  finally:
    dense.matmul.defvjp(dense._matmul_fwd, dense._matmul_bwd)
  return runs


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scheme", default="pre")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--layers", default="scanned,unrolled")
  args = parser.parse_args(argv)
  unknown = set(args.layers.split(",")) - {"scanned", "unrolled"}
  if unknown:
    parser.error(f"--layers: unknown {', '.join(sorted(unknown))} (known: scanned, unrolled)")
  report = {"benchmark": "dense_backward", "scheme": args.scheme, "dtype": args.dtype, "rounds": args.rounds}
  for layers in args.layers.split(","):
    times = alternating_seconds(compile_both(args.scheme, args.dtype, scan_layers=layers == "scanned"), args.rounds)
    report[layers] = {
        "step_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "seconds": {k: [round(s, 3) for s in v] for k, v in times.items()},
        "direct_over_transposed_copy": round(median_ratio(times["direct"], times["transposed_copy"]), 3)}
  report.update(**machine_info(),
                command=" ".join(["python -m benchmarks.dense_backward", *(sys.argv[1:] if argv is None else argv)]))
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
