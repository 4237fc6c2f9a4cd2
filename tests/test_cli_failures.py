"""Checkpoint and filesystem failures end the CLI in one line with exit code 5 (issue 12, item 6); a config file
that cannot run, help into a closed pipe and a run that skips every step end it in one line too (issue 33 item 4)."""

import glob
import os
import re
import subprocess
import sys

import pytest

from jaxpt.engine.record import checkpoint_steps
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
  assert glob.glob(os.path.join(workdir, "checkpoints", "*")) == []  # the failed save's temporary folder removed


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
  line = text.splitlines().index("  return config_dict(") + 1  # the file's line the error was raised through
  assert done.stderr.strip() == (f"jaxpt pretrain: config file {config_file}:{line}: TypeError: "
                                 "config_dict(PretrainRunConfig): unknown field 'log_evry' (did you mean 'log_every'?)")


def _jaxpt(*args, stdout=subprocess.PIPE):
  """`python -m jaxpt.cli *args` from the repository root; stderr captured."""
  return subprocess.run([sys.executable, "-m", "jaxpt.cli", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                        cwd=ROOT, timeout=300)


def test_a_config_file_that_cannot_run_is_one_line_naming_the_file_and_line(tmp_path):
  """Before: a missing file ended in `TypeError: ... got _ErrorConfig`, a syntax error or a NameError in a traceback;
  an override without --config read "Unknown command line flag 'config.steps'" above the usage."""
  workdir = str(tmp_path / "run")
  missing = tmp_path / "missing.py"
  broken = tmp_path / "broken.py"
  broken.write_text("from jaxpt.config import config_dict\n\ndef get_config(:\n  pass\n")
  unnamed = tmp_path / "unnamed.py"
  unnamed.write_text("def get_config():\n  return undefined_name\n")
  reads = tmp_path / "reads.py"
  reads.write_text(f"def get_config():\n  return open({str(missing)!r}).read()\n")
  cases = {
      missing: f"config file {missing}: does not exist",
      tmp_path: f"config file {tmp_path}: is a directory, not a file",
      broken: f"config file {broken}:3: SyntaxError: invalid syntax",
      unnamed: f"config file {unnamed}:2: NameError: name 'undefined_name' is not defined",
      reads: f"config file {reads}:2: ENOENT: No such file or directory: {missing}",
  }
  for config_file, message in cases.items():
    done = _jaxpt("pretrain", "--config", str(config_file), "--config.steps=3", "--workdir", workdir)
    assert (done.returncode, done.stderr) == (2, f"jaxpt pretrain: {message}\n"), done.stderr[-3000:]
  done = _jaxpt("sft", "--config.steps=3", "--workdir", workdir)
  assert (done.returncode, done.stderr) == (2, "jaxpt sft: --config.steps: --config.<field> overrides need --config "
                                               "FILE (the file they override)\n")
  done = _jaxpt("eval", "--config.steps=3", "--workdir", workdir)
  assert done.returncode == 2 and done.stderr == ("jaxpt eval: --config.steps: jaxpt eval takes no --config and no "
                                                  "--config.<field> overrides (it reads the run's recorded "
                                                  "config.json)\n")
  assert not os.path.exists(workdir)


def test_help_into_a_closed_pipe_exits_quietly():
  """`jaxpt --help | head -1`: the reader is gone once it has its lines; writing the rest raised BrokenPipeError
  with a traceback. A pipe whose reading end is closed before the CLI starts makes every write fail (a pipe that
  is read from first would take all of the help text into its buffer and never fail)."""
  for args, code in ((["--help"], 0), (["help", "sft"], 0), (["sft", "--help"], 0), ([], 2)):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
      done = _jaxpt(*args, stdout=write_end)
    finally:
      os.close(write_end)
    assert (done.returncode, done.stderr) == (code, ""), (args, done.stderr[-3000:])


def test_a_run_that_skips_every_step_stops_with_exit_3(tmp_path):
  """learning_rate 1e3 with on_nonfinite=skip: from some step on every update is non-finite and skipped. Before: the
  run went on to its last step and exited 0 with a model that had stopped learning; now each skipped step is a
  warning naming it, and the 10th in a row (max_skipped_steps' default) ends the run with exit 3, saving nothing."""
  workdir = str(tmp_path)
  done = subprocess.run(_cli(workdir, **{"optim.learning_rate": 1e3, "on_nonfinite": "skip"}), capture_output=True,
                        text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 3, done.stderr[-3000:]
  last = done.stderr.strip().splitlines()[-1]
  found = re.fullmatch(r"jaxpt pretrain: step (\d+): non-finite (loss|grad_norm|params); stopped after 10 "
                       r"consecutive skipped steps \(steps (\d+)-\1, on_nonfinite='skip', max_skipped_steps=10\): "
                       r"the run no longer learns\. Lower optim\.learning_rate", last)
  assert found and int(found[1]) - int(found[3]) == 9 and "Traceback" not in done.stderr, done.stderr[-3000:]
  skipped = [int(s) for s in re.findall(r"\] step (\d+): non-finite \w+; its update was skipped", done.stderr)]
  assert skipped[-10:] == list(range(int(found[3]), int(found[1]) + 1)), skipped
  assert checkpoint_steps(workdir) == []
