"""The one trainer table (issue 26, item 1): every registered trainer is a subcommand, resolves its run config, run,
train and build functions, and can be evaluated; a run records its trainer's name in config.json and reads it back;
runs from before the key are classified by the one legacy rule; nothing else guesses a run's trainer."""

import ast
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import typing

import pytest

import jaxpt
from jaxpt.engine.run import BuiltRun
from jaxpt.config import ConfigError, from_section
from jaxpt.engine import evaluate, record
from jaxpt.engine.config import RunConfig, check_init_from
from jaxpt.engine.evaluate import evaluate_run
from jaxpt.trainers.pretrain import PretrainRunConfig
from jaxpt.trainers.sft import SFTRunConfig
from jaxpt.engine.trainers import (MODEL_KINDS, TRAINER_KEY, TRAINERS, legacy_trainer, recorded_trainer,
                                  trainer_list, trainer_of)
from tests.test_train_pretrain import micro_config
from tests.test_train_rm import tiny_config as rm_config
from tests.test_train_sft import micro_config as sft_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGACY_TRAINERS = ("pretrain", "sft", "grpo", "rm", "vit", "dit", "dpo")  # the trainers before runs named theirs
TRAINER_SECTIONS = ("rm", "vit", "dit", "dpo", "grpo", "task", "decode")  # the sections the legacy rule reads
LEGACY_RULE = ("jaxpt/engine/trainers.py", "legacy_trainer")  # the one place allowed to read them for that


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory):
  """A 4-step MICRO pretraining run with a checkpoint and an eval set."""
  workdir = str(tmp_path_factory.mktemp("trainers_pretrain"))
  jaxpt.train("pretrain", micro_config(steps=4, eval_every=4, checkpoint_every=4, **{"model.norm_scheme": "pre"}),
              workdir)
  return workdir


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
  """A 4-step micro reward-model run (Bradley-Terry) with a checkpoint."""
  workdir = str(tmp_path_factory.mktemp("trainers_rm"))
  config = rm_config(**{"steps": 4, "log_every": 2, "eval_every": 4, "checkpoint_every": 4, "model.d_model": 32,
                        "model.num_layers": 1, "model.num_heads": 2, "model.mlp_dim": 64, "data.batch_size": 8,
                        "data.synthetic_train_pairs": 64, "data.synthetic_test_pairs": 16,
                        "rm.estimator_hidden": 16, "optim.warmup_steps": 1})
  jaxpt.train("rm", config, workdir)
  return workdir


def _config_json(workdir: str) -> dict:
  with open(os.path.join(workdir, record.CONFIG_FILE)) as f:
    return json.load(f)


# -- the table and its readers ----------------------------------------------------------------------------------


