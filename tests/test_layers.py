"""The layer contract of shared/design.md (setup.cfg `[importlinter]`): kept by the code, and broken by an upward
import, which `lint-imports` names."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(cwd: str) -> subprocess.CompletedProcess:
  """`lint-imports` with `cwd` as the project: its setup.cfg, and its jaxpt/ and kernels/ first on sys.path."""
  env = dict(os.environ, PYTHONPATH=cwd)
  return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo"], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=120, check=False)


def test_the_code_keeps_the_layer_contract():
  result = _lint(ROOT)
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
  assert "BROKEN" not in result.stdout
  assert " kept, 0 broken." in result.stdout


def _copy_project(dest: str) -> None:
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("jaxpt", "kernels"):
    shutil.copytree(os.path.join(ROOT, name), os.path.join(dest, name), ignore=ignore)
  shutil.copy(os.path.join(ROOT, "setup.cfg"), dest)


def _add_import_after_future(path: str, line: str) -> None:
  with open(path) as f:
    text = f.read()
  marker = "from __future__ import annotations\n"
  assert marker in text, path
  with open(path, "w") as f:
    f.write(text.replace(marker, marker + line + "\n", 1))


def test_an_upward_import_breaks_the_contract(tmp_path):
  _copy_project(str(tmp_path))
  _add_import_after_future(str(tmp_path / "jaxpt" / "losses" / "lm.py"), "import jaxpt.engine")
  _add_import_after_future(str(tmp_path / "kernels" / "two_stream_norm" / "layout.py"), "from jaxpt import config")
  result = _lint(str(tmp_path))
  # The imports exist only in the copy: naming them shows the copy was analysed, not the installed package.
  assert result.returncode == 1, result.stdout[-6000:] + result.stderr[-2000:]
  assert "jaxpt.losses is not allowed to import jaxpt.engine" in result.stdout
  assert "jaxpt.losses.lm -> jaxpt.engine" in result.stdout
  assert "kernels.two_stream_norm.layout -> jaxpt.config" in result.stdout


def test_a_new_top_level_module_needs_a_place_in_the_drawing(tmp_path):
  _copy_project(str(tmp_path))
  (tmp_path / "jaxpt" / "misc.py").write_text('"""Placed nowhere."""\n')
  result = _lint(str(tmp_path))
  assert result.returncode == 1, result.stdout[-6000:]
  assert "not listed as layers" in result.stdout and "- jaxpt.misc" in result.stdout
