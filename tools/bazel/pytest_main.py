"""The main of every py_test target: runs pytest on the test file(s) the target passes as args (`jaxpt_test`)."""

import sys

import jaxpt
import pytest

if __name__ == "__main__":
  import jaxpt.kernels

  print(f"jaxpt from {jaxpt.__file__}, jaxpt.kernels from {jaxpt.kernels.__file__}", flush=True)
  # No cache directory: the runfiles tree is read-only. Bazel's TEST_TMPDIR is pytest's temp root (via TMPDIR).
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
