"""`jaxpt eval --workdir W [--step N]` on a tiny pretraining run, and the run's progress output in a log file."""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys

import pytest

import jaxpt
from jaxpt import progress
from jaxpt.engine.evaluate import run_eval
from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.record import HISTORY_FILE, checkpoint_steps
from jaxpt.engine.trainers import legacy_trainer
from tests.test_train_pretrain import micro_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, LOG_EVERY = 10, 2  # and an eval and a checkpoint every 5 steps: a metrics row at steps 2, 4, 5, 6, 8, 10


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """(workdir, its stderr): a 10-step MICRO pretraining run with progress on, stderr a file (not a terminal) and
  the CLI's start-up lines enabled."""
  workdir = str(tmp_path_factory.mktemp("eval_run"))
  log = os.path.join(str(tmp_path_factory.mktemp("eval_log")), "stderr.txt")
  config = micro_config(steps=STEPS, log_every=LOG_EVERY, eval_every=5, checkpoint_every=5, progress=True,
                        **{"model.norm_scheme": "pre"})  # the simplest blocks compile fastest
  progress.enable("pretrain")
  try:
    with open(log, "w") as f, contextlib.redirect_stderr(f):
      jaxpt.train("pretrain", config, workdir)
  finally:
    progress.enable(None)
  with open(log) as f:
    return workdir, f.read()


def test_progress_in_a_log_file_is_plain_lines(tiny_run):
  _, stderr = tiny_run
  assert "\r" not in stderr
  lines = stderr.splitlines()
  train = [line for line in lines if line.startswith("train: step ")]
  assert len(train) == len({2, 4, 5, 6, 8, 10}) and train[-1].startswith(f"train: step {STEPS}/{STEPS} loss="), stderr
  assert train[-1].endswith(" steps/s")
  assert len(lines) <= STEPS // LOG_EVERY + 10, stderr  # the start-up lines and a few warnings at most
  first = lines.index(train[0])
  assert any(line.startswith("jaxpt pretrain: preparing data in ") for line in lines[:first]), stderr
  assert "jaxpt pretrain: compiling the train step ..." in lines[:first], stderr


def test_eval_gives_the_runs_own_final_eval_numbers(tiny_run, capsys):
  workdir, _ = tiny_run
  steps = checkpoint_steps(workdir)
  with open(os.path.join(workdir, HISTORY_FILE)) as f:
    history = f.read()
  progress.enable("eval")
  try:
    assert run_eval(workdir) == 0
  finally:
    progress.enable(None)
  captured = capsys.readouterr()
  assert "jaxpt eval: compiling the train step ..." in captured.err.splitlines()  # it says what it is doing
  out = captured.out.splitlines()
  assert len(out) == 1
  row = json.loads(out[0])
  final = [r for r in read_metrics(workdir) if "eval_loss" in r][-1]
  assert row["step"] == final["step"] == STEPS and row["run"] == "pretrain"
  for key in ("eval_loss", "eval_ppl", "eval_accuracy"):
    assert row[key] == pytest.approx(final[key], rel=1e-6, abs=1e-7), key
  with open(os.path.join(workdir, "eval", f"step_{STEPS}.json")) as f:
    assert json.load(f) == row
  assert checkpoint_steps(workdir) == steps  # nothing trained, no checkpoint or run record written
  with open(os.path.join(workdir, HISTORY_FILE)) as f:
    assert f.read() == history


def test_eval_of_a_workdir_without_a_run_is_one_line(tmp_path, capsys):
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "eval", "--workdir", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip() == f"jaxpt eval: {tmp_path / 'none'}: no config.json there (not the workdir of a " \
      "jaxpt run)", result.stderr
  (tmp_path / "config.json").write_text("{}")
  assert run_eval(str(tmp_path)) == 2
  assert capsys.readouterr().err.strip() == f"jaxpt eval: {tmp_path}: no checkpoint in {tmp_path / 'checkpoints'}"


def test_eval_of_a_step_without_a_checkpoint_is_one_line(tiny_run, capsys):
  workdir, _ = tiny_run
  assert run_eval(workdir, 7) == 2
  assert capsys.readouterr().err.strip() == f"jaxpt eval: {workdir}: no checkpoint at step 7 (checkpoints at " \
      f"steps 5, {STEPS})"


@pytest.mark.parametrize("sections, kind", [({"rm": {}}, "rm"), ({"dpo": {}, "data": {}}, "dpo"),
                                            ({"grpo": {}, "task": {}}, "grpo"),
                                            ({"task": {}, "decode": {}}, "sft"), ({"data": {}}, "pretrain"),
                                            ({"vit": {}, "data": {}}, "vit"), ({"dit": {}, "data": {}}, "dit")])
def test_the_recorded_sections_name_the_trainer(sections, kind):
  """The legacy rule, for config.json files written before runs recorded their trainer (tests/test_trainers.py)."""
  assert legacy_trainer(sections) == kind


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_eval_of_an_rl_run_whose_reward_model_is_gone_resets_only_that(kind, tmp_path):
  """An RL run's `reward.model` (and PPO's `ppo.critic_init`) moved away: the eval's config has the `reward`
  section (and `ppo.critic_init`) at the defaults, allowed as changes, a one-line note each, and is a valid run
  config (the verifier is its reward again); a directory still there changes nothing."""
  import importlib

  from jaxpt.config import from_section
  from jaxpt.engine.evaluate import without_gone_inputs
  from jaxpt.engine.trainers import TRAINERS
  from jaxpt.rl.reward_sources import RewardConfig

  trainer = TRAINERS.get(kind)
  base = importlib.import_module(f"experiments.configs.{kind}_tiny").get_config().to_dict()
  gone, there = str(tmp_path / "moved_rm"), str(tmp_path)
  recorded = {"trainer": kind, **base, "reward": {**base["reward"], "model": gone, "verifier_weight": 0.0}}
  if kind == "ppo":
    recorded["ppo"] = {**base["ppo"], "critic_init": gone}
  recorded = json.loads(json.dumps(recorded))  # as config.json holds it (a tuple field is a list there)
  got, notes = without_gone_inputs(trainer, recorded)
  assert recorded["reward"]["model"] == gone  # the record itself is left alone
  assert got["reward"] == json.loads(json.dumps(dataclasses.asdict(RewardConfig())))
  resets = ["reward"] + (["ppo.critic_init"] if kind == "ppo" else [])
  assert got["allow_changes"] == ",".join(resets) and len(notes) == len(resets)
  assert all(note.startswith(f) and gone in note and "\n" not in note for note, f in zip(notes, ["reward.model",
                                                                                               "ppo.critic_init"]))
  if kind == "ppo":
    assert got["ppo"] == {**base["ppo"], "critic_init": ""}
  assert {k: v for k, v in got.items() if k not in ("reward", "ppo", "allow_changes")} == \
      {k: v for k, v in recorded.items() if k not in ("reward", "ppo", "allow_changes")}
  config = from_section(trainer.config_type, {k: v for k, v in got.items() if k != "trainer"}, "config")
  assert not config.reward.uses_model and config.allow_changes == got["allow_changes"]
  same = json.loads(json.dumps({**recorded, "reward": {**recorded["reward"], "model": there}}))
  if kind == "ppo":
    same["ppo"]["critic_init"] = there
  assert without_gone_inputs(trainer, same) == (same, [])
