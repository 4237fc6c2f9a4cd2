"""Checkpoint and filesystem failures end the CLI in one line with exit code 5 (issue 12, item 6)."""

import os
import subprocess
import sys

from tests.test_train_pretrain import ROOT, _cli

# Runs argv[2:] with every file it writes capped at argv[1] bytes (a write past it fails with EFBIG, as on a full
# disk; Python ignores SIGXFSZ).
_WITH_FILE_SIZE_LIMIT = ("import os, resource, sys; limit = int(sys.argv[1]); "
                         "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
                         "os.execv(sys.argv[2], sys.argv[2:])")


def test_a_full_disk_is_one_line_naming_the_cause_and_path(tmp_path):
  """RLIMIT_FSIZE stands in for a full disk or quota: the data (< 1 MB files) is written, the first checkpoint
  (a 1.2 MB array file) is not. Before: ~550 lines of orbax / asyncio tracebacks; exit 5 and a handful now. The OS
  cause comes first, whatever the length of tensorstore's message (which once cut it off, for long paths)."""
  workdir = str(tmp_path / "run")
  command = _cli(workdir, steps=2, **{"model.d_model": 128, "model.mlp_dim": 512})
  with_quota = [sys.executable, "-c", _WITH_FILE_SIZE_LIMIT, str(1_000_000)] + command
  done = subprocess.run(with_quota, capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 5, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert lines[-1].startswith("jaxpt pretrain: checkpoint error: saving the checkpoint at step 2 in "), lines[-1]
  assert f"{os.path.join(workdir, 'checkpoints')} failed: EFBIG: File too large (" in lines[-1]  # the cause leads
  assert len(lines) <= 8 and "Traceback" not in done.stderr, done.stderr[-3000:]


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
