"""The Python API (`jaxpt.load` -> Model: logits, generate, score, save_hf) against the models' own forward passes.

Each method is checked against an independent statement: `logits` against `TransformerLM.apply` on params restored
by the Checkpointer, greedy `generate` against a plain argmax loop over full-sequence logits (no KV cache, no
padding), `score` against `RewardModel.apply` on hand-built prompt + response + EOS rows.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpt
from jaxpt.api import Model, run_export_hf
from jaxpt.config import ConfigError
from jaxpt.data.hf_tokenizer import HFTokenizer
from jaxpt.data.tokenizer import Tokenizer
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import TransformerLM
from tests.test_models_hf import ASSETS, ROOT
from tests.test_train_pretrain import micro_config
from tests.test_train_rm import tiny_config as rm_tiny_config

PROMPTS = ["def main(", "import os\nimport"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  """A 4-step MICRO SiameseNorm pretraining run with checkpoints at steps 2 and 4."""
  workdir = str(tmp_path_factory.mktemp("api_lm"))
  jaxpt.train("pretrain", micro_config(steps=4, log_every=2, eval_every=0, checkpoint_every=2,
                                       **{"model.norm_scheme": "siamese_post_pre"}), workdir)
  return workdir


@pytest.fixture(scope="module")
def lm(lm_run):
  return jaxpt.load(lm_run)


@pytest.fixture(scope="module")
def qwen2():
  return jaxpt.load(f"hf:{os.path.join(ASSETS, 'qwen2')}")


def greedy_by_argmax(model, prompt_ids: list[int], steps: int) -> list[int]:
  """Greedy continuation by recomputing the logits of the whole sequence each step (stops after EOS), the sequence
  right-padded to one width (causal attention never lets a position see the padding after it): one compile."""
  forward = jax.jit(lambda params, ids: TransformerLM(model.config).apply({"params": params}, ids))
  ids = np.zeros((1, len(prompt_ids) + steps), np.int32)
  ids[0, :len(prompt_ids)] = prompt_ids
  length, out = len(prompt_ids), []
  for _ in range(steps):
    token = int(np.argmax(np.asarray(forward(model.params, jnp.asarray(ids)))[0, length - 1]))
    out.append(token)
    if token == model.tokenizer.eos_id:
      break
    ids[0, length] = token
    length += 1
  return out


def test_logits_are_the_models_forward_on_the_restored_params(lm, lm_run):
  assert lm.kind == "lm" and lm.config.norm_scheme == "siamese_post_pre" and isinstance(lm.tokenizer, Tokenizer)
  ids = np.array([[5, 9, 17, 3], [40, 2, 2, 8]], np.int32)
  logits = lm.logits(ids)
  assert logits.shape == (2, 4, lm.config.vocab_size) and logits.dtype == jnp.float32
  from jaxpt.engine.checkpoint import Checkpointer

  checkpointer = Checkpointer(lm_run, async_save=False)
  params = checkpointer.restore_params(lm.params)
  checkpointer.close()
  want = TransformerLM(lm.config).apply({"params": params}, ids)  # un-jitted: equal up to float reassociation
  np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_load_step_reads_that_checkpoint(lm, lm_run):
  earlier = jaxpt.load(lm_run, step=2)
  assert not np.array_equal(np.asarray(earlier.params["embedding"]), np.asarray(lm.params["embedding"]))
  with pytest.raises(FileNotFoundError, match="no checkpoint at step 3 .checkpoints at steps 2, 4."):
    jaxpt.load(lm_run, step=3)


@pytest.mark.parametrize("which", ["lm", "qwen2"])
def test_greedy_generate_is_the_argmax_loop(which, request):
  model = request.getfixturevalue(which)
  texts = model.generate(PROMPTS, max_new_tokens=6)
  for prompt, text in zip(PROMPTS, texts):
    expected = greedy_by_argmax(model, model._prompt_ids([prompt], chat=False)[0], 6)
    assert text == model.tokenizer.decode(expected), (prompt, expected)


def test_generate_stops_at_the_generation_configs_other_stop_ids(qwen2, tmp_path):
  """generation_config.json's eos_token_id list (an instruct model's end-of-turn id beside EOS) stops a row as
  transformers' generate does: with the second prompt's first greedy token added there, that row stops at it and
  the first, which never draws it, runs to max_new_tokens."""
  free = [greedy_by_argmax(qwen2, ids, 6) for ids in qwen2._prompt_ids(PROMPTS, chat=False)]
  stop = free[1][0]
  assert stop not in free[0] and qwen2.tokenizer.eos_id not in free[0] + free[1]
  path = tmp_path / "qwen2"
  shutil.copytree(os.path.join(ASSETS, "qwen2"), path)
  generation = json.loads((path / "generation_config.json").read_text())
  generation["eos_token_id"] = [generation["eos_token_id"], stop]
  (path / "generation_config.json").write_text(json.dumps(generation))
  model = jaxpt.load(f"hf:{path}")
  assert model.tokenizer.stop_ids == (qwen2.tokenizer.eos_id, stop)
  decode = model.tokenizer.decode
  assert model.generate(PROMPTS, max_new_tokens=6) == [decode(free[0]), decode(free[1][:1])]
  assert qwen2.generate(PROMPTS, max_new_tokens=6) == [decode(free[0]), decode(free[1])]  # without it: 6 tokens


def test_hf_checkpoint_brings_its_tokenizer_and_adds_its_special_tokens(qwen2):
  assert isinstance(qwen2.tokenizer, HFTokenizer) and qwen2.config.qkv_bias
  assert qwen2._prompt_ids(["hi"], chat=False)[0] == qwen2.tokenizer.encode("hi", add_special_tokens=True)
  llama = jaxpt.load(f"hf:{os.path.join(ASSETS, 'llama')}")
  # Llama-3's post-processor adds <|begin_of_text|>
  assert llama._prompt_ids(["hi"], chat=False)[0][0] == llama.tokenizer.bos_id


def test_sampled_generate_is_seeded(lm):
  one = lm.generate(PROMPTS, max_new_tokens=5, temperature=1.0, top_k=20, top_p=0.9, seed=3)
  assert one == lm.generate(PROMPTS, max_new_tokens=5, temperature=1.0, top_k=20, top_p=0.9, seed=3)
  others = [lm.generate(PROMPTS, max_new_tokens=5, temperature=1.0, seed=s) for s in range(4)]
  assert len({tuple(o) for o in others}) > 1


def test_generate_through_the_engine_equals_the_static_sampler(lm):
  """engine=: greedy text as the static sampler's; sampled as the static sampler's with per-row keys (the engine's
  key scheme), on the same left-padded prompt rows, with one slot (each row waits for the previous one's)."""
  from jaxpt.rl.engine import EngineConfig
  from jaxpt.rl.sampler import SamplingConfig

  engine = EngineConfig(num_slots=1, page_size=4)
  assert lm.generate(PROMPTS, max_new_tokens=6, engine=engine) == lm.generate(PROMPTS, max_new_tokens=6)
  texts = lm.generate(PROMPTS, max_new_tokens=6, temperature=1.0, top_k=20, seed=3, engine=engine)
  ids = lm._prompt_ids(PROMPTS, chat=False)
  pad_id = lm.tokenizer.pad_id or 0
  tokens, mask = np.full((2, 16), pad_id, np.int32), np.zeros((2, 16), np.int32)
  for row, prompt in enumerate(ids):
    tokens[row, 16 - len(prompt):], mask[row, 16 - len(prompt):] = prompt, 1
  sampling = SamplingConfig(6, top_k=20, eos_id=lm.tokenizer.eos_id, pad_id=pad_id, row_keys=True)
  out = lm._sampler(sampling, 16)(lm.params, tokens, mask, jax.random.PRNGKey(3))
  assert texts == [lm.tokenizer.decode(row[m > 0]) for row, m in zip(np.asarray(out.tokens), np.asarray(out.mask))]
  assert texts != lm.generate(PROMPTS, max_new_tokens=6, temperature=1.0, top_k=20, seed=3)  # not the step keys


def test_save_hf_then_load_gives_the_same_model(lm, tmp_path):
  assert lm.save_hf(str(tmp_path / "export")) == "jaxpt"  # SiameseNorm: transformers has no class for it
  assert "spm.model" in os.listdir(tmp_path / "export")
  again = jaxpt.load(f"hf:{tmp_path / 'export'}")
  assert again.config == lm.config
  ids = np.array([[5, 9, 17, 3]], np.int32)
  np.testing.assert_array_equal(np.asarray(again.logits(ids)), np.asarray(lm.logits(ids)))
  assert again.generate(PROMPTS, max_new_tokens=4) == lm.generate(PROMPTS, max_new_tokens=4)


def test_hf_model_saves_in_transformers_format_with_its_tokenizer(qwen2, tmp_path):
  assert qwen2.save_hf(str(tmp_path)) == "transformers"
  assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= set(os.listdir(tmp_path))
  again = jaxpt.load(f"hf:{tmp_path}")
  assert again.tokenizer.encode("x + y", add_special_tokens=True) == qwen2.tokenizer.encode(
      "x + y", add_special_tokens=True)


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("api_rm"))
  config = rm_tiny_config(**{
      "steps": 2, "log_every": 1, "eval_every": 0, "checkpoint_every": 2, "progress": False, "model.d_model": 32,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
      "data.synthetic_train_pairs": 64, "data.synthetic_test_pairs": 16, "data.batch_size": 8})
  jaxpt.train("rm", config, workdir)
  return workdir


