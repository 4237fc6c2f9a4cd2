"""The run record: a resumed run must be the recorded one (issue 12, items 1 and 3)."""

import dataclasses
import json
import os

import pytest

import jaxpt
from jaxpt.config import ConfigError, from_section
from jaxpt.data import corpus
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.engine import record
from jaxpt.trainers.pretrain import PretrainRunConfig
from tests.test_train_pretrain import micro_config


def _config(**changes) -> PretrainRunConfig:
  return from_section(PretrainRunConfig, micro_config(**changes), "config")


def _with_checkpoint(workdir) -> None:
  os.makedirs(os.path.join(workdir, "checkpoints", "7"))


INPUTS = {"corpus": "c0", "tokenizer": "t0"}


def test_a_fresh_workdir_accepts_any_config_and_records_it(tmp_path):
  workdir = str(tmp_path)
  assert record.record_launch(workdir, _config(), INPUTS) == {}
  assert record.record_launch(workdir, _config(**{"optim.learning_rate": 5e-3}), INPUTS) == {}  # no checkpoint yet
  with open(tmp_path / record.CONFIG_FILE) as f:
    assert json.load(f)["optim"]["learning_rate"] == 5e-3


def test_resume_with_changed_fields_fails_listing_them(tmp_path):
  workdir = str(tmp_path)
  record.record_launch(workdir, _config(), INPUTS)
  _with_checkpoint(workdir)
  config_before = (tmp_path / record.CONFIG_FILE).read_bytes()
  changed = _config(steps=60, seed=3, **{"optim.learning_rate": 3e-3, "model.d_model": 64})
  with pytest.raises(record.RunMismatch) as error:
    record.record_launch(workdir, changed, {"corpus": "c1", "tokenizer": "t0"})
  message = str(error.value)
  assert "\n" not in message
  for field in ("steps (30 -> 60)", "seed (0 -> 3)", "optim.learning_rate (0.01 -> 0.003)",
                "model.d_model (32 -> 64)", 'inputs.corpus ("c0" -> "c1")'):
    assert field in message, message
  assert "--config.allow_changes=" in message
  assert (tmp_path / record.CONFIG_FILE).read_bytes() == config_before  # the record is not touched


def test_watching_and_layout_fields_change_freely(tmp_path):
  workdir = str(tmp_path)
  record.record_launch(workdir, _config(), INPUTS)
  _with_checkpoint(workdir)
  free = _config(log_every=1, eval_every=3, checkpoint_every=2, keep_checkpoints=9, progress=True,
                 on_nonfinite="skip", max_skipped_steps=0, **{"mesh.data": 1})
  assert record.record_launch(workdir, free, INPUTS) == {}


def test_allowed_changes_are_accepted_and_the_history_is_append_only(tmp_path):
  workdir = str(tmp_path)
  record.record_launch(workdir, _config(), INPUTS)
  _with_checkpoint(workdir)
  history = tmp_path / record.HISTORY_FILE
  first_row = history.read_text()
  changed = _config(steps=60, allow_changes="steps,optim,inputs.corpus", **{"optim.learning_rate": 3e-3})
  changes = record.record_launch(workdir, changed, {"corpus": "c1", "tokenizer": "t0"})
  assert changes == {"steps": [30, 60], "optim.learning_rate": [0.01, 0.003], "inputs.corpus": ["c0", "c1"]}
  text = history.read_text()
  assert text.startswith(first_row)
  rows = [json.loads(line) for line in text.splitlines()]
  assert [r["resumed_from_step"] for r in rows] == [None, 7] and rows[1]["changes"] == changes
  # the accepted values are the run's now: resuming with them needs no allowance, the old ones do
  assert record.check_launch(workdir, dataclasses.replace(changed, allow_changes=""),
                             {"corpus": "c1", "tokenizer": "t0"}) == {}
  with pytest.raises(record.RunMismatch):
    record.check_launch(workdir, _config(), INPUTS)


