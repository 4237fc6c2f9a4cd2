"""Shared test set-up: the hypothesis settings profiles.

  ci        (loaded by default: CI and a plain `pytest`): 1000 examples per property, derandomized (the examples
            are a function of the test alone, so a failure reproduces on every run and machine), no deadline (the
            first example of a jitted property compiles), no example database (nothing read or written).
  thorough  10000 fresh random examples per property, failures kept in .hypothesis/ and replayed first:
            `python3 -m pytest -q --hypothesis-profile=thorough tests/test_losses_grpo.py`.
A property that states its own max_examples (the data, tokenizer and reward tests) keeps it; the loss properties
(tests/test_losses_*.py) take theirs from the profile, so each runs >= 1000 examples in CI.

XLA's CPU backend compiles the suite's tiny programs with cheaper code generation (`tests/xla_flags.py`: the same
HLO; compile time, not run time, dominates them), set here before any test starts jax's backend and inherited by the
subprocesses the tests launch (notebook kernels, CLI runs). The multi-device suites (tests/multidevice) ask for the
same.

The run keeps one JAX persistent compilation cache (a temporary folder made by its first pytest process, removed by
it at the end), with no threshold on compile time or size, and hands it to every process it starts through the
environment (JAXPT_TESTS_COMPILE_CACHE and jax's own JAX_COMPILATION_CACHE_DIR): the xdist workers, the 8-device
suites, the notebooks' kernels and CLI runs, so the many builds of the same micro runs (a GRPO run's sampler and
log-probs under another policy loss, teacher or test; a killed CLI run and its rerun) compile once per run. Sharing
took the quiet suite from 27.2 to 23.1 min (8a3142a, the same machine). jax writes an entry in place, not atomically:
a process that reads an entry another is still writing, or one left half-written by a killed CLI run, gets a
warning and compiles anew (jax catches the decompression error), and so does one that reads a file two processes
wrote at once (zlib, jax's compression without zstd installed, checks each entry's adler-32).

The README's two workers (`-n 2 --dist loadfile`) take whole files, so a module's compiled fixtures are
built once, not once per worker; the longest files go first (`LONGEST_FIRST`; xdist's own reordering of files by
their number of tests is turned off, as `--no-loadscope-reorder` would), so the run does not end on one worker with
a long file of few tests (the 8-device suites) while the other is idle.
"""

import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import settings

from tests.xla_flags import suite_xla_flags

# files of 25 s or more on one worker, longest first (a quiet run's --durations=60 at 8b019ca, summed per file)
LONGEST_FIRST = ("test_parallel_sharded.py", "test_parallel_multiprocess.py", "test_notebooks.py", "test_train_grpo.py",
                 "test_device_check.py", "test_train_grpo_kdrl.py", "test_train_grpo_policy_losses.py",
                 "test_train_grpo_reward_model.py", "test_cli_signals.py", "test_train_ppo.py", "test_train_lora.py",
                 "test_train_rm.py", "test_train_bf16.py", "test_train_from_hf.py", "test_rl_sampler.py")

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""))

CACHE_ENV = "JAXPT_TESTS_COMPILE_CACHE"
OWNS_CACHE = CACHE_ENV not in os.environ  # the run's first pytest process (xdist's controller, or a plain run)
if OWNS_CACHE:
  os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="jaxpt-tests-compile-cache-")
COMPILE_CACHE = os.environ[CACHE_ENV]
# inherited by every process the run starts (workers, 8-device suites, notebook kernels, CLI runs): jax reads them
os.environ.update(JAX_COMPILATION_CACHE_DIR=COMPILE_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")


def _use_compile_cache():
  import jax  # after XLA_FLAGS above: the backend reads them when it starts

  jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: every entry, whatever its size


_use_compile_cache()

settings.register_profile("ci", max_examples=1000, derandomize=True, deadline=None, database=None, print_blob=True)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=10_000, deadline=None,
                          print_blob=True)
settings.load_profile("ci")  # `--hypothesis-profile=NAME` (hypothesis' pytest plugin) loads NAME after this


@pytest.fixture
def small_disk(tmp_path):
  """mount_small_disk(size) -> a fresh tmpfs of `size` (mount's units: '1m', '150k') under tmp_path, unmounted at
  teardown; the test is skipped where mounting is not permitted (not root, no CAP_SYS_ADMIN)."""
  mounted = []

  def mount_small_disk(size):
    folder = tmp_path / f"disk_{size}"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
      pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    mounted.append(folder)
    return folder

  yield mount_small_disk
  for folder in mounted:
    subprocess.run(["umount", str(folder)], check=True)


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.8, when installed and enabled
    config.option.loadscopereorder = False


def pytest_unconfigure(config):
  if OWNS_CACHE:
    shutil.rmtree(COMPILE_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(items):
  """Runs the files of LONGEST_FIRST first, in that order; the rest keep their collection order."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