def test_jaxpt_help_lists_exactly_the_registered_trainers():
  shown = subprocess.run([sys.executable, "-m", "jaxpt.cli", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
  assert shown.returncode == 0, shown.stderr
  listed = shown.stdout.split("\nsubcommands:\n", 1)[1].splitlines()
  names = [line.split()[0] for line in listed if line.strip()]
  assert names == [*TRAINERS, "eval", "export-hf", "plan"], shown.stdout
  for name in TRAINERS:
    assert f"  {name:<10} {TRAINERS.get(name).help}" in listed


@pytest.mark.parametrize("name", list(TRAINERS))
def test_each_entry_resolves_its_config_functions_and_evaluator(name):
  trainer = TRAINERS.get(name)
  config_type = trainer.config_type
  assert dataclasses.is_dataclass(config_type) and issubclass(config_type, RunConfig)
  assert trainer_of(config_type) is trainer and trainer.model in MODEL_KINDS
  assert callable(trainer.build_function) and trainer.summary
  assert getattr(jaxpt, trainer.config_class) is config_type  # the Python API exports the config class
  assert typing.get_type_hints(trainer.build_function)["return"] is BuiltRun  # the one built-run type
  if trainer.eval_set:  # a field of the run config, whose 0 turns the eval off
    section, field = trainer.eval_set.split(".")
    section_type = typing.get_type_hints(config_type)[section]
    assert field in {f.name for f in dataclasses.fields(section_type)}


def test_eval_and_export_help_name_the_registered_trainers():
  shown = {command: subprocess.run([sys.executable, "-m", "jaxpt.cli", command, "--help"], capture_output=True,
                                   text=True, cwd=ROOT, timeout=120).stdout for command in ("eval", "export-hf")}
  assert f"the workdir of a jaxpt {trainer_list()} run" in shown["eval"]
  # what jaxpt.load reads: reward models export too, a PPO run as its policy
  exported = trainer_list(lambda t: t.model in ("lm", "reward") or t.lm_key is not None)
  assert exported == "pretrain, sft, grpo, ppo, rm, dpo or kto"
  assert f"the workdir of a jaxpt {exported} run (or hf:DIR)" in " ".join(shown["export-hf"].split())


def test_the_fault_injection_tool_checks_trainers_against_the_table():
  tool = os.path.join(ROOT, "tools", "fault_injection.py")
  for asked, says in (("pretrain,a2c", "unknown trainer 'a2c' (registered: pretrain, sft, grpo, ppo, rm, vit, dit, "
                                       "dpo, kto)"),
                      ("rm", "no tiny rm run in this tool yet (it has: pretrain, grpo)")):
    refused = subprocess.run([sys.executable, tool, "--trainers", asked], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].endswith(says), refused.stderr


# -- a run records its trainer; older runs by the legacy rule ------------------------------------------------------


def test_a_run_records_its_trainer_and_jaxpt_eval_rebuilds_it(pretrain_run):
  recorded = _config_json(pretrain_run)
  assert next(iter(recorded)) == TRAINER_KEY and recorded_trainer(recorded) == "pretrain"
  with open(os.path.join(pretrain_run, record.HISTORY_FILE)) as f:
    assert all(json.loads(line)["config"][TRAINER_KEY] == "pretrain" for line in f)
  assert from_section(PretrainRunConfig, recorded, "config").steps == 4  # the key is the run config's own
  row = evaluate_run(pretrain_run)
  assert row["run"] == "pretrain" and row["step"] == 4 and "eval_loss" in row


def test_a_reward_model_run_records_its_trainer_and_loads_and_evaluates_as_one(rm_run):
  assert recorded_trainer(_config_json(rm_run)) == "rm"
  assert jaxpt.load(rm_run).kind == "reward"
  row = evaluate_run(rm_run)
  assert row["run"] == "rm" and row["step"] == 4 and "eval_accuracy" in row, row


@pytest.mark.parametrize("sections, name", [
    ({"rm": {}}, "rm"), ({"dpo": {}, "data": {}}, "dpo"), ({"grpo": {}, "task": {}}, "grpo"),
    ({"task": {}, "decode": {}}, "sft"), ({"data": {}}, "pretrain"), ({"vit": {}, "data": {}}, "vit"),
    ({"dit": {}, "data": {}}, "dit")])
def test_a_config_json_without_the_key_is_classified_by_the_legacy_rule(sections, name):
  assert recorded_trainer(sections) == legacy_trainer(sections) == name
  assert recorded_trainer({TRAINER_KEY: "kto", **sections}) == "kto"  # the key, when there, is all that counts


@pytest.mark.parametrize("name", LEGACY_TRAINERS)
def test_the_legacy_rule_names_each_older_trainers_config_layout(name):
  layout = {f.name: {} for f in dataclasses.fields(TRAINERS.get(name).config_type)}
  assert legacy_trainer(layout) == name


def test_the_readers_follow_the_key_not_the_sections(tmp_path):
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps({TRAINER_KEY: "rm", "model": {}}))  # no rm section
  with pytest.raises(ConfigError, match=re.escape("is the workdir of a reward-model run (jaxpt rm); init_from "
                                                  "takes the run of jaxpt pretrain, sft, grpo, ppo, vit, dit, dpo "
                                                  "or kto")):
    check_init_from(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({TRAINER_KEY: "pretrain", "rm": {}, "model": {}}))
  check_init_from(str(tmp_path))  # an rm section, but a pretrain run
  (tmp_path / "config.json").write_text(json.dumps({TRAINER_KEY: "vit", "model": {}}))
  with pytest.raises(ConfigError, match=re.escape("is the workdir of a jaxpt vit run (image-classifier); jaxpt.load "
                                                  "takes the run of jaxpt pretrain, sft, grpo, ppo, rm, dpo or "
                                                  "kto")):
    jaxpt.load(str(tmp_path))
  with pytest.raises(ConfigError, match=re.escape("config.trainer='pretrain': the config of another trainer's run "
                                                  "(this is jaxpt sft's)")):
    from_section(SFTRunConfig, {TRAINER_KEY: "pretrain"}, "config")


# -- relaunches: the key is no change, another trainer is refused ------------------------------------------------


def _legacy_copy(run: str, workdir: str) -> None:
  """`workdir`: the record of `run` as jaxpt wrote it before runs named their trainer (no key), and a checkpoint."""
  recorded = {k: v for k, v in _config_json(run).items() if k != TRAINER_KEY}
  os.makedirs(os.path.join(workdir, "checkpoints", "4"))
  with open(os.path.join(workdir, record.CONFIG_FILE), "w") as f:
    json.dump(recorded, f)


def test_a_legacy_run_resumes_without_the_key_counting_as_a_change(pretrain_run, tmp_path):
  _legacy_copy(pretrain_run, str(tmp_path))
  config = from_section(PretrainRunConfig, _config_json(pretrain_run), "config")
  assert record.check_launch(str(tmp_path), config) == {}
  longer = dataclasses.replace(config, steps=8, allow_changes="steps")
  assert record.check_launch(str(tmp_path), longer) == {"steps": [4, 8]}  # the key is no field, no change


@pytest.mark.parametrize("legacy", [False, True])
def test_a_relaunch_with_another_trainer_is_refused_naming_the_recorded_one(pretrain_run, tmp_path, legacy):
  workdir = str(tmp_path / "run")
  if legacy:
    _legacy_copy(pretrain_run, workdir)
  else:
    os.makedirs(workdir)
    for name in (record.CONFIG_FILE, record.HISTORY_FILE):
      with open(os.path.join(pretrain_run, name)) as f, open(os.path.join(workdir, name), "w") as out:
        out.write(f.read())
    os.makedirs(os.path.join(workdir, "checkpoints", "4"))
  sft = from_section(SFTRunConfig, sft_config(allow_changes="model,data,task,decode,steps,optim"), "config")
  with pytest.raises(record.RunMismatch) as refused:
    record.check_launch(workdir, sft)
  assert str(refused.value) == (f"workdir='{workdir}': holds a checkpoint of a run with other settings: trainer "
                                "('pretrain' -> 'sft'), which no allow_changes changes; resume it with jaxpt "
                                "pretrain, or use another --workdir")


def test_the_cli_refuses_another_trainers_relaunch_in_one_line(pretrain_run):
  before = sorted(os.listdir(pretrain_run))
  done = subprocess.run([sys.executable, "-m", "jaxpt.cli", "sft", "--config",
                         os.path.join(ROOT, "experiments", "configs", "sft_tiny.py"), "--workdir", pretrain_run],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == (
      f"jaxpt sft: config error: workdir='{pretrain_run}': holds a checkpoint of a run with other settings: trainer "
      "('pretrain' -> 'sft'), which no allow_changes changes; resume it with jaxpt pretrain, or use another "
      "--workdir"), done.stderr[-3000:]
  assert sorted(os.listdir(pretrain_run)) == before


# -- nothing else guesses --------------------------------------------------------------------------------------


def _section_guesses(source: str, path: str) -> list[str]:
  """'path:line' of each place in `source` that infers a trainer from a recorded config's sections: a membership
  test of a trainer section's name (`"rm" in recorded`), a loop over a literal of them, or a branch on
  `recorded.get("rm")`; not inside the legacy rule, nor a function named run_kind (gone) anywhere."""
  tree, found = ast.parse(source), []

  def names_a_section(node) -> bool:
    return isinstance(node, ast.Constant) and node.value in TRAINER_SECTIONS

  def visit(node, function: str) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      function = node.name
      if node.name == "run_kind":
        found.append(f"{path}:{node.lineno} def run_kind")
    exempt = (path, function) == LEGACY_RULE
    if not exempt:
      if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and \
          names_a_section(node.left):
        found.append(f"{path}:{node.lineno}")
      if isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)) and \
          any(names_a_section(e) for e in node.iter.elts):
        found.append(f"{path}:{node.lineno}")
      if isinstance(node, (ast.If, ast.IfExp, ast.While)) and any(
          isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args and
          names_a_section(n.args[0]) for n in ast.walk(node.test)):
        found.append(f"{path}:{node.lineno}")
    for child in ast.iter_child_nodes(node):
      visit(child, function)

  visit(tree, "")
  return found


