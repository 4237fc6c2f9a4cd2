"""Reward-model export (`Model.save_hf` / `jaxpt export-hf` of a reward-model run) and its load back.

A Pre-Norm RMSNorm SwiGLU reward model is written as transformers' `LlamaForSequenceClassification` (the backbone's
tensors, `score.weight` [num_scores, d_model], no LM head), a SiameseNorm one as jaxpt's native `JaxptRewardModel`;
`jaxpt.load("hf:DIR")` reads either back as a reward model whose `score` equals the run's exactly, with its
tokenizer and prompt format. The live check that transformers' `AutoModelForSequenceClassification` gives the same
scores is the `slow` test (run it with JAXPT_HF_REFERENCE_PYTHON set to a python that has torch + transformers).
"""

import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest

import jaxpt
from jaxpt.api import run_export_hf
from jaxpt.config import ConfigError, DataError, config_dict
from jaxpt.data.preference_batches import response_sequences
from jaxpt.engine.config import check_hf_model
from jaxpt.models import hf, hf_config, hf_export
from jaxpt.models.config import ModelConfig
from tests.test_models_hf import ASSETS, ROOT, reference_python, tolerance
from tests.test_models_hf_export import read_tensors
from tests.test_train_rm import tiny_config

PROMPTS = ["Which is better?", "Q", "3 + 4 ="]
RESPONSES = ["The first one, clearly.", "A much longer answer " * 3, "7"]


