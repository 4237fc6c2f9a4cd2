"""Trainers started from a Hugging Face checkpoint (`init_from='hf:DIR'`): the model config and tokenizer come from
the checkpoint, the params are the checkpoint's, chat-template prompts, and SFT -> export -> import round trips.

The checkpoint is the tiny random Qwen2 fixture of tests/assets/hf (written by transformers), copied with
max_position_embeddings raised to 512 so that chat-template prompts fit (RoPE has no learned positions).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

import jaxpt
from jaxpt.config import ConfigError, config_dict, from_section, load_config_file
from jaxpt.data import math_task
from jaxpt.data.tokenizer import load_tokenizer
from jaxpt.models import hf, hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.trainers.grpo import GRPORunConfig
from jaxpt.engine.metrics import read_metrics
from jaxpt.trainers.sft import SFTRunConfig
from tests.test_models_hf import ASSETS, ROOT
from tests.test_train_rm import tiny_config as rm_tiny_config

CONFIGS = os.path.join(ROOT, "experiments", "configs")
RUNTIME = {"model.dtype": "float32", "model.remat": "none", "model.max_seq_len": 256}
SFT = {"steps": 6, "log_every": 2, "eval_every": 0, "checkpoint_every": 3, "progress": False,
       "task.name": "arithmetic", "task.num_steps": 1, "task.max_value": 9, "task.train_size": 64, "task.test_size": 16,
       "data.seq_len": 192, "data.batch_size": 8, "data.eval_batches": 0, "optim.learning_rate": 3e-3,
       "optim.warmup_steps": 0, "decode.prompt_len": 160, "decode.max_new_tokens": 32, "decode.eval_problems": 0}
GRPO = {"steps": 2, "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False,
        "task.name": "arithmetic", "task.num_steps": 1, "task.max_value": 9, "task.train_size": 8,
        "task.test_size": 8, "data.prompts_per_step": 2, "data.max_prompt_len": 200, "data.eval_prompts": 0,
        "sampling.max_new_tokens": 16, "grpo.group_size": 4, "grpo.minibatches": 1}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """The Qwen2 fixture with 512 positions."""
  path = str(tmp_path_factory.mktemp("qwen2"))
  shutil.copytree(os.path.join(ASSETS, "qwen2"), path, dirs_exist_ok=True)
  with open(os.path.join(path, hf_config.CONFIG_FILE)) as f:
    config = json.load(f)
  config["max_position_embeddings"] = 512
  with open(os.path.join(path, hf_config.CONFIG_FILE), "w") as f:
    json.dump(config, f)
  return path


def experiment_config(name: str, checkpoint: str, **overrides):
  """experiments/configs/<name>.py started from `checkpoint`, with `overrides` (flattened keys)."""
  config = load_config_file(os.path.join(CONFIGS, f"{name}.py"))
  config.update_from_flattened_dict({"init_from": f"hf:{checkpoint}", **RUNTIME, **overrides})
  return config


def test_the_model_section_comes_from_the_checkpoint(checkpoint):
  run = from_section(SFTRunConfig, experiment_config("sft_hf", checkpoint, **SFT), "config")
  assert run.model == hf.read_config(checkpoint, **{k.split(".")[1]: v for k, v in RUNTIME.items()})
  assert run.model.qkv_bias and run.model.tie_embeddings and run.model.d_model == 64
  grpo = from_section(GRPORunConfig, experiment_config("grpo_hf", checkpoint, **GRPO), "config")
  assert grpo.model == run.model


@pytest.mark.parametrize("key, value, message", [
    ("model.d_model", 32, r"^config\.model\.d_model=32: contradicts .*/config\.json, which gives 64$"),
    ("model.qkv_bias", False, None),  # False is the default: taken from the checkpoint (True), no error
    ("model.max_seq_len", 1024, r"^config\.model\.max_seq_len=1024: longer than the 512 positions of "),
    ("init_from", "hf:/nonexistent", r"^config\.init_from='hf:/nonexistent': /nonexistent: not a Hugging Face "
                                     r"checkpoint directory \(no such directory\)$"),
])
def test_a_field_that_contradicts_the_checkpoint_names_both_values(checkpoint, key, value, message):
  config = experiment_config("sft_hf", checkpoint, **SFT, **{key: value})
  if message is None:
    assert from_section(SFTRunConfig, config, "config").model.qkv_bias
    return
  with pytest.raises(ConfigError, match=message):
    from_section(SFTRunConfig, config, "config")


@pytest.mark.parametrize("override, message", [
    ({"model.qkv_bias": False}, r"^config\.model\.qkv_bias=False: contradicts .*/config\.json, which gives True$"),
    ({"model.d_model": 128}, r"^config\.model\.d_model=128: contradicts .*/config\.json, which gives 64$"),
    ({"model.num_kv_heads": 4}, r"^config\.model\.num_kv_heads=4: contradicts .*, which gives 2$"),
    ({"model.rope_theta": 10000.0}, r"^config\.model\.rope_theta=10000\.0: contradicts .*, which gives 1000000\.0$"),
    ({"model.max_seq_len": 2048}, r"^config\.model\.max_seq_len=2048: longer than the 512 positions of "),
    ({"model.d_model": 64, "model.qkv_bias": True, "model.head_dim": None, "model.max_seq_len": 256,
      "model.remat": "none"}, None),  # agreeing with the checkpoint, or not read from it
])
def test_an_override_at_the_default_that_contradicts_the_checkpoint_is_an_error(checkpoint, override, message):
  """Each override is its field's default (but the last case's): a config file holds every field, so the run config
  takes such a value for unset and fills the checkpoint's (the parametrized test above: qkv_bias False -> True);
  the command line's overrides tell it apart (`check_overrides`, as for lora.init_adapter's fields)."""
  from jaxpt.engine.config import check_overrides

  config = experiment_config("sft_hf", checkpoint, **SFT)
  if message is None:
    check_overrides(config, override)
    return
  with pytest.raises(ConfigError, match=message):
    check_overrides(config, override)


def test_the_cli_refuses_an_override_at_the_default_that_contradicts_the_checkpoint(tmp_path):
  """End to end through `jaxpt sft`: exit 2, one line naming the field, before any other check and with no workdir
  (before, the override was taken for unset: the run config had the checkpoint's qkv biases)."""
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  workdir = tmp_path / "run"
  done = subprocess.run([sys.executable, "-m", "jaxpt.cli", "sft", "--config", os.path.join(CONFIGS, "sft_hf.py"),
                         f"--workdir={workdir}", f"--config.init_from=hf:{os.path.join(ASSETS, 'qwen2')}",
                         "--config.model.qkv_bias=False"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
  assert re.fullmatch(r"jaxpt sft: config error: config\.model\.qkv_bias=False: contradicts .*/qwen2/config\.json, "
                      r"which gives True\n", done.stderr), done.stderr
  assert not workdir.exists()


def test_chat_prompts_are_the_tokenizers_chat_template(checkpoint):
  tokenizer = load_tokenizer(checkpoint)
  tokens, mask = math_task.encode_prompts(tokenizer, ["What is 2 + 3?"], 160, prompt_format="chat")
  expected = tokenizer.encode_chat([{"role": "user", "content": f"What is 2 + 3?\n{math_task.CHAT_INSTRUCTION}"}],
                                   add_generation_prompt=True)
  assert list(tokens[0][mask[0] > 0]) == expected
  assert tokenizer.decode(expected, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
  with pytest.raises(ConfigError, match=r"^config\.task\.prompt_format='chat': needs a Hugging Face tokenizer"):
    math_task.prompt_text("q", object(), "chat")  # e.g. jaxpt's sentencepiece tokenizer
  tokenizer.chat_templates.clear()
  with pytest.raises(Exception, match="chat template"):
    math_task.encode_prompts(tokenizer, ["q"], 160, prompt_format="chat")


@pytest.fixture(scope="module")
def sft_run(checkpoint, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sft_from_hf"))
  config = experiment_config("sft_hf", checkpoint, **SFT)
  setup = jaxpt.build("sft", config, workdir)
  return workdir, setup, jaxpt.train("sft", config, workdir, built=setup)


def test_sft_starts_from_the_checkpoints_params_and_tokenizer(sft_run, checkpoint):
  workdir, setup, result = sft_run
  assert os.path.isfile(os.path.join(workdir, "tokenizer", "tokenizer.json"))
  assert setup.data.tokenizer.model_proto == load_tokenizer(checkpoint).model_proto
  initial = setup.training.init_state().params
  _, want = hf.load(checkpoint, max_seq_len=256)
  jax.tree.map(np.testing.assert_array_equal, initial, want)
  losses = [r["loss"] for r in read_metrics(workdir) if "loss" in r]
  assert len(losses) == 3 and all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_sft_then_export_then_import_gives_identical_params(sft_run, tmp_path):
  workdir, _, result = sft_run
  model = jaxpt.load(workdir)
  assert model.save_hf(str(tmp_path)) == "transformers"
  assert hf_config.read_hf_json(str(tmp_path))["model_type"] == "qwen2"
  _, again = hf.load(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, again, result.state.params)
  assert load_tokenizer(str(tmp_path)).model_proto == model.tokenizer.model_proto


def test_sft_resumes_with_its_own_tokenizer_copy(sft_run, checkpoint, tmp_path):
  """A resumed run reads workdir/tokenizer even when the source checkpoint's tokenizer has changed since."""
  workdir, setup, result = sft_run
  config = experiment_config("sft_hf", checkpoint, **SFT)
  first = jaxpt.train("sft", config, str(tmp_path), built=jaxpt.build("sft", config, str(tmp_path)), stop_at=3)
  assert int(first.state.step) == 3
  source = os.path.join(checkpoint, "tokenizer_config.json")
  saved = open(source).read()
  try:
    with open(source, "w") as f:
      f.write(saved.replace('"<|im_end|>"', '"<|endoftext|>"', 1))
    resumed = jaxpt.train("sft", config, str(tmp_path), built=jaxpt.build("sft", config, str(tmp_path)))
  finally:
    with open(source, "w") as f:
      f.write(saved)
  assert load_tokenizer(os.path.join(str(tmp_path), "tokenizer")).model_proto == setup.data.tokenizer.model_proto
  jax.tree.map(np.testing.assert_array_equal, resumed.state.params, result.state.params)


def test_grpo_from_the_checkpoint_samples_chat_prompts(checkpoint, tmp_path):
  config = experiment_config("grpo_hf", checkpoint, **GRPO)
  trainer = jaxpt.build("grpo", config, str(tmp_path))
  _, want = hf.load(checkpoint, max_seq_len=256)
  jax.tree.map(np.testing.assert_array_equal, trainer.init_state().params, want)
  result = jaxpt.train("grpo", config, str(tmp_path), built=trainer)
  rows = read_metrics(str(tmp_path))
  assert int(result.state.step) == 2 and all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
  prompt = trainer.hooks.collector.prompts.batch(0)
  text = trainer.tokenizer.decode(prompt["prompt_tokens"][0][prompt["prompt_mask"][0] > 0], skip_special_tokens=False)
  assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_reward_model_backbone_from_the_checkpoint(tmp_path):
  llama = os.path.join(ASSETS, "llama")
  config = rm_tiny_config(**{"init_from": f"hf:{llama}", "steps": 1, "progress": False, "data.seq_len": 64,
                             "data.synthetic_train_pairs": 64, "data.synthetic_test_pairs": 16,
                             "data.batch_size": 8})
  config.model = config_dict(ModelConfig)  # every architecture field from the checkpoint
  setup = jaxpt.build("rm", config, str(tmp_path))
  assert setup.data.tokenizer.bos_id is not None  # Llama-3's HF tokenizer, not a trained sentencepiece
  _, want = hf.load(llama)
  jax.tree.map(np.testing.assert_array_equal, setup.training.init_state().params["backbone"], want)


def test_dpo_policy_and_reference_from_the_checkpoint(checkpoint, tmp_path):

  config = load_config_file(os.path.join(CONFIGS, "dpo_tiny.py"))
  config.model = config_dict(ModelConfig)
  config.update_from_flattened_dict({"init_from": f"hf:{checkpoint}", "steps": 1, "progress": False,
                                     "eval_every": 0, "data.batch_size": 4, "data.synthetic_train_pairs": 16,
                                     "data.synthetic_test_pairs": 8, "data.seq_len": 64, "dpo.dir": True})
  setup = jaxpt.build("dpo", config, str(tmp_path))
  assert setup.data.tokenizer.model_proto == load_tokenizer(checkpoint).model_proto
  state = setup.init_state()
  _, want = hf.load(checkpoint)
  jax.tree.map(np.testing.assert_array_equal, state.params, want)
  jax.tree.map(np.testing.assert_array_equal, setup.hooks.reference_params(), want)


def test_preference_prompts_in_the_chat_template(checkpoint, tmp_path):
  from jaxpt.data.preference_batches import PreferenceData

  tokenizer = load_tokenizer(checkpoint)
  section = dict(source="synthetic", seq_len=256, batch_size=4, synthetic_train_pairs=8, synthetic_test_pairs=4,
                 prompt_format="chat")
  data = PreferenceData.create(section, vocab_size=256, workdir=str(tmp_path), seed=0, tokenizer=tokenizer)
  pair, arrays = data._pairs["train"][0], data._arrays["train"]  # row 0 of the encoded split, before batching
  ids = (tokenizer.encode_chat([{"role": "user", "content": pair.prompt}], add_generation_prompt=True) +
         tokenizer.encode(pair.chosen) + [tokenizer.eos_id])
  assert len(ids) <= 256 and list(arrays["chosen_tokens"][0][:len(ids)]) == ids
  assert arrays["chosen_last"][0] == len(ids) - 1
  with pytest.raises(ConfigError, match=r"^config\.data\.prompt_format='chat': needs a Hugging Face tokenizer"):
    PreferenceData.create(section, vocab_size=256, workdir=str(tmp_path / "b"), seed=0,
                          tokenizer=types.SimpleNamespace(vocab_size=8))  # e.g. jaxpt's sentencepiece tokenizer


def test_a_run_config_built_in_python_is_checked_against_the_checkpoint(checkpoint):
  from jaxpt.trainers.dpo import DPORunConfig
  from jaxpt.engine.optim import OptimConfig

  with pytest.raises(ConfigError, match=r"^model\.d_model=128: contradicts .*/config\.json, which gives 64$"):
    DPORunConfig(init_from=f"hf:{checkpoint}", model=ModelConfig(), optim=OptimConfig())
  DPORunConfig(init_from=f"hf:{checkpoint}", model=hf.read_config(checkpoint, max_seq_len=256), optim=OptimConfig())


def test_a_tokenizer_without_eos_is_refused(tmp_path):
  from jaxpt.engine.init_from import init_tokenizer

  source = tmp_path / "src"
  shutil.copytree(os.path.join(ASSETS, "qwen2"), source)
  config = json.loads((source / "tokenizer_config.json").read_text())
  config["eos_token"] = None
  (source / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(ConfigError, match=r"^config\.init_from='hf:.*': .*the tokenizer has no EOS token"):
    init_tokenizer(f"hf:{source}", str(tmp_path / "run"), resuming=False, model_config=None)
  assert not (tmp_path / "run").exists()  # refused before anything is copied into the workdir