OLD_GUESSES = '''
def run_kind(recorded):
  for kind in ("rm", "vit", "dit"):
    if kind in recorded:
      return kind
  if "task" in recorded and "decode" in recorded:
    return "sft"
  return "pretrain"

def check_init_from(recorded):
  if isinstance(recorded, dict) and "rm" in recorded:
    raise ValueError("a reward-model run")
  if recorded.get("grpo"):
    return "grpo"
'''


def test_the_guess_detector_finds_the_old_guessing():
  """The check below can fail: today's code had these guesses (evaluate.run_kind, config.check_init_from)."""
  found = _section_guesses(OLD_GUESSES, "old.py")
  assert [f.split(":")[1].split()[0] for f in found] == ["2", "3", "6", "6", "11", "13"], found
  assert _section_guesses(OLD_GUESSES.replace("def run_kind", "def legacy_trainer"), LEGACY_RULE[0]) == [
      "jaxpt/engine/trainers.py:11", "jaxpt/engine/trainers.py:13"]


def test_run_kind_style_guessing_is_gone():
  assert not hasattr(evaluate, "run_kind")
  found = []
  for path in sorted(glob.glob(os.path.join(ROOT, "jaxpt", "**", "*.py"), recursive=True) +
                     glob.glob(os.path.join(ROOT, "tools", "*.py"))):
    with open(path) as f:
      found += _section_guesses(f.read(), os.path.relpath(path, ROOT))
  assert found == [], f"a trainer inferred from config sections outside {LEGACY_RULE}: {found}"


def test_no_import_circle_in_the_library():
  """Function-level imports count. The one circle there was, dit -> fid -> evaluate -> dit, is gone: fid reads the
  run record, and evaluate reaches the trainers only through the table (by module path), so no trainer module may
  import evaluate, directly or not."""
  import grimp

  graph = grimp.build_graph("jaxpt", cache_dir=None)
  assert os.path.dirname(jaxpt.__file__) == os.path.join(ROOT, "jaxpt")  # this checkout's library is analysed
  cycles = [(m, graph.find_shortest_chain(importer=i, imported=m)) for m in graph.modules
            for i in graph.find_modules_that_directly_import(m) if graph.chain_exists(importer=m, imported=i)]
  assert cycles == []
  for name in TRAINERS:
    assert not graph.chain_exists(importer=TRAINERS.get(name).module, imported="jaxpt.engine.evaluate"), name