def test_a_history_row_cut_by_a_kill_is_skipped(tmp_path):
  workdir = str(tmp_path)
  record.record_launch(workdir, _config(), INPUTS)
  _with_checkpoint(workdir)
  with open(tmp_path / record.HISTORY_FILE, "a") as f:
    f.write('{"config": {"steps": 99')  # killed mid-write
  assert record.check_launch(workdir, _config(), INPUTS) == {}
  record.record_launch(workdir, _config(), INPUTS)
  rows = (tmp_path / record.HISTORY_FILE).read_text().splitlines()
  assert len(rows) == 3 and json.loads(rows[-1])["resumed_from_step"] == 7


def test_allow_changes_naming_no_field_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="config.allow_changes='stpes': names 'stpes'"):
    record.check_launch(str(tmp_path), _config(allow_changes="stpes"))


def test_corpus_fingerprint_reads_content_not_mtime(tmp_path):
  """Same size, same mtime, other bytes: the old (path, size, mtime) key missed this."""
  path = tmp_path / "corpus.txt"
  path.write_text("alpha beta\n\ngamma delta\n")
  stat = os.stat(path)
  before = corpus.fingerprint(str(path), 0)
  path.write_text("alpha bete\n\ngamma delta\n")
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert corpus.fingerprint(str(path), 0) != before


def test_tokenizers_are_content_addressed_and_a_resumed_run_keeps_its_own(tmp_path):
  directory = str(tmp_path / "tokenizer")
  texts_a = ["the cat sat on the mat. " * 40]
  texts_b = ["a completely different corpus 0123456789 " * 40]
  first = tokenizer_lib.load_or_train(directory, 300, "corpus-a", lambda: texts_a)
  cached = sorted(os.listdir(os.path.join(directory, "cache")))
  kept = tokenizer_lib.load_or_train(directory, 300, "corpus-b", lambda: texts_b, keep_existing=True)
  assert kept.model_proto == first.model_proto  # resuming: never retrained under the checkpoint
  second = tokenizer_lib.load_or_train(directory, 300, "corpus-b", lambda: texts_b)  # a fresh run
  assert second.model_proto != first.model_proto
  assert len(os.listdir(os.path.join(directory, "cache"))) == len(cached) + 2  # beside the first, not over it
  again = tokenizer_lib.load_or_train(directory, 300, "corpus-a", lambda: pytest.fail("retrained"))
  assert again.model_proto == first.model_proto


def test_appending_to_the_corpus_then_resuming_fails_before_any_work(tmp_path):
  """Issue 12 item 1 end to end: no new TFDS build, the tokenizer untouched, one line naming inputs.corpus; with
  allow_changes the run resumes on the new text with its own tokenizer."""
  text = tmp_path / "corpus.txt"
  text.write_text("\n\n".join(corpus.embedded_documents(200_000)))
  workdir = str(tmp_path / "run")
  config = micro_config(**{"data.path": str(text)})
  jaxpt.train("pretrain", config, workdir, stop_at=2)
  tokenizer_bytes = (tmp_path / "run" / "tokenizer" / "spm.model").read_bytes()
  builds = os.listdir(tmp_path / "run" / "tfds" / "jaxpt_local_text")
  with open(text, "a") as f:
    f.write("\n\nOne more paragraph, appended after the run started.\n")
  with pytest.raises(record.RunMismatch, match=r"inputs\.corpus \(") as error:
    jaxpt.build("pretrain", config, workdir)
  assert "\n" not in str(error.value)
  assert os.listdir(tmp_path / "run" / "tfds" / "jaxpt_local_text") == builds
  config.allow_changes = "inputs.corpus"
  result = jaxpt.train("pretrain", config, workdir, stop_at=4)
  assert int(result.state.step) == 4
  assert (tmp_path / "run" / "tokenizer" / "spm.model").read_bytes() == tokenizer_bytes


def _grpo(**lora):
  from jaxpt.config import load_config_file
  from jaxpt.trainers.grpo import GRPORunConfig

  config = load_config_file(os.path.join(os.path.dirname(__file__), "..", "experiments", "configs", "grpo_tiny.py"))
  allow = lora.pop("allow_changes", "")
  config.lora.update({"rank": 4, **lora})
  config.allow_changes = allow
  return from_section(GRPORunConfig, config, "config")


