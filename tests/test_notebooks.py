"""The Colab notebooks (colab/*.ipynb) run top to bottom in a python3 kernel, and are committed without outputs.

Each notebook is executed by nbclient in a fresh ipykernel started from this interpreter, with its working
directory colab/ and PYTHONPATH at this checkout (so the kernel imports this tree's jaxpt and the install cell is a
no-op); any cell error fails the test with the cell and its traceback, and so does anything left in the kernel's
temp dir (TMPDIR, one per test: each notebook's last cell removes the workdir it made). The notebooks are written by
tools/make_notebooks.py; a test fails when a committed notebook differs from what it writes (or holds outputs).
"""

import glob
import json
import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra's nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="the test extra's nbclient is not installed")
pytest.importorskip("ipykernel", reason="the test extra's ipykernel is not installed")

from tools import make_notebooks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")
NOTEBOOKS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(COLAB, "*.ipynb")))
CELL_TIMEOUT = 600  # seconds for one cell: a hang fails the test instead of the CI run


def execute(notebook, monkeypatch):
  """Runs every cell of `notebook` in a fresh python3 kernel (cwd colab/, this checkout first on the path)."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                                   resources={"metadata": {"path": COLAB}})
  return client.execute()


def test_every_notebook_is_listed_and_generated():
  assert NOTEBOOKS == sorted(make_notebooks.NOTEBOOKS), "colab/ and tools/make_notebooks.py disagree"
  assert make_notebooks.main(["--check"]) == 0, "run python3 tools/make_notebooks.py"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_no_outputs(name):
  with open(os.path.join(COLAB, name)) as f:
    notebook = json.load(f)
  dirty = [i for i, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
           and (cell.get("outputs") or cell.get("execution_count") is not None)]
  assert not dirty, f"{name}: cells {dirty} hold outputs or execution counts (regenerate: tools/make_notebooks.py)"
  first_code = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
  assert "".join(first_code["source"]).startswith("# Installs jaxpt unless"), f"{name}: no install cell first"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, monkeypatch, tmp_path):
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temp dir, where the notebooks make their workdirs
  notebook = execute(nbformat.read(os.path.join(COLAB, name), as_version=4), monkeypatch)
  code = [cell for cell in notebook.cells if cell.cell_type == "code"]
  assert all(cell.execution_count is not None for cell in code), name
  errors = [out for cell in code for out in cell.outputs if out.output_type == "error"]
  assert not errors, errors
  # The install cell found this checkout's jaxpt and installed nothing.
  install_output = "".join(out.get("text", "") for out in code[0].outputs)
  assert "pip install" not in install_output and "jaxpt 0." in install_output, install_output
  assert os.listdir(tmp_path) == [], f"{name} left {os.listdir(tmp_path)} in the temp dir"
  print(f"{name}: {len(code)} code cells executed")


def test_a_broken_cell_fails_the_run(monkeypatch):
  cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("raise ValueError('deliberately broken')"),
           nbformat.v4.new_code_cell("never = True")]
  kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
  notebook = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": kernelspec})
  with pytest.raises(nbclient.exceptions.CellExecutionError, match="deliberately broken"):
    execute(notebook, monkeypatch)
  assert notebook.cells[0].execution_count == 1 and not notebook.cells[2].get("outputs")
