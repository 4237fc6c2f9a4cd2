"""Refused means untouched (issue 33): every refusal the CLI has leaves the workdir and the `--out` target
byte-identical (every file hashed before and after), and says why in one line.

Each case launches `jaxpt` on a private copy of one finished MICRO pretraining run (and, for exports, on `--out`
targets a user cares about), hashes the run and the target before and after, and checks the exit code and the one
line on stderr. Before this issue, a relaunch refused for a checkpoint that does not fit its config had already
rewritten config.json and config_history.jsonl, and `export-hf --overwrite` emptied any non-empty directory.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from typing import Callable

import pytest

from tools.file_tree import snapshot
from tests.test_cli_signals import signal_after
from tests.test_train_pretrain import MICRO, ROOT, TINY

RUN = {**MICRO, "steps": 4, "log_every": 2, "eval_every": 0, "checkpoint_every": 2}
EXIT_CONFIG, EXIT_LOCKED, EXIT_IO = 2, 4, 5


def _jaxpt(*args: str) -> list[str]:
  return [sys.executable, "-m", "jaxpt.cli", *args]


def _train(workdir: str, command: str = "pretrain", config: str = TINY, **extra) -> list[str]:
  overrides = [f"--config.{k}={v}" for k, v in {**RUN, **extra}.items()]
  return _jaxpt(command, "--config", config, *overrides, "--workdir", workdir)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 4-step MICRO SiameseNorm run (checkpoints at steps 2 and 4), made by the CLI."""
  workdir = str(tmp_path_factory.mktemp("refusals") / "run")
  done = subprocess.run(_train(workdir), capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir


@dataclasses.dataclass(frozen=True)
class Case:
  """A refused command: `argv(run, target)` on a copy of the finished run and a `target` path prepared by
  `prepare(target)` (the `--out` of an export, a fresh workdir, ...); its exit code and a fragment of its one
  line (the last on stderr; a usage error's first, the usage follows it)."""

  name: str
  argv: Callable[[str, str], list[str]]
  exit_code: int
  says: str
  prepare: Callable[[str], None] = lambda target: None


def _a_checkout(target: str) -> None:
  os.makedirs(os.path.join(target, ".git"))
  with open(os.path.join(target, ".git", "HEAD"), "w") as f:
    f.write("ref: refs/heads/main\n")
  with open(os.path.join(target, "precious.txt"), "w") as f:
    f.write("years of work")


def _a_file(target: str) -> None:
  with open(target, "w") as f:
    f.write("not a folder")


def _an_empty_folder(target: str) -> None:
  os.makedirs(target)


def _a_run_folder(target: str) -> None:
  os.makedirs(os.path.join(target, "checkpoints", "7"))


def _locked(run: str) -> None:
  with open(os.path.join(run, ".lock"), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": os.getppid()}, f)  # pytest's parent: alive


def _without(folder: str, run: str, target: str) -> str:
  """A copy of `run` at `target`/source without its `folder`; its path."""
  source = os.path.join(target, "source")
  shutil.copytree(run, source)
  shutil.rmtree(os.path.join(source, folder))
  return source


CASES = [
    # A relaunch of the finished run that would change it.
    Case("model changed", lambda run, _: _train(run, **{"model.d_model": 64}), EXIT_CONFIG,
         "holds a checkpoint of a run with other settings: model.d_model (32 -> 64)"),
    Case("model changed and allowed, checkpoint does not fit", lambda run, _: _train(
        run, **{"model.d_model": 64, "allow_changes": "model.d_model"}), EXIT_IO, "does not fit this run's config"),
    Case("seed changed", lambda run, _: _train(run, seed=7), EXIT_CONFIG, "seed (0 -> 7)"),
    Case("steps changed", lambda run, _: _train(run, steps=6), EXIT_CONFIG, "steps (4 -> 6)"),
    Case("learning rate changed", lambda run, _: _train(run, **{"optim.learning_rate": 0.5}), EXIT_CONFIG,
         "optim.learning_rate (0.01 -> 0.5)"),
    Case("corpus changed", lambda run, _: _train(run, **{"data.max_corpus_bytes": 150_000}), EXIT_CONFIG,
         "data.max_corpus_bytes (200000 -> 150000)"),
    Case("allow_changes names no field", lambda run, _: _train(run, allow_changes="model.d_modle"), EXIT_CONFIG,
         "names 'model.d_modle', which is neither a config field"),
    Case("another trainer's config", lambda run, _: _jaxpt(
        "sft", "--config", os.path.join(ROOT, "experiments", "configs", "sft_tiny.py"), "--workdir", run),
         EXIT_CONFIG, "holds a checkpoint of a run with other settings"),
    Case("locked by a live run", lambda run, _: (_locked(run), _train(run))[1], EXIT_LOCKED, "is in use by pid"),
    # Launches that fail their config checks.
    Case("unknown field", lambda run, _: _train(run, **{"model.d_modle": 64}), EXIT_CONFIG,
         "no config field 'model.d_modle' (did you mean 'model.d_model'?)"),
    Case("invalid value", lambda run, _: _train(run, **{"model.num_heads": 3}), EXIT_CONFIG,
         "config.model.d_model=32: not divisible by model.num_heads=3"),
    Case("a mesh larger than the devices", lambda run, _: _train(run, **{"mesh.data": 3}), EXIT_CONFIG,
         "the mesh has 3 devices but there are 1"),
    Case("a flag of another subcommand", lambda run, _: _train(run) + ["--out", "/tmp/x"], EXIT_CONFIG,
         "--out is not a flag of jaxpt pretrain"),
    Case("workdir is a file", lambda run, target: _train(target), EXIT_IO, "is a file, not a folder",
         prepare=_a_file),
    Case("init_from names no run", lambda run, target: _train(target, init_from=target + "-missing"), EXIT_CONFIG,
         "config.init_from", prepare=_an_empty_folder),
    Case("init_from has no checkpoint", lambda run, target: _train(
        os.path.join(target, "fresh"), init_from=_without("checkpoints", run, target)), EXIT_CONFIG,
         "no checkpoints/ folder there", prepare=lambda target: _an_empty_folder(os.path.join(target, "fresh"))),
    Case("init_from has no tokenizer", lambda run, target: _train(
        os.path.join(target, "fresh"), init_from=_without("tokenizer", run, target)), EXIT_CONFIG, "no tokenizer",
         prepare=lambda target: _an_empty_folder(os.path.join(target, "fresh"))),
    Case("init_from does not fit the model", lambda run, target: _train(
        target, init_from=run, **{"model.d_model": 64}), EXIT_CONFIG, "config.init_from",
         prepare=_an_empty_folder),
    # Exports.
    Case("export over a non-empty folder", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target), EXIT_CONFIG, "exists and is not empty", prepare=_a_checkout),
    Case("export --overwrite over a checkout", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target, "--overwrite"), EXIT_CONFIG,
         "holds files no jaxpt export wrote (.git/HEAD, precious.txt)", prepare=_a_checkout),
    Case("export over a file", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target, "--overwrite"), EXIT_CONFIG, "is a file", prepare=_a_file),
    Case("export over a run", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target, "--overwrite"), EXIT_CONFIG, "holds a jaxpt run",
         prepare=_a_run_folder),
    Case("export in a format the model has not", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target, "--format", "transformers"), EXIT_CONFIG,
         "no transformers class", prepare=_an_empty_folder),
    Case("export of a step that was not saved", lambda run, target: _jaxpt(
        "export-hf", "--workdir", run, "--out", target, "--step", "3"), EXIT_CONFIG, "step 3",
         prepare=_an_empty_folder),
    Case("export of a folder that is no run", lambda run, target: _jaxpt(
        "export-hf", "--workdir", target, "--out", target + "-out"), EXIT_CONFIG,
         "no config.json there (not the workdir of a jaxpt run)", prepare=_a_checkout),
    Case("eval of a step that was not saved", lambda run, _: _jaxpt("eval", "--workdir", run, "--step", "3"),
         EXIT_CONFIG, "step 3"),
]