def rm_run(workdir: str, **overrides) -> str:
  """A 2-step micro reward-model run with a checkpoint (a few seconds)."""
  config = tiny_config(**{
      "steps": 2, "log_every": 1, "eval_every": 0, "checkpoint_every": 2, "progress": False, "model.d_model": 32,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
      "data.synthetic_train_pairs": 64, "data.synthetic_test_pairs": 16, "data.batch_size": 8, **overrides})
  jaxpt.train("rm", config, workdir)
  return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Reward-model runs by name: Bradley-Terry and ODIN (two scores) on a Pre-Norm backbone with an untied LM head
  (which the export leaves out), Bradley-Terry on a SiameseNorm one."""
  root = tmp_path_factory.mktemp("reward_export")
  return {
      "bt": rm_run(str(root / "bt"), **{"model.tie_embeddings": False}),
      "odin": rm_run(str(root / "odin"), **{"rm.loss": "odin"}),
      "siamese": rm_run(str(root / "siamese"), **{"model.norm_scheme": "siamese_post_pre"}),
  }


@pytest.fixture(scope="module")
def qwen_chat(tmp_path_factory):
  """A 1-step reward-model run started from the Qwen2 fixture (its HF tokenizer) on chat-template prompts."""
  config = tiny_config(**{
      "init_from": f"hf:{os.path.join(ASSETS, 'qwen2')}", "steps": 1, "log_every": 1, "eval_every": 0,
      "checkpoint_every": 1, "progress": False, "data.seq_len": 64, "data.synthetic_train_pairs": 16,
      "data.synthetic_test_pairs": 8, "data.batch_size": 8, "data.prompt_format": "chat"})
  config.model = config_dict(ModelConfig, dtype="float32")  # every architecture field from the checkpoint
  workdir = str(tmp_path_factory.mktemp("reward_export_qwen"))
  jaxpt.train("rm", config, workdir)
  return workdir


@pytest.mark.parametrize("name,num_scores", [("bt", 1), ("odin", 2)])
def test_a_pre_norm_reward_model_exports_as_a_sequence_classifier_and_scores_the_same(runs, name, num_scores,
                                                                                     tmp_path):
  model = jaxpt.load(runs[name])
  assert model.kind == "reward" and model.num_scores == num_scores
  assert model.save_hf(str(tmp_path / "out")) == "transformers"
  written = hf_config.read_hf_json(str(tmp_path / "out"))
  assert written["architectures"] == ["LlamaForSequenceClassification"] and written["model_type"] == "llama"
  assert written["id2label"] == {"0": "reward"} if num_scores == 1 else {"0": "quality", "1": "length"}
  assert written[hf_config.REWARD_KEY] == dict(num_scores=num_scores, prompt_format="plain",
                                               score_names=list(written["id2label"].values()))
  assert written["pad_token_id"] == model.tokenizer.pad_id != written["eos_token_id"] == model.tokenizer.eos_id
  tensors = read_tensors(str(tmp_path / "out"))
  assert ("head" in model.params["backbone"]) == (name == "bt")  # bt's backbone has an untied LM head ...
  assert not any(key.startswith("lm_head") for key in tensors)  # ... which is no part of a reward model
  np.testing.assert_array_equal(tensors["score.weight"], np.asarray(model.params["head"]["kernel"]).T)
  assert "spm.model" in os.listdir(tmp_path / "out")

  again = jaxpt.load(f"hf:{tmp_path / 'out'}")
  assert (again.kind, again.num_scores, again.prompt_format) == ("reward", num_scores, "plain")
  assert again.config == dataclasses.replace(model.config, head_dim=model.config.resolved_head_dim)
  assert again.tokenizer.encode(RESPONSES[1]) == model.tokenizer.encode(RESPONSES[1])
  scores = model.score(PROMPTS, RESPONSES)
  assert scores.shape == ((3,) if num_scores == 1 else (3, 2))
  np.testing.assert_array_equal(again.score(PROMPTS, RESPONSES), scores)


def test_a_siamese_norm_reward_model_exports_in_jaxpt_format_and_scores_the_same(runs, tmp_path):
  model = jaxpt.load(runs["siamese"])
  assert model.save_hf(str(tmp_path / "out")) == "jaxpt"
  written = hf_config.read_hf_json(str(tmp_path / "out"))
  assert written["architectures"] == [hf_config.NATIVE_REWARD_ARCHITECTURE]
  assert written["model_type"] == hf_config.NATIVE_TYPE and written[hf_config.REWARD_KEY]["num_scores"] == 1
  assert "score.weight" in read_tensors(str(tmp_path / "out"))
  again = jaxpt.load(f"hf:{tmp_path / 'out'}")
  assert again.kind == "reward" and again.config == model.config
  np.testing.assert_array_equal(again.score(PROMPTS, RESPONSES), model.score(PROMPTS, RESPONSES))
  with pytest.raises(ConfigError, match=r"^model\.norm_scheme='siamese_post_pre': no transformers class"):
    model.save_hf(str(tmp_path / "t"), format="transformers")


def test_export_hf_command_writes_a_reward_model_run(runs, tmp_path, capsys):
  out = str(tmp_path / "out")
  assert run_export_hf(runs["odin"], None, out) == 0
  assert capsys.readouterr().out.startswith(f"jaxpt export-hf: wrote {runs['odin']} as a transformers-format "
                                            f"reward-model checkpoint to {out} ")
  np.testing.assert_array_equal(jaxpt.load(f"hf:{out}").score(PROMPTS, RESPONSES),
                                jaxpt.load(runs["odin"]).score(PROMPTS, RESPONSES))


def test_a_chat_reward_model_from_qwen2_exports_with_its_tokenizer_and_prompt_format(qwen_chat, tmp_path):
  """Started from a Hugging Face checkpoint and trained on its chat template: a Qwen2ForSequenceClassification
  with the HF tokenizer files, read back rendering prompts with the same template."""
  model = jaxpt.load(qwen_chat)
  assert model.prompt_format == "chat"
  assert model.save_hf(str(tmp_path / "out")) == "transformers"
  written = hf_config.read_hf_json(str(tmp_path / "out"))
  assert written["architectures"] == ["Qwen2ForSequenceClassification"]
  assert written[hf_config.REWARD_KEY]["prompt_format"] == "chat"
  assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "out"))
  again = jaxpt.load(f"hf:{tmp_path / 'out'}")
  assert again.prompt_format == "chat" and again.tokenizer.eos_id == model.tokenizer.eos_id
  assert again._prompt_ids(PROMPTS, True) == model._prompt_ids(PROMPTS, True)
  np.testing.assert_array_equal(again.score(PROMPTS, RESPONSES), model.score(PROMPTS, RESPONSES))


def test_no_pad_token_id_when_the_tokenizers_pad_is_its_eos():
  """transformers scores each row's last token that is not pad_token_id; jaxpt scores the EOS ending prompt +
  response. A tokenizer padding with its EOS (Llama 3, Qwen base) would have transformers score the token before."""
  backbone = dict(architectures=["LlamaForCausalLM"], model_type="llama", eos_token_id=7, pad_token_id=7)
  written = hf_export.reward_config(backbone, "llama", dict(num_scores=1, prompt_format="plain"))
  assert "pad_token_id" not in written and written["eos_token_id"] == 7
  assert "pad_token_id" not in hf_export.reward_config(dict(backbone, eos_token_id=[3, 7]), "llama",
                                                        dict(num_scores=1))
  assert hf_export.reward_config(dict(backbone, pad_token_id=0), "llama",
                                 dict(num_scores=1))["pad_token_id"] == 0


def test_a_model_of_the_wrong_kind_is_one_line_naming_the_path(runs, tmp_path):
  out = tmp_path / "out"
  jaxpt.load(runs["bt"]).save_hf(str(out))
  llama = os.path.join(ASSETS, "llama")
  with pytest.raises(ConfigError, match=rf"^path='hf:{llama}': holds a language model, not a reward model$"):
    jaxpt.load(f"hf:{llama}", kind="reward")
  with pytest.raises(ConfigError, match=rf"^path='{runs['bt']}': holds a reward model, not a language model$"):
    jaxpt.load(runs["bt"], kind="lm")
  with pytest.raises(ConfigError, match=rf"^path='hf:{out}': holds a reward model, not a language model$"):
    jaxpt.load(f"hf:{out}", kind="lm")
  assert jaxpt.load(f"hf:{out}", kind="reward").kind == "reward"
  with pytest.raises(DataError, match=rf"^{out}/config\.json: architectures=\['LlamaForSequenceClassification'\]: a "
                     r"reward model, not a causal language model \(jaxpt\.load\('hf:DIR'\) reads it as a reward "
                     r"model\)$"):
    hf.load(str(out))  # what init_from and other language-model reads use
  with pytest.raises(ConfigError, match=r"^init_from='hf:.*/out': .*config\.json: .*a reward model, not a causal"):
    check_hf_model(f"hf:{out}", jaxpt.load(runs["bt"]).config)
  with pytest.raises(DataError, match=rf"^{llama}/config\.json: .*a language model, not a reward model$"):
    hf.load_reward(llama)


def test_a_reward_export_that_contradicts_itself_names_the_file_and_field(runs, tmp_path):
  out = tmp_path / "out"
  jaxpt.load(runs["bt"]).save_hf(str(out))
  written = hf_config.read_hf_json(str(out))
  for record, field in ((dict(num_scores=2), "num_scores=2"), (dict(num_scores=1, prompt_format="json"),
                                                               "prompt_format='json'")):
    (out / hf_config.CONFIG_FILE).write_text(json.dumps(dict(written, **{hf_config.REWARD_KEY: record})))
    with pytest.raises(DataError, match=rf"^{out}/config\.json: jaxpt_reward\.{field}: must be"):
      jaxpt.load(f"hf:{out}")
  (out / hf_config.CONFIG_FILE).write_text(json.dumps(dict(
      written, id2label={"0": "a", "1": "b"}, **{hf_config.REWARD_KEY: dict(num_scores=2)})))
  with pytest.raises(DataError, match=r"model\.safetensors: tensor 'score\.weight' has shape \[1, 32\], "
                     r"config\.json implies \[2, 32\]"):
    jaxpt.load(f"hf:{out}")


@pytest.mark.slow
@pytest.mark.skipif(reference_python() is None, reason="torch + transformers not importable here and "
                    "JAXPT_HF_REFERENCE_PYTHON unset")
def test_transformers_scores_every_sequence_classifier_export_the_same(runs, qwen_chat, tmp_path):
  """Export -> `transformers.AutoModelForSequenceClassification.from_pretrained` on right-padded prompt + response
  + EOS rows (tools/check_hf_export.py) -> the scores `Model.score` gives, one row per score (Llama: BT, ODIN;
  Qwen2 with chat-template prompts)."""
  expected = {}
  for name, workdir in (("bt", runs["bt"]), ("odin", runs["odin"]), ("qwen_chat", qwen_chat)):
    model = jaxpt.load(workdir)
    model.save_hf(str(tmp_path / name))
    tok = model.tokenizer
    prompts = model._prompt_ids(PROMPTS, model.prompt_format == "chat")  # as Model.score renders them
    tokens, last = response_sequences(prompts, [tok.encode(r) for r in RESPONSES], model.config.max_seq_len,
                                      tok.pad_id, tok.eos_id)
    assert max(last) < model.config.max_seq_len - 1  # no row truncated, and every row padded
    np.save(tmp_path / name / "ids.npy", tokens)  # padded rows: transformers must find each row's EOS
    expected[name] = model.score(PROMPTS, RESPONSES).reshape(len(PROMPTS), -1)
  proc = subprocess.run([reference_python(), os.path.join(ROOT, "tools", "check_hf_export.py"), str(tmp_path),
                         *expected], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for name, want in expected.items():
    theirs = np.load(tmp_path / name / "transformers_scores.npy")
    assert theirs.shape == want.shape and float(np.abs(theirs - want).max()) <= tolerance(want), name
