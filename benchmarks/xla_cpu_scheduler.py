"""XLA:CPU's concurrency-optimized scheduler on and off, per residual scheme, one train step of
`benchmarks/train_step.py`'s model: both compiles in one process (per-compile XLA options), timed in alternation.
Prints one JSON object.

    python -m benchmarks.xla_cpu_scheduler [--schemes pre,post] [--scan] [--rounds 5]

Why: a trace of a scanned Post-Norm step (`tools/step_profile.py`) had 58% of its matmul time running beside other
ops on the other core, against Pre-Norm's 18%; XLA:CPU runs independent ops at once, and its scheduler
(`xla_cpu_enable_concurrency_optimized_scheduler`, on by default) orders the ops for that. `off_vs_on` is the median
over rounds of the step's seconds with it off over with it on; `vs_first_scheme` the same of each scheme's step
over the first scheme's, with the scheduler on and off.

First runs (the Xeon 6/207/2, 5 rounds, steps varying 2.7-5.4 s between rounds): unrolled
(`results_xla_cpu_scheduler_cpu_6-207-2.json`) off_vs_on 1.008 for Pre-Norm and 0.933 for Post-Norm, Post / Pre
1.051 on and 0.953 off; scanned (`results_xla_cpu_scheduler_scan_cpu_6-207-2.json`) 0.969 and 0.989, Post / Pre
1.026 on and 1.13 off. No setting is shown better at this noise: a lead for Post-Norm unrolled, not a change.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import shlex
import sys

from benchmarks.common import alternating_seconds, machine_info, median_ratio
from benchmarks.train_step import MODEL, compile_scheme

SCHEDULER = {"on": {}, "off": {"xla_cpu_enable_concurrency_optimized_scheduler": False}}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--schemes", default="pre,post")
  parser.add_argument("--scan", action="store_true", help="stack the layers with nn.scan (the models' default)")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  schemes = args.schemes.split(",")
  runs = {(scheme, setting): compile_scheme(scheme, compiler_options=options, scan_layers=args.scan)[1]
          for scheme in schemes for setting, options in SCHEDULER.items()}
  times = alternating_seconds(runs, args.rounds, warmup=2)
  report = {"benchmark": "xla_cpu_scheduler", "config": dict(MODEL, scan_layers=args.scan), **machine_info(),
            "command": "python -m benchmarks.xla_cpu_scheduler " + shlex.join(sys.argv[1:] if argv is None else argv),
            "rounds": args.rounds,
            "step_s": {f"{s}_{o}": [round(t, 3) for t in times[s, o]] for s, o in runs},
            "off_vs_on": {s: round(median_ratio(times[s, "off"], times[s, "on"]), 3) for s in schemes},
            "vs_first_scheme": {o: {s: round(median_ratio(times[s, o], times[schemes[0], o]), 3) for s in schemes[1:]}
                                for o in SCHEDULER}}
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
