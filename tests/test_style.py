"""`ruff check` with the repository's settings (pyproject.toml `[tool.ruff]`) passes on every Python folder."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("jaxpt", "kernels", "tests", "benchmarks", "experiments", "tools")


def test_ruff_check_passes():
  command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *FOLDERS]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