def test_score_is_the_reward_models_forward_on_prompt_response_eos(reward_run):
  model = jaxpt.load(reward_run)
  assert model.kind == "reward"
  prompts, responses = ["Which is better?", "Q"], ["The first one, clearly.", "A much longer answer " * 3]
  scores = model.score(prompts, responses)
  assert scores.shape == (2,) and scores.dtype == np.float32
  tok = model.tokenizer
  for i, (p, r) in enumerate(zip(prompts, responses)):
    ids = tok.encode(p) + tok.encode(r) + [tok.eos_id]
    want = RewardModel(model.config).apply({"params": model.params}, jnp.asarray([ids]),
                                           jnp.asarray([len(ids) - 1]))[0]
    np.testing.assert_allclose(scores[i], np.asarray(want)[0], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="is a reward model .use score."):
    model.logits(np.zeros((1, 2), np.int32))


def test_bad_paths_and_calls_fail_in_one_line(lm, lm_run, tmp_path):
  with pytest.raises(FileNotFoundError, match="no such directory"):
    jaxpt.load(str(tmp_path / "missing"))
  with pytest.raises(ConfigError, match="is a Hugging Face checkpoint directory: load it as 'hf:"):
    jaxpt.load(os.path.join(ASSETS, "llama"))
  with pytest.raises(ConfigError, match=r"model\.d_model=64: contradicts the run's config.json, which gives 32"):
    jaxpt.load(lm_run, d_model=64)
  with pytest.raises(ValueError, match="is a language model .use logits / generate."):
    lm.score(["a"], ["b"])
  with pytest.raises(ValueError, match="exceeds config.max_seq_len=32"):
    lm.generate(["x"], max_new_tokens=40)
  assert lm.generate([]) == []


