"""tools/suite_time.py times the command the README and CI run, counts what pytest's JUnit XML says, and appends one
record a run."""

import json
import os
import re
import shlex
import subprocess
import sys

from tools import suite_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_timed_command_is_the_readmes_and_cis_pytest_command():
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).splitlines()
  readme_tests = shlex.split(block[1].split("&&", 1)[1])
  assert suite_time.ci_pytest_command() == readme_tests
  assert readme_tests[:3] == ["python3", "-m", "pytest"]


def test_junit_counts_sum_the_suites(tmp_path):
  path = tmp_path / "junit.xml"
  path.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/>'
                  '<testsuite tests="3" failures="0" errors="1" skipped="0"/></testsuites>')
  assert suite_time.junit_counts(str(path)) == {"tests": 8, "passed": 4, "failed": 1, "errors": 1, "skipped": 2}


def test_slowest_files_sum_their_tests_times(tmp_path):
  path = tmp_path / "junit.xml"
  path.write_text('<testsuites><testsuite>'
                  '<testcase classname="tests.test_a" name="x" time="1.5"/>'
                  '<testcase classname="tests.test_a.TestGroup" name="y" time="2.0"/>'
                  '<testcase classname="tests.multidevice.test_b" name="z" time="4.0"/>'
                  '<testcase classname="tests.test_c" name="w" time="0.5"/></testsuite></testsuites>')
  assert suite_time.file_seconds(str(path)) == {"tests/multidevice/test_b.py": 4.0, "tests/test_a.py": 3.5,
                                                 "tests/test_c.py": 0.5}
  assert list(suite_time.file_seconds(str(path), top=1)) == ["tests/multidevice/test_b.py"]


def test_a_partial_run_appends_its_record(tmp_path):
  out = tmp_path / "times.jsonl"
  out.write_text('{"earlier": 1}\n')
  selection = "tests/test_tools_suite_time.py::test_junit_counts_sum_the_suites"
  run = subprocess.run([sys.executable, "tools/suite_time.py", "--out", str(out), "--note", "a test", "--",
                        selection, "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-3000:]
  lines = out.read_text().splitlines()
  assert json.loads(lines[0]) == {"earlier": 1}
  record = json.loads(lines[1])
  assert (record["tests"], record["passed"], record["failed"], record["partial"]) == (1, 1, 0, True)
  assert record["command"].endswith(f"{selection} -p no:cacheprovider") and "-n 2" in record["command"]
  assert record["wall_min"] > 0 and record["cpu_min"] > 0 and record["note"] == "a test"
  assert list(record["slowest_files"]) == ["tests/test_tools_suite_time.py"]
  assert record["commit"] == subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                            text=True).stdout.strip()
