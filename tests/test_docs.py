"""The docs (mkdocs.yml, docs/) build with warnings as errors, and the API reference covers every module.

`mkdocs build --strict` renders the README tour, one page per area and the API reference that mkdocstrings
generates from the docstrings of jaxpt and kernels/; a warning (a docstring that does not render, a broken link or
reference, a missing module) fails the build and this test.
"""

import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _missing(names: tuple[str, ...]) -> list[str]:
  missing = []
  for name in names:
    try:
      if importlib.util.find_spec(name) is None:
        missing.append(name)
    except ModuleNotFoundError:  # its parent package is missing
      missing.append(name)
  return missing


MISSING = _missing(("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"))
PAGES = ["index.md", "python_api.md", "models.md", "losses.md", "training.md", "post_training.md",
         "reward_models.md", "scaling_out.md", "kernels.md", "benchmarks.md", "experiments.md", "tooling.md"]


def modules(folder: str, package: str) -> set[str]:
  """Dotted names of the modules under ROOT/folder (packages by their __init__), as `package`."""
  found = set()
  for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
    parts = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].split(os.sep)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    found.add(".".join([package, *parts]))
  return found


def test_every_page_is_in_the_nav_and_every_module_in_the_reference():
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", f.read(), re.M)
  assert nav == PAGES and sorted(os.listdir(DOCS)) == sorted(PAGES), nav
  referenced = set()
  for page in PAGES:
    with open(os.path.join(DOCS, page)) as f:
      referenced |= set(re.findall(r"^::: (\S+)$", f.read(), re.M))
  # Subpackages' __init__ files that hold only re-exports need no entry of their own.
  # jaxpt.kernels is kernels/ (a copy under jaxpt/ in Bazel's runfiles): documented as kernels.
  wanted = {m for m in modules("jaxpt", "jaxpt") if not m.startswith("jaxpt.kernels")} | modules("kernels", "kernels")
  wanted -= {
      "jaxpt.data", "jaxpt.losses", "jaxpt.models", "jaxpt.nn", "jaxpt.parallel", "jaxpt.rl", "jaxpt.engine",
      "jaxpt.trainers", "kernels"}
  assert sorted(wanted - referenced) == [], "modules missing from the docs' API reference"


def test_the_readmes_config_dict_example_builds_a_valid_config():
  """The README's inline `jaxpt.config.config_dict(PretrainRunConfig, ...)`, run as written, passes the CLI's check
  (it once left out the data section's seq_len and batch_size, which have no default)."""
  import jaxpt.config
  from jaxpt.trainers.pretrain import PretrainRunConfig

  with open(os.path.join(ROOT, "README.md")) as f:
    examples = re.findall(r"`(jaxpt\.config\.config_dict\(PretrainRunConfig,[^`]*)`", f.read())
  assert len(examples) == 1, examples
  config = eval(examples[0], {"jaxpt": jaxpt, "PretrainRunConfig": PretrainRunConfig})  # noqa: S307
  assert jaxpt.config.from_section(PretrainRunConfig, config, "config").steps == 300


@pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (missing {MISSING}): "
                    "pip install -e '.[docs]'")
def test_docs_build_strict(tmp_path):
  env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
  result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
  warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
  assert not warnings, warnings
  built = sorted(os.path.relpath(p, tmp_path / "site") for p in glob.glob(str(tmp_path / "site" / "*" / "index.html")))
  assert len(built) == len(PAGES) - 1, built  # index.md is site/index.html
  with open(tmp_path / "site" / "models" / "index.html") as f:
    assert "jaxpt.models.config.ModelConfig" in f.read()  # the reference was generated from the docstrings


def test_the_post_training_field_table_states_the_defaults():
  """docs/post_training.md's table of the fields most runs set: each default as the trainer's run config holds it
  (`jaxpt.config.config_dict` of its dataclass)."""
  import jaxpt
  from jaxpt.config import config_dict

  with open(os.path.join(ROOT, "docs", "post_training.md")) as f:
    rows = re.findall(r"^\| (\w+) \| `([\w.]+)` \| `([^`]*)` \|", f.read(), re.M)
  assert len(rows) >= 40, rows
  configs = {"grpo": jaxpt.GRPORunConfig, "ppo": jaxpt.PPORunConfig, "dpo": jaxpt.DPORunConfig,
             "kto": jaxpt.KTORunConfig, "rm": jaxpt.RMRunConfig}
  for trainer, field, stated in rows:
    value = config_dict(configs[trainer])
    for part in field.split("."):
      value = value[part]
    assert repr(value) == stated, (trainer, field, value)
