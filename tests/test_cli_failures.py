"""Checkpoint and filesystem failures end the CLI in one line with exit code 5 (issue 12, item 6)."""

import os
import subprocess
import sys

import pytest

from tests.test_train_pretrain import ROOT, _cli

# Runs argv[2:] with every file it writes capped at argv[1] bytes (a write past it fails with EFBIG, as on a full
# disk; Python ignores SIGXFSZ).
_WITH_FILE_SIZE_LIMIT = ("import os, resource, sys; limit = int(sys.argv[1]); "
                         "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
                         "os.execv(sys.argv[2], sys.argv[2:])")


def test_a_full_disk_is_one_line_naming_the_cause_and_path(tmp_path):
  """RLIMIT_FSIZE stands in for a full disk or quota: the data (< 1 MB files) is written, the first checkpoint
  (a 1.2 MB array file) is not. Before: ~550 lines of orbax / asyncio tracebacks; exit 5 and a handful now."""
  workdir = str(tmp_path / "run")
  command = _cli(workdir, steps=2, **{"model.d_model": 128, "model.mlp_dim": 512})
  with_quota = [sys.executable, "-c", _WITH_FILE_SIZE_LIMIT, str(1_000_000)] + command
  done = subprocess.run(with_quota, capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 5, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert lines[-1].startswith("jaxpt pretrain: checkpoint error: saving the checkpoint at step 2 in "), lines[-1]
  assert "File too large" in lines[-1] and os.path.join(workdir, "checkpoints") in lines[-1]
  assert len(lines) <= 8 and "Traceback" not in done.stderr, done.stderr[-3000:]


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


# Where the MICRO run's data preparation fills a disk of each size (measured with tfds 4.9.10, sentencepiece 0.2):
# the TFDS array_record files need ~265 KB, the tokenizer ~25 KB more, the packed arrays ~700 KB more.
@pytest.mark.parametrize("size, filled_at", [("150k", os.path.join("run", "tfds", "jaxpt_local_text")),
                                             ("1m", os.path.join("run", "data", "packed_"))])
def test_a_disk_filled_by_the_data_preparation_is_one_line_and_leaves_no_temporaries(small_disk, size, filled_at):
  """Before: at 1 MB numpy's 'filesystem error: 180736 requested and 142304 written' and data/packed_*.tmp* left
  for ever; at 150 KB TFDS's RuntimeError 'Failed to finalize writing of split' escaped with its traceback."""
  disk = small_disk(size)
  workdir = str(disk / "run")
  done = subprocess.run(_cli(workdir), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr[-3000:]
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(f"jaxpt pretrain: filesystem error: ENOSPC: No space left on device: "
                         f"{os.path.join(disk, filled_at)}"), last
  left = [os.path.join(d, n) for d, dirs, files in os.walk(disk) for n in dirs + files if "tmp" in n or
          n.startswith("incomplete")]
  assert not left, left


def test_a_workdir_that_is_a_file_is_one_line(tmp_path):
  workdir = tmp_path / "file"
  workdir.write_text("not a folder")
  done = subprocess.run(_cli(str(workdir)), capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 5
  assert done.stderr.strip() == f"jaxpt pretrain: filesystem error: the workdir {workdir} is a file, not a folder"


def test_a_typo_in_a_config_file_is_one_line_naming_the_file_and_the_closest_field(tmp_path):
  with open(os.path.join(ROOT, "experiments", "configs", "tiny.py")) as f:
    text = f.read()
  config_file = tmp_path / "typo.py"
  config_file.write_text(text.replace("log_every=", "log_evry=", 1))
  done = subprocess.run([sys.executable, "-m", "jaxpt.cli", "pretrain", "--config", str(config_file), "--workdir",
                         str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 2
  assert done.stderr.strip() == (f"jaxpt pretrain: config file {config_file}: TypeError: "
                                 "config_dict(PretrainRunConfig): unknown field 'log_evry' (did you mean 'log_every'?)")
