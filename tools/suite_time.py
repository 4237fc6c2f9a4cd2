"""The test suite's time, measured: runs the README's test command (the pytest line of `.ci/run`) once and appends one
JSON line to `tools/suite_time_results.jsonl`, the file the README's suite-time sentence quotes.

    python tools/suite_time.py [--note "both experiments paused"] [--out FILE] [-- EXTRA PYTEST ARGS]

A line holds: the wall and CPU minutes (the CPU of pytest and every process it waited for: the xdist workers, the
multi-device suites, notebook kernels, CLI runs), the tests passed / failed / errors / skipped (from pytest's JUnit
XML), the commit and whether the tree had uncommitted changes, the CPU (model, family/model/stepping, vector
extensions: the machine changes between sessions, so only lines of one CPU compare), the 1-minute load average just
before and just after (a quiet run starts near 0; other work on the cores stretches the wall time, much less the
CPU time), python's and jax's versions, `--note`, and `slowest_files`: the SLOWEST test files by the seconds their
tests took (JUnit's per-test time, setup and teardown included: a module fixture's compile counts for its first
test; the suite's files run on 2 workers, so they sum to about twice the wall time). Arguments after `--` are
added to the pytest command (a file selection, for a partial timing: recorded as such).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

CI_RUN = os.path.join(REPO_ROOT, ".ci", "run")
RESULTS = os.path.join(REPO_ROOT, "tools", "suite_time_results.jsonl")


def ci_pytest_command(ci_run: str = CI_RUN) -> list[str]:
  """The argv of the pytest command in `ci_run` (the part of its line from `python3 -m pytest` to the end)."""
  with open(ci_run) as f:
    for line in f:
      if line.lstrip().startswith("#"):
        continue
      words = shlex.split(line)
      for i in range(len(words) - 2):
        if words[i + 1:i + 3] == ["-m", "pytest"]:
          return words[i:]
  raise ValueError(f"{ci_run}: no line runs `python -m pytest`")


def junit_counts(path: str) -> dict:
  """{"tests", "passed", "failed", "errors", "skipped"} summed over the testsuites of a JUnit XML file."""
  root = ET.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
  return {"tests": count["tests"], "passed": count["tests"] - count["failures"] - count["errors"] - count["skipped"],
          "failed": count["failures"], "errors": count["errors"], "skipped": count["skipped"]}


SLOWEST = 15


def file_seconds(path: str, top: int = SLOWEST) -> dict[str, float]:
  """{test file: seconds} of the `top` slowest files of a JUnit XML file (the sum of their testcases' times)."""
  seconds: dict[str, float] = {}
  for case in ET.parse(path).getroot().iter("testcase"):
    name = case.get("classname", "").split(".")
    module = next((i for i in range(len(name), 0, -1) if name[i - 1].startswith("test_")), len(name))
    file = "/".join(name[:module]) + ".py"
    seconds[file] = seconds.get(file, 0.0) + float(case.get("time", 0.0))
  ranked = sorted(seconds.items(), key=lambda item: -item[1])[:top]
  return {file: round(value, 1) for file, value in ranked}


def git(*args: str) -> str:
  return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()


def measure(extra_args: list[str], note: str) -> dict:
  """Runs the CI's pytest command (+ extra_args) from the repository root; its record (module docstring)."""
  from benchmarks.common import cpu_model

  command = ci_pytest_command() + list(extra_args)
  with tempfile.TemporaryDirectory(prefix="jaxpt-suite-time-") as scratch:
    junit = os.path.join(scratch, "junit.xml")
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    returncode = subprocess.run(command + [f"--junitxml={junit}"], cwd=REPO_ROOT).returncode
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()[0]
    counts = junit_counts(junit) if os.path.exists(junit) else {}
    slowest = file_seconds(junit) if os.path.exists(junit) else {}
  cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
  import jax

  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": shlex.join(command), "partial": bool(extra_args), "returncode": returncode,
          "wall_min": round(wall / 60, 2), "cpu_min": round(cpu / 60, 2), **counts,
          "commit": git("rev-parse", "--short", "HEAD"), "uncommitted_changes": bool(git("status", "--porcelain")),
          "load_1min_before": load_before, "load_1min_after": load_after, "cpu_count": os.cpu_count(), **cpu_model(),
          "python": platform.python_version(), "jax": jax.__version__, "note": note, "slowest_files": slowest}


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=RESULTS, help="the JSON-lines file a record is appended to")
  parser.add_argument("--note", default="", help="what else ran on the machine, or anything the line should say")
  args = parser.parse_args(own)
  record = measure(extra, args.note)
  with open(args.out, "a") as f:
    f.write(json.dumps(record) + "\n")
  print(json.dumps(record))
  return record["returncode"]


if __name__ == "__main__":
  sys.exit(main())