def test_export_hf_command(lm_run, tmp_path, capsys):
  out = str(tmp_path / "export")
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "export-hf", "--workdir", lm_run, "--out", out,
                           "--step", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith(f"jaxpt export-hf: wrote {lm_run} as a jaxpt-format checkpoint to {out} ")
  np.testing.assert_array_equal(np.asarray(jaxpt.load(f"hf:{out}").params["embedding"]),
                                np.asarray(jaxpt.load(lm_run, step=2).params["embedding"]))
  assert run_export_hf(lm_run, None, out) == 2
  assert capsys.readouterr().err == f"jaxpt export-hf: {out}: exists and is not empty (choose a new directory, or " \
                                    "overwrite=True / --overwrite)\n"
  assert run_export_hf(lm_run, None, str(tmp_path / "t"), format="transformers") == 2
  assert capsys.readouterr().err.startswith("jaxpt export-hf: model.norm_scheme='siamese_post_pre': no transformers")
  missing = subprocess.run([sys.executable, "-m", "jaxpt.cli", "export-hf", "--workdir", lm_run],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert missing.returncode == 2 and "and --out" in missing.stderr.splitlines()[0], missing.stderr


def test_prompts_are_tokenized_as_the_trainers_tokenize_them(tmp_path):
  """Plain prompts get the HF post-processor's BOS (as in training and in transformers); chat renderings write
  their own, so it is never doubled."""
  llama = jaxpt.load(f"hf:{os.path.join(ASSETS, 'llama')}")
  bos = llama.tokenizer.bos_id
  plain, chat = llama._prompt_ids(["hi"], chat=False)[0], llama._prompt_ids(["hi"], chat=True)[0]
  assert plain[0] == bos and chat[0] == bos and chat.count(bos) == 1
  from jaxpt.data import math_task

  tokens, mask = math_task.encode_prompts(llama.tokenizer, ["hi"], 16)
  assert list(tokens[0][mask[0] > 0]) == llama._prompt_ids([math_task.prompt_text("hi")], chat=False)[0]
  with pytest.raises(ValueError, match="temperature=-1.0: must be >= 0"):
    llama.generate(["hi"], temperature=-1.0)


def test_a_broken_tokenizer_is_reported_not_dropped(tmp_path):
  import shutil

  shutil.copytree(os.path.join(ASSETS, "qwen2"), tmp_path / "q")
  (tmp_path / "q" / "tokenizer_config.json").write_text("{not json")
  with pytest.raises(Exception, match=r"tokenizer_config\.json: not valid JSON"):
    jaxpt.load(f"hf:{tmp_path / 'q'}")


def test_an_hf_model_saved_without_its_tokenizer_loads_and_says_so_where_it_needs_one(qwen2, tmp_path):
  """What `save_pretrained` writes for a model alone (config.json, weights, generation_config.json) loads: its
  logits are the full checkpoint's; generate and score name the missing tokenizer."""
  import shutil

  source = os.path.join(ASSETS, "qwen2")
  (tmp_path / "m").mkdir()
  for name in ("config.json", "generation_config.json", "model.safetensors"):
    shutil.copy(os.path.join(source, name), tmp_path / "m" / name)
  alone = jaxpt.load(f"hf:{tmp_path / 'm'}")
  assert alone.tokenizer is None
  ids = [[3, 5, 7, 11]]
  np.testing.assert_array_equal(np.asarray(alone.logits(ids)), np.asarray(qwen2.logits(ids)))
  with pytest.raises(ValueError, match=r"generate: .*m has no tokenizer \(pass token ids to logits instead\)"):
    alone.generate(["hi"])


def test_scan_layers_of_a_run_cannot_be_overridden(lm_run):
  with pytest.raises(ConfigError, match=r"^model\.scan_layers=False: contradicts the run's config.json"):
    jaxpt.load(lm_run, scan_layers=False)


def test_load_names_a_checkpoint_that_does_not_fit_the_recorded_config(lm_run, tmp_path):
  """Issue 33: with config.json out of step with the checkpoint, `jaxpt.load` succeeded and `.logits` raised a Flax
  traceback; now the load says which parameter differs, in one line."""
  workdir = tmp_path / "run"
  shutil.copytree(lm_run, workdir)
  recorded = json.loads((workdir / "config.json").read_text())
  recorded["model"]["mlp_dim"] = 2 * recorded["model"]["mlp_dim"]
  (workdir / "config.json").write_text(json.dumps(recorded))
  with pytest.raises(ValueError, match=r"^.*run: the checkpoint at step 4 does not fit the run's config\.json: "
                     r"params/.*has shape \(1, 32, 64\) there, the config gives \(1, 32, 128\)$"):
    jaxpt.load(str(workdir))


def test_token_ids_outside_the_vocabulary_are_one_line_naming_the_id_and_position(lm, reward_run):
  """Before: accepted; the jitted embedding gather filled or clamped them into a plausible-looking answer."""
  vocab = lm.config.vocab_size
  ids = np.array([[5, 9, 17, 3], [40, 2, vocab, 8]], np.int32)
  with pytest.raises(ValueError, match=rf"^logits: token id {vocab} at position \(1, 2\) of token_ids is outside "
                                       rf"the model's vocabulary \[0, {vocab}\) \(config.vocab_size={vocab}\)$"):
    lm.logits(ids)
  with pytest.raises(ValueError, match=r"^logits: token id -1 at position \(0, 0\) of token_ids "):
    lm.logits([[-1, 2]])
  # A tokenizer larger than the model's vocabulary: the model here has 8 ids, its tokenizer 512.
  small = Model(dataclasses.replace(lm.config, vocab_size=8), lm.params, lm.tokenizer, source=lm.source)
  first = lm._prompt_ids([PROMPTS[0]], chat=False)[0]
  j = next(j for j, token in enumerate(first) if token >= 8)
  with pytest.raises(ValueError, match=rf"^generate: token id {first[j]} at position \(0, {j}\) of the prompts' "
                                       r"token ids is outside the model's vocabulary \[0, 8\)"):
    small.generate(PROMPTS, max_new_tokens=2)
  reward = jaxpt.load(reward_run)
  reward = Model(dataclasses.replace(reward.config, vocab_size=8), reward.params, reward.tokenizer, kind="reward",
                 source=reward.source)
  with pytest.raises(ValueError, match=r"^score: token id \d+ at position \(0, \d+\) of the prompt \+ response \+ "
                                       r"EOS token ids is outside the model's vocabulary \[0, 8\)"):
    reward.score(["Which is better?"], ["The first one."])