def _recorded_without(workdir, config, *keys) -> None:
  """A checkpointed run recorded as jaxpt did before the config field `keys` ('lora', 'rollouts') existed."""
  record.record_launch(workdir, config, INPUTS)
  _with_checkpoint(workdir)
  for name in (record.HISTORY_FILE, record.CONFIG_FILE):
    path = os.path.join(workdir, name)
    with open(path) as f:
      text = f.read()
    rows = [json.loads(line) for line in text.splitlines()] if name == record.HISTORY_FILE else [json.loads(text)]
    for row in rows:
      section = row["config"] if name == record.HISTORY_FILE else row
      for key in keys[:-1]:
        section = section[key]
      del section[keys[-1]]
    with open(path, "w") as f:
      f.write("".join(json.dumps(row) + "\n" for row in rows))


def test_a_qlora_grpo_run_recorded_before_lora_rollouts_keeps_its_merged_rollouts(tmp_path):
  """Its rollouts read the merged params; the new default (auto: the codes, unmerged) would switch them silently,
  so a resume with it is refused in one line naming lora.rollouts; merged resumes, allow_changes switches."""
  qlora = dict(base_quant="nf4", base_quant_block=16)
  workdir = str(tmp_path)
  _recorded_without(workdir, _grpo(rollouts="merged", **qlora), "lora", "rollouts")
  for rollouts in ("auto", "unmerged"):
    with pytest.raises(record.RunMismatch, match=f'lora.rollouts \\("merged" -> "{rollouts}"\\)') as error:
      record.check_launch(workdir, _grpo(rollouts=rollouts, **qlora), INPUTS)
    assert "\n" not in str(error.value) and "--config.allow_changes=lora.rollouts " in str(error.value)
  assert record.check_launch(workdir, _grpo(rollouts="merged", **qlora), INPUTS) == {}
  assert record.record_launch(workdir, _grpo(allow_changes="lora.rollouts", **qlora), INPUTS) == {
      "lora.rollouts": ["merged", "auto"]}
  assert record.check_launch(workdir, _grpo(**qlora), INPUTS) == {}  # recorded now: auto is the run's


def test_a_lora_grpo_run_recorded_before_lora_rollouts_resumes_as_it_ran(tmp_path):
  """LoRA on a float base: auto samples the merged params as the run did, so it resumes without allow_changes."""
  workdir = str(tmp_path)
  _recorded_without(workdir, _grpo(), "lora", "rollouts")
  assert record.check_launch(workdir, _grpo(), INPUTS) == {}
  with pytest.raises(record.RunMismatch, match=r'lora.rollouts \("merged" -> "unmerged"\)'):
    record.check_launch(workdir, _grpo(rollouts="unmerged"), INPUTS)


def test_a_run_recorded_before_the_lora_section_resumes_without_adapters_only(tmp_path):
  """Its record has no `lora`: it trained every parameter (lora.rank 0), so a resume with LoRA on is refused in one
  line naming lora.rank instead of being taken for a LoRA run."""
  workdir = str(tmp_path)
  plain = _grpo(rank=0)
  _recorded_without(workdir, plain, "lora")
  assert record.check_launch(workdir, plain, INPUTS) == {}
  with pytest.raises(record.RunMismatch, match=r"lora\.rank \(0 -> 4\)") as error:
    record.check_launch(workdir, _grpo(), INPUTS)
  assert "\n" not in str(error.value)


def test_an_eval_rebuilds_an_old_qlora_grpo_run_with_the_rollouts_it_ran(tmp_path):
  """`jaxpt eval` rebuilds a run from its config.json: one written before lora.rollouts is read as the run ran
  (merged), not with today's default (auto: the codes, unmerged), as a resume reads it."""
  from jaxpt.engine.evaluate import with_recorded_before
  from jaxpt.engine.trainers import TRAINERS

  workdir = str(tmp_path)
  _recorded_without(workdir, _grpo(rollouts="merged", base_quant="nf4", base_quant_block=16), "lora", "rollouts")
  recorded = record.recorded_config(workdir)
  assert "rollouts" not in recorded["lora"]
  filled = with_recorded_before(TRAINERS.get("grpo"), recorded)
  assert filled["lora"]["rollouts"] == "merged" and "rollouts" not in recorded["lora"]  # the record is untouched
  assert with_recorded_before(TRAINERS.get("grpo"), filled) == filled  # a field the record has is kept
