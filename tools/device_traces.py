"""Profiler traces for `tools/device_check`: take one (Perfetto JSON), sum its ops, pack them for the trip back."""

from __future__ import annotations

import bisect
import collections
import json
import os
import shutil
import tempfile
from typing import Callable

import jax


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


def trace_events(path: str) -> list[dict]:
  """The events of a Perfetto JSON trace (gzipped), whether the file holds {"traceEvents": [...]} or the list."""
  import gzip
  with gzip.open(path) as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def trace_kernel_times(path: str, top: int | None = None) -> dict:
  """{op name: {calls, total_ms}} of the device ops in a Perfetto trace, longest first (the `top` longest); a CPU
  trace has no device: there, the XLA ops (events naming an `hlo_op`)."""
  events = trace_events(path)
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and e["args"]["name"].startswith("/device:")}
  is_op = ((lambda e: e["pid"] in devices) if devices else (lambda e: "hlo_op" in e.get("args", {})))
  times = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and is_op(e):
      times[e["name"]].append(e["dur"] / 1e3)
  ranked = sorted(times.items(), key=lambda kv: -sum(kv[1]))
  return {name: {"calls": len(t), "total_ms": round(sum(t), 3)} for name, t in ranked[:top]}


def overlapped_fraction(path: str, prefix: str) -> dict:
  """How much of the time of the ops named `prefix*` (e.g. XLA:CPU's "ynn_fusion" matmuls) another op ran beside
  them on another thread, in a CPU Perfetto trace (events naming an `hlo_op`): {"ms": their summed time,
  "overlapped_fraction": the share of it covered by other threads' ops}. XLA:CPU runs independent ops at once, and a
  matmul that already spreads over every core then shares them: its time per call grows."""
  ops = sorted((e for e in trace_events(path) if e.get("ph") == "X" and "hlo_op" in e.get("args", {})),
               key=lambda e: e["ts"])
  starts = [o["ts"] for o in ops]
  total = covered = 0.0
  for op in ops:
    if not op["name"].startswith(prefix):
      continue
    start, end = op["ts"], op["ts"] + op["dur"]
    total += op["dur"]
    spans = sorted((max(start, o["ts"]), min(end, o["ts"] + o["dur"])) for o in ops[:bisect.bisect_left(starts, end)]
                   if o["tid"] != op["tid"] and o["ts"] + o["dur"] > start)
    reach = start
    for a, b in spans:  # the union of the other threads' spans inside [start, end)
      covered += max(0.0, b - max(a, reach))
      reach = max(reach, b)
  return {"ms": round(total / 1e3, 3), "overlapped_fraction": round(covered / total, 3) if total else 0.0}


def pack_traces(out: str) -> list[str]:
  """Moves the sections' Perfetto traces into one `out/traces.tar` (the device returns at most 8 files)."""
  return _pack(out, "traces.tar", lambda f: f.endswith((".trace.json.gz", "_trace.json.gz")))


def pack_sections(out: str) -> list[str]:
  """Moves the sections' JSONs (every `*.json` but `summary.json`) into one `out/sections.tar`: seven sections, the
  summary and the traces would be nine files, one more than the device returns."""
  return _pack(out, "sections.tar", lambda f: f.endswith(".json") and f != "summary.json")


def _pack(out: str, tar_name: str, wanted: Callable[[str], bool]) -> list[str]:
  """Moves the files of `out` whose names are `wanted` into `out/tar_name` (appending to it); their names."""
  import tarfile
  names = sorted(f for f in os.listdir(out) if wanted(f))
  if names:
    with tarfile.open(os.path.join(out, tar_name), "a") as tar:
      for name in names:
        tar.add(os.path.join(out, name), arcname=name)
    for name in names:
      os.remove(os.path.join(out, name))
  return names
