"""Where one train step's time goes on this CPU, per residual scheme: a `jax.profiler` trace of one step of
`benchmarks/train_step.py`'s model (after warm-up), its XLA ops grouped by kind, and how much of the matmuls' time
(XLA:CPU's YNNPACK `ynn_fusion`s) other ops ran beside them on the other core. Prints one JSON object.

    python -m tools.step_profile [--schemes pre,post] [--scan] [--top 12]

Why: Post-Norm runs the same matmuls as Pre-Norm, yet its step took 1.11x Pre-Norm's on one Xeon and 0.97x on
another (README). On the first, with scanned layers (`benchmarks/results_step_profile_scan_cpu_6-207-2.json`,
`--scan`), 58% of Post-Norm's matmul time ran beside another op on the other core against 18% of Pre-Norm's, and
its matmuls summed 3424 ms against 2235 (in an ad-hoc trace the same [2048, 512] x [512, 2048] MLP matmul took 45
ms a call in Post-Norm, 21 ms in Pre-Norm; two runs of this tool gave 59% / 18% and 58% / 18%): XLA:CPU ran
independent ops at once, and each YNNPACK matmul, already spread over both cores, then shared them. With unrolled
layers (`benchmarks/results_step_profile_cpu_6-207-2.json`, the train-step benchmark's layout) the two are close:
overlap 42% and 36%; one traced step varies by a quarter between runs (Pre-Norm's ops 3217 ms in one, 4267 in the
committed one), so one trace says where time goes, not which scheme is faster. `matmul.overlapped_fraction` is the
share above. The trace undercounts the matmuls that XLA:CPU leaves to Eigen (the weight gradients, which contract
over tokens: a third of the step's FLOPs at d512): their events are ~0.2 ms launches, the work runs on Eigen's
pool unseen. `benchmarks/train_step.py`'s `pre_dot_pass` times every matmul of the step instead.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import collections
import json
import os
import re
import shlex
import sys
import tempfile

import jax

from benchmarks.common import machine_info
from benchmarks.train_step import MODEL, compile_scheme
from tools.device_traces import overlapped_fraction, perfetto_trace, trace_kernel_times

MATMUL = "ynn_fusion"  # XLA:CPU's name for the matmul fusions it hands to YNNPACK


def op_kind(name: str) -> str:
  """An XLA op's kind: its name without the numeric suffixes (`ynn_fusion.38` -> `ynn_fusion`)."""
  return re.sub(r"(\.\d+)+$", "", name)


def profile(scheme: str, scan: bool, top: int, trace_dir: str) -> dict:
  """One traced step of `scheme` (two untimed steps first): its ops' summed ms by kind (the `top` largest) and the
  matmuls' overlap."""
  _, run = compile_scheme(scheme, scan_layers=scan)
  for _ in range(2):
    jax.block_until_ready(run())
  path = os.path.join(trace_dir, f"{scheme}.trace.json.gz")
  perfetto_trace(run, path)
  kinds = collections.Counter()
  for name, op in trace_kernel_times(path).items():
    kinds[op_kind(name)] += op["total_ms"]
  return {"ops_ms": round(sum(kinds.values()), 1), "matmul": overlapped_fraction(path, MATMUL),
          "by_kind_ms": {kind: round(ms, 1) for kind, ms in kinds.most_common(top)}}


def step_tool_args(argv, doc: str, top: int, top_help: str) -> argparse.Namespace:
  """The flags of a train-step tool (this one, `tools/step_bytes.py`): --schemes, --scan, --top."""
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--schemes", default="pre,post")
  parser.add_argument("--scan", action="store_true", help="stack the layers with nn.scan (the models' default)")
  parser.add_argument("--top", type=int, default=top, help=top_help)
  return parser.parse_args(argv)


def step_tool_report(tool: str, args: argparse.Namespace, argv) -> dict:
  """A train-step tool's JSON header: its name, the model config, the machine and the command."""
  return {"tool": tool, "config": dict(MODEL, scan_layers=args.scan), **machine_info(),
          "command": f"python -m tools.{tool} " + shlex.join(sys.argv[1:] if argv is None else argv)}


def main(argv=None) -> None:
  args = step_tool_args(argv, __doc__, 12, "op kinds listed per scheme")
  report = step_tool_report("step_profile", args, argv)
  with tempfile.TemporaryDirectory() as trace_dir:
    report["schemes"] = {s: profile(s, args.scan, args.top, trace_dir) for s in args.schemes.split(",")}
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