def test_the_cases_are_many_and_distinct():
  assert len(CASES) >= 20 and len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_refused_command_leaves_everything_as_it_was(case, finished_run, tmp_path):
  run, target = str(tmp_path / "run"), str(tmp_path / "target")
  shutil.copytree(finished_run, run, symlinks=True)
  case.prepare(target)
  argv = case.argv(run, target)  # may itself prepare the run (a lock)
  before = {"run": snapshot(run), "target": snapshot(target), "beside": sorted(os.listdir(tmp_path))}
  done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert done.returncode == case.exit_code, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert lines and (case.says in lines[-1] or case.says in lines[0] and "usage:" in done.stderr), done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  after = {"run": snapshot(run), "target": snapshot(target), "beside": sorted(os.listdir(tmp_path))}
  assert after == before


def test_the_fault_injection_tool_explains_its_options_and_writes_only_into_a_new_root(tmp_path):
  tool = os.path.join(ROOT, "tools", "fault_injection.py")
  shown = subprocess.run([sys.executable, tool, "--help"], capture_output=True, text=True, timeout=120)
  assert shown.returncode == 0
  for option in ("--kills", "--interrupts", "--disk-fulls", "--refusals", "--seed", "--trainers", "--root"):
    assert f"{option} " in shown.stdout and shown.stdout.count(option) >= 2, option  # usage, and its own help
  root = str(tmp_path / "root")
  _a_checkout(root)
  before = snapshot(root)
  refused = subprocess.run([sys.executable, tool, "--root", root], capture_output=True, text=True, timeout=120)
  assert refused.returncode == 2 and "not a new or empty folder" in refused.stderr.splitlines()[-1]
  assert snapshot(root) == before


def test_a_ctrl_c_during_an_export_leaves_the_run_and_out_as_they_were(finished_run, tmp_path):
  """Before: a KeyboardInterrupt traceback. Now one line naming the stage, exit 130, nothing half-written."""
  run, out = str(tmp_path / "run"), str(tmp_path / "out")
  shutil.copytree(finished_run, run, symlinks=True)
  before = snapshot(run)
  for _ in range(5):  # the tiny run's export can finish before the signal arrives (a loaded machine): then again
    code, _, err = signal_after(_jaxpt("export-hf", "--workdir", run, "--out", out), signal.SIGINT,
                                "jaxpt export-hf: loading ")
    if code != 0:
      break
    assert snapshot(run) == before
    shutil.rmtree(out)  # the finished export (this test's own folder)
  assert code == 130, err[-3000:]
  assert re.fullmatch(rf"jaxpt export-hf: Ctrl-C \(SIGINT\) while (loading {run}|writing {out}); the run is "
                      "untouched and nothing half-written is kept; rerun the same command to continue",
                      err.strip().splitlines()[-1]), err[-3000:]
  assert "Traceback" not in err and snapshot(run) == before and sorted(os.listdir(tmp_path)) == ["run"]
