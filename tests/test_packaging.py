"""What installs: the wheel holds jaxpt (kernels/ as jaxpt.kernels) and the LICENSE, nothing else; one version."""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import jaxpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_INSTALLED = ("kernels", "experiments", "benchmarks", "tests", "colab", "docs")


def _sources(folder: str) -> list[str]:
  """The .py files under ROOT/folder, relative to it, '/'-separated."""
  found = []
  for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
    found += [os.path.normpath(os.path.join(rel, f)).replace(os.sep, "/") for f in filenames if f.endswith(".py")]
  return sorted(found)


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
  """The file names in a wheel built from a copy of the repository (the build leaves nothing in the checkout)."""
  src, out = tmp_path_factory.mktemp("src") / "jaxpt", tmp_path_factory.mktemp("wheel")
  shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                           ".hypothesis", ".*cache", "workdir*"))
  # Offline when the local setuptools can build wheels (needs `wheel` before setuptools 70.1); else isolated.
  isolation = ["--no-build-isolation"] if importlib.util.find_spec("wheel") else []
  result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out),
                           str(src)], capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  (wheel,) = os.listdir(out)
  assert wheel == f"jaxpt-{jaxpt.__version__}-py3-none-any.whl"
  with zipfile.ZipFile(out / wheel) as zf:
    return sorted(zf.namelist())


def test_wheel_installs_the_kernels_as_jaxpt_kernels(wheel_names):
  kernels = _sources("kernels")
  assert "two_stream_norm/__init__.py" in kernels and "two_stream_norm/post_pre.py" in kernels
  missing = [f for f in kernels if f"jaxpt/kernels/{f}" not in wheel_names]
  assert not missing, missing


def test_wheel_holds_every_jaxpt_module(wheel_names):
  # setup.cfg lists the packages (find: cannot map kernels/): a new subpackage must be listed there too.
  missing = [f for f in _sources("jaxpt") if f"jaxpt/{f}" not in wheel_names]
  assert not missing, f"not in the wheel (add the package to setup.cfg [options] packages): {missing}"


def test_wheel_installs_nothing_else(wheel_names):
  dist_info = f"jaxpt-{jaxpt.__version__}.dist-info"
  tops = {name.split("/")[0] for name in wheel_names}
  assert tops == {"jaxpt", dist_info}, tops
  assert not [n for n in wheel_names if n.split("/")[0] in NOT_INSTALLED]
  licenses = [n for n in wheel_names if n.startswith(dist_info) and n.endswith("/LICENSE")]
  assert licenses, wheel_names


def test_license_is_apache_2():
  with open(os.path.join(ROOT, "LICENSE")) as f:
    text = f.read()
  assert text.startswith("Copyright 2026 The jaxpt Authors\n")
  assert "Apache License\n                           Version 2.0, January 2004" in text
  assert "END OF TERMS AND CONDITIONS" in text


def test_version_is_single_sourced():
  assert jaxpt.__version__ == importlib.metadata.version("jaxpt")
