"""The Bazel build (BUILD files, WORKSPACE, tools/bazel_test.sh) covers the code and really builds and tests.

The BUILD files are Starlark, whose syntax is Python's: each one is evaluated here with functions that record the
targets (py_library, py_test through jaxpt_test, genrule, ...), and every .py file of a package must be in the srcs
of a target of its BUILD file, every tests/test_*.py must have its py_test. Then tools/bazel_test.sh builds every
target and runs the fast test targets with Debian's Bazel (installing it when missing, as root).
"""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Folders whose Python files Bazel must know: a BUILD file in the folder or a parent owns each file.
PYTHON_FOLDERS = ("jaxpt", "kernels", "experiments", "benchmarks", "tools", "tests")


def read_build(path: str) -> list[dict]:
  """The targets a BUILD file declares: dicts with kind, name, srcs (paths relative to the file's folder)."""
  folder, targets = os.path.dirname(path), []

  def rule(kind):
    def record(name="", **attrs):
      targets.append({"kind": kind, "name": name, **attrs})
    return record

  def jaxpt_test(name, **attrs):  # tools/bazel/defs.bzl: py_test with srcs [name.py, pytest main]
    targets.append({"kind": "py_test", "name": name, "srcs": [f"{name}.py"], **attrs})

  def bazel_glob(patterns, exclude=()):
    found = {os.path.relpath(p, folder) for pattern in patterns
             for p in glob.glob(os.path.join(folder, pattern), recursive=True) if os.path.isfile(p)}
    return sorted(found - set(exclude))

  scope = {kind: rule(kind) for kind in ("py_library", "py_binary", "py_test", "genrule", "filegroup", "alias",
                                         "exports_files", "package")}
  scope.update(glob=bazel_glob, load=lambda *args, **kwargs: None, jaxpt_test=jaxpt_test)
  with open(path) as f:
    exec(compile(f.read(), path, "exec"), scope)  # noqa: S102  (Starlark is a subset of Python)
  return targets


def build_files() -> list[str]:
  return sorted(glob.glob(os.path.join(ROOT, "**", "BUILD"), recursive=True))


def owner(path: str) -> str:
  """The BUILD file of the nearest folder at or above `path`'s that has one."""
  folder = os.path.dirname(path)
  while not os.path.isfile(os.path.join(folder, "BUILD")):
    folder = os.path.dirname(folder)
  return os.path.join(folder, "BUILD")


def test_every_python_file_has_a_target():
  srcs = {}
  for build in build_files():
    for target in read_build(build):
      for src in target.get("srcs", []):
        if not src.startswith((":", "//")):
          srcs[os.path.normpath(os.path.join(os.path.dirname(build), src))] = build
  missing = []
  for folder in PYTHON_FOLDERS:
    for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
      if srcs.get(path) != owner(path):
        missing.append(f"{os.path.relpath(path, ROOT)} (add it to {os.path.relpath(owner(path), ROOT)})")
  assert not missing, "Python files without a Bazel target:\n" + "\n".join(sorted(missing))


def test_every_test_file_has_a_py_test_and_every_target_its_file():
  tests = {t["name"] for t in read_build(os.path.join(ROOT, "tests", "BUILD")) if t["kind"] == "py_test"}
  files = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py"))}
  assert files - tests == set(), f"test files without a py_test in tests/BUILD: {sorted(files - tests)}"
  assert tests - files == set(), f"py_test targets without a file: {sorted(tests - files)}"


def test_every_jaxpt_package_has_a_build_file_and_the_kernels_are_mapped():
  packages = [os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "jaxpt", "**", "__init__.py"), recursive=True)]
  assert [p for p in packages if not os.path.isfile(os.path.join(p, "BUILD"))] == []
  (genrule,) = [t for t in read_build(os.path.join(ROOT, "jaxpt", "BUILD")) if t["kind"] == "genrule"]
  kernels = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "kernels", "**", "*.py"),
                                                               recursive=True))
  assert sorted(genrule["outs"]) == kernels, "jaxpt/BUILD must copy every kernels/ file to jaxpt/kernels/"
  assert sorted(s.replace("//kernels:", "kernels/") for s in genrule["srcs"]) == kernels


def _can_get_bazel() -> bool:
  if shutil.which("bazel") and os.path.isdir("/usr/src/bazel-bootstrap/mock_repos"):
    return True
  return shutil.which("apt-get") is not None and (os.geteuid() == 0 or shutil.which("sudo") is not None)


@pytest.mark.slow  # about 4 minutes of one worker (the build, then the fast test targets); the BUILD checks above
# (every file in a target, every test with its py_test) stay in the default suite
@pytest.mark.skipif(not _can_get_bazel(), reason="no bazel, and no apt-get as root to install Debian's "
                    "bazel-bootstrap (tools/bazel_test.sh needs one of them)")
def test_bazel_builds_everything_and_passes_the_fast_tests():
  result = subprocess.run(["bash", os.path.join(ROOT, "tools", "bazel_test.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, check=False)
  log = result.stdout + result.stderr
  summary = [line for line in log.splitlines() if line.startswith(("//", "Executed", "INFO: Elapsed", "bazel "))]
  print("\n".join(summary))
  assert result.returncode == 0, log[-6000:]
  assert any(line.startswith("Executed") and "tests pass" in line for line in summary), log[-3000:]
