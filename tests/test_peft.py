"""LoRA adapters in PEFT's format (`jaxpt.models.hf_peft`) against the golden adapters and logits PEFT wrote over the
tiny HF fixtures (tests/assets/peft/<family>/, tools/make_peft_fixtures.py): loaded into jaxpt they reproduce
PEFT's logits; saved again they are the same tensors under the same names; a run started from them
(`lora.init_adapter`) starts with them; `export-hf --merge` computes as the unmerged run; bad input is one line."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import jaxpt
from jaxpt.api import run_export_hf
from jaxpt.config import ConfigError, config_dict, from_section
from jaxpt.models import hf, hf_peft
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn import quant as quant_lib
from jaxpt.nn.lora import LoRAConfig
from jaxpt.trainers.sft import SFTRunConfig
from tests.test_models_hf import ASSETS, ROOT
from tests.test_train_from_hf import RUNTIME, SFT, experiment_config

PEFT = os.path.join(ROOT, "tests", "assets", "peft")
FAMILIES = ("llama", "qwen2", "qwen3")


def tolerance(reference_logits) -> float:
  """max abs logit error allowed: 1e-5 relative to the logit scale (fp32 on both sides)."""
  return 1e-5 * max(1.0, float(np.abs(reference_logits).max()))


def golden(family: str) -> tuple[dict, dict, dict]:
  """(adapter_config.json, tensors, reference.npz) PEFT wrote for `family`."""
  directory = os.path.join(PEFT, family)
  with open(os.path.join(directory, hf_peft.ADAPTER_CONFIG)) as f:
    config = json.load(f)
  return config, load_file(os.path.join(directory, hf_peft.ADAPTER_WEIGHTS)), dict(np.load(
      os.path.join(directory, "reference.npz")))


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request):
  family = request.param
  return family, jaxpt.load(f"hf:{os.path.join(ASSETS, family)}", adapter=os.path.join(PEFT, family),
                            dtype="float32")


def test_peft_adapters_over_the_hf_base_give_peft_logits(loaded):
  family, model = loaded
  config, _, reference = golden(family)
  assert (model.lora.rank, model.lora.alpha, model.lora.rslora) == (config["r"], config["lora_alpha"],
                                                                    config["use_rslora"])
  ids = reference["input_ids"]
  np.testing.assert_allclose(model.logits(ids), reference["logits"], atol=tolerance(reference["logits"]), rtol=0)
  if family != "llama":  # the unmerged model of the qwen2 adapters: test_a_run_from_peft_adapters_starts_with_them
    return
  # the same adapters unmerged (every projection, o's A [H, D, r] included), as the trainers run them
  base = hf.load_params(os.path.join(ASSETS, family), model.config)
  unmerged = jax.jit(TransformerLM(model.config, lora=model.lora.spec()).apply)(
      {"params": lora_lib.with_adapters(base, model.adapters)}, jnp.asarray(ids))
  np.testing.assert_allclose(unmerged, reference["logits"], atol=tolerance(reference["logits"]), rtol=0)


def test_merged_kernels_are_w_plus_s_b_a_in_float64(loaded):
  """Layer 1's adapted kernels against NumPy float64 on the files: W [out, in] + s B [out, r] A [r, in], PEFT's
  merge, transposed into jaxpt's layout."""
  family, model = loaded
  config, tensors, _ = golden(family)
  scale = config["lora_alpha"] / (np.sqrt(config["r"]) if config["use_rslora"] else config["r"])
  weights = load_file(os.path.join(ASSETS, family, hf.WEIGHTS_FILE))
  kernels = {"q_proj": ("attn", "query"), "o_proj": ("attn", "out"), "v_proj": ("attn", "value"),
             "gate_proj": ("mlp", "wi_gate"), "down_proj": ("mlp", "wo")}
  checked = 0
  for module, (block, name) in kernels.items():
    where = "self_attn" if block == "attn" else "mlp"
    stem = f"model.layers.1.{where}.{module}"
    if f"base_model.model.{stem}.lora_A.weight" not in tensors:
      continue
    a = tensors[f"base_model.model.{stem}.lora_A.weight"].astype(np.float64)
    b = tensors[f"base_model.model.{stem}.lora_B.weight"].astype(np.float64)
    want = (weights[f"{stem}.weight"].astype(np.float64) + scale * b @ a).T  # [in, out]
    got = np.asarray(model.params["decoder"]["layers"][block][name]["kernel"][1], np.float64)
    np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-6, rtol=0)
    checked += 1
  assert checked >= 2, family


def test_load_then_save_gives_the_golden_tensors_and_config(loaded, tmp_path):
  family, model = loaded
  config, tensors, _ = golden(family)
  model.save_adapters(str(tmp_path / "out"))
  written = load_file(str(tmp_path / "out" / hf_peft.ADAPTER_WEIGHTS))
  assert sorted(written) == sorted(tensors)
  for name, value in tensors.items():
    assert written[name].dtype == np.float32 and written[name].shape == value.shape, name
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  with open(tmp_path / "out" / hf_peft.ADAPTER_CONFIG) as f:
    again = json.load(f)
  for key in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "bias", "use_dora"):
    assert again[key] == config[key], key
  assert sorted(again["target_modules"]) == sorted(config["target_modules"])
  assert again["base_model_name_or_path"] == os.path.join(ROOT, config["base_model_name_or_path"])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  """An SFT run over the Qwen2 fixture (512 positions) started from PEFT's qwen2 adapters (`lora.init_adapter`; the
  lora fields from its adapter_config.json), 2 steps, checkpointed: (workdir, built, its config)."""
  base = str(tmp_path_factory.mktemp("qwen2"))
  shutil.copytree(os.path.join(ASSETS, "qwen2"), base, dirs_exist_ok=True)
  with open(os.path.join(base, "config.json")) as f:
    hf_json = json.load(f)
  with open(os.path.join(base, "config.json"), "w") as f:
    json.dump(dict(hf_json, max_position_embeddings=512), f)
  config = experiment_config("sft_hf", base, **{**SFT, "steps": 2, "checkpoint_every": 2, "log_every": 1,
                                                "lora.init_adapter": os.path.join(PEFT, "qwen2")})
  workdir = str(tmp_path_factory.mktemp("sft_peft"))
  built = jaxpt.build("sft", config, workdir)
  initial = jax.device_get(built.training.init_state().params)
  jaxpt.train("sft", config, workdir, built=built)
  return workdir, built, initial, base


def test_a_run_from_peft_adapters_starts_with_them(lora_run):
  _, built, initial, base = lora_run
  adapter = built.config.lora
  assert (adapter.rank, adapter.alpha, adapter.targets, adapter.rslora, adapter.dropout) == (2, 6.0, "q,v", False,
                                                                                              0.05)
  _, tensors, reference = golden("qwen2")
  a = initial["decoder"]["layers"]["attn"]["value"]["lora_a"]  # [layers, d, r]
  b = initial["decoder"]["layers"]["attn"]["value"]["lora_b"]  # [layers, r, H_kv, D]
  for layer in range(2):
    stem = f"base_model.model.model.layers.{layer}.self_attn.v_proj"
    np.testing.assert_array_equal(a[layer], tensors[f"{stem}.lora_A.weight"].T)
    np.testing.assert_array_equal(b[layer].reshape(2, -1), tensors[f"{stem}.lora_B.weight"].T)
  logits = jax.jit(built.training.model.apply)({"params": initial}, reference["input_ids"])
  np.testing.assert_allclose(logits, reference["logits"], atol=tolerance(reference["logits"]), rtol=0)


@pytest.mark.parametrize("rollouts", ["merged", "unmerged"])
def test_the_reference_of_a_run_from_peft_adapters_is_its_start(lora_run, rollouts, tmp_path):
  """DPO from `lora.init_adapter` (an SFT adapter, say): the frozen reference is the policy the run starts from, the
  base plus those adapters, not the base alone, so the first step's loss is ln 2 (z = 0: policy = reference) and the
  eval's implicit rewards start at 0; GRPO's
  and PPO's reference (`lora_reference`, either rollout layout) is that start too, as the merged model reads it."""
  from jaxpt.trainers.grpo import lora_reference

  *_, base = lora_run
  config = experiment_config("dpo_tiny", base, **{
      "steps": 1, "log_every": 1, "eval_every": 0, "progress": False, "data.batch_size": 4, "data.seq_len": 64,
      "data.synthetic_train_pairs": 8, "data.synthetic_test_pairs": 4, "lora.init_adapter": os.path.join(PEFT, "qwen2"),
      "lora.rollouts": rollouts})
  config.model = config_dict(ModelConfig, **{k.split(".")[1]: v for k, v in RUNTIME.items()})
  built = jaxpt.build("dpo", config, str(tmp_path))
  state = built.init_state()
  adapters = lora_lib.adapter_params(jax.device_get(state.params))
  assert any(np.abs(leaf).max() > 0 for leaf in jax.tree.leaves(adapters))  # PEFT's B != 0: not the base
  reference = built.hooks.reference_params(state.params)
  jax.tree.map(np.testing.assert_array_equal, lora_lib.adapter_params(jax.device_get(reference)), adapters)
  want = built.training.merged_params(state.params)  # the start, merged
  got = lora_reference(built.training, state.params)
  if rollouts == "unmerged":
    got = built.training.merged_params(got)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(got), jax.device_get(want))
  evaluator = built.hooks.evaluator  # the eval's implicit rewards beta (logp - ref) read that reference too: 0
  rewards = evaluator.score(state.params, evaluator.device_batches[evaluator.splits[0]][0])
  np.testing.assert_array_equal(np.asarray(rewards), 0.0)
  metrics = built.train_step(state, next(built.batches(0)))[1]  # last: the step may donate the state
  assert float(metrics["dpo_loss"]) == pytest.approx(np.log(2.0), abs=1e-6)


def test_export_merge_computes_as_the_unmerged_run_and_adapters_round_trip(lora_run, tmp_path, capsys):
  workdir, built, initial, base = lora_run
  ids = golden("qwen2")[2]["input_ids"]
  run = jaxpt.load(workdir, dtype="float32")
  assert run.lora is not None and not any("lora" in jax.tree_util.keystr(p)
                                          for p, _ in jax.tree_util.tree_leaves_with_path(run.params))
  trained = jax.tree.leaves(run.adapters)
  assert not all(np.array_equal(x, y) for x, y in zip(trained, jax.tree.leaves(lora_lib.adapter_params(initial))))
  unmerged_params = lora_lib.with_adapters(hf.load_params(base, run.config), run.adapters)
  unmerged = jax.jit(built.training.model.apply)({"params": unmerged_params}, ids)
  forward = jax.jit(TransformerLM(run.config).apply)  # the model without LoRA, on merged params

  assert run_export_hf(workdir, None, str(tmp_path / "merged"), merge=True) == 0
  assert "its LoRA adapters merged" in capsys.readouterr().out
  merged = jaxpt.load(f"hf:{tmp_path / 'merged'}", dtype="float32")
  np.testing.assert_allclose(forward({"params": merged.params}, ids), unmerged, atol=tolerance(unmerged), rtol=0)

  command = [sys.executable, "-m", "jaxpt.cli", "export-hf", "--workdir", workdir, "--out", str(tmp_path / "adapters"),
             "--adapters"]  # the CLI's flag, end to end
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  assert result.returncode == 0 and "in PEFT's format" in result.stdout, result.stderr
  with open(tmp_path / "adapters" / hf_peft.ADAPTER_CONFIG) as f:
    assert json.load(f)["base_model_name_or_path"] == base
  again = jaxpt.load(f"hf:{base}", adapter=str(tmp_path / "adapters"), dtype="float32")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(again.adapters), jax.device_get(run.adapters))
  np.testing.assert_allclose(forward({"params": again.params}, ids), unmerged, atol=tolerance(unmerged), rtol=0)


def test_export_of_a_lora_run_needs_merge_or_adapters(lora_run, tmp_path, capsys):
  workdir = lora_run[0]
  cases = [(dict(), r"is a LoRA run: --merge writes the full model .* --adapters the adapters alone"),
           (dict(merge=True, adapters=True), r"--merge and --adapters: choose one"),
           (dict(adapters=True, format="jaxpt"), r"--format=jaxpt: --adapters writes PEFT's format")]
  for kwargs, message in cases:
    assert run_export_hf(workdir, None, str(tmp_path / "out"), **kwargs) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err
  assert run_export_hf(f"hf:{os.path.join(ASSETS, 'qwen2')}", None, str(tmp_path / "out"), merge=True) == 2
  assert "is not a LoRA run (no adapters)" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "out")


def sft_config(adapter: str, **overrides):
  return experiment_config("sft_hf", os.path.join(ASSETS, "qwen2"),
                           **{**SFT, "model.max_seq_len": 128, "data.seq_len": 128, "decode.prompt_len": 96,
                              "lora.init_adapter": adapter, **overrides})


def edited_adapter(tmp_path, family: str = "qwen2", **changes) -> str:
  """A copy of PEFT's `family` adapter with adapter_config.json `changes`."""
  directory = str(tmp_path / f"{family}_edited")
  shutil.copytree(os.path.join(PEFT, family), directory)
  with open(os.path.join(directory, hf_peft.ADAPTER_CONFIG)) as f:
    config = json.load(f)
  with open(os.path.join(directory, hf_peft.ADAPTER_CONFIG), "w") as f:
    json.dump({**config, **changes}, f)
  return directory


@pytest.mark.parametrize("case, message", [
    ("rank", r"^config\.lora\.rank=8: contradicts .*/qwen2/adapter_config\.json, which gives r \(rank=2\)$"),
    ("targets", r"^config\.lora\.targets='q,k,v': contradicts .*adapter_config\.json, which gives target_modules "),
    ("other base", r"^config\.lora\.init_adapter='.*qwen3': .*/adapter_model\.safetensors: tensor "
                   r"'base_model\.model\.model\.layers\.0\.self_attn\.k_proj\.lora_B\.weight' has shape \[64, 4\]; "
                   r"the model's k adapter with rank 4 is \[32, 4\] \(a base with other shapes\?\)$"),
    ("missing", r"^config\.lora\.init_adapter='/nonexistent': /nonexistent: no adapter_config\.json "),
    ("dora", r"^config\.lora\.init_adapter='.*': .*adapter_config\.json: use_dora=True: a PEFT option jaxpt's LoRA "),
    ("gate alone", r"adapter_config\.json: target_modules has gate_proj without up_proj \(jaxpt's mlp_in adapts "),
    ("unknown module", r"adapter_config\.json: target module 'lm_head' has no LoRA in jaxpt "),
    ("fewer targets", r"adapter_model\.safetensors: tensor 'base_model\.model\.model\.layers\.0\.self_attn\.v_proj"
                      r"\.lora_A\.weight' is no adapter of lora\.targets='q' over 2 layers"),
    ("no init_from", r"^config\.lora\.init_adapter='.*': needs init_from "),
])
def test_bad_adapters_are_one_line_config_errors(case, message, tmp_path):
  qwen2 = os.path.join(PEFT, "qwen2")
  config = {"rank": lambda: sft_config(qwen2, **{"lora.rank": 8}),
            "targets": lambda: sft_config(qwen2, **{"lora.targets": "q,k,v"}),
            "other base": lambda: sft_config(os.path.join(PEFT, "qwen3")),
            "missing": lambda: sft_config("/nonexistent"),
            "dora": lambda: sft_config(edited_adapter(tmp_path, use_dora=True)),
            "gate alone": lambda: sft_config(edited_adapter(tmp_path, target_modules=["q_proj", "gate_proj"])),
            "unknown module": lambda: sft_config(edited_adapter(tmp_path, target_modules=["q_proj", "lm_head"])),
            "fewer targets": lambda: sft_config(edited_adapter(tmp_path, target_modules=["q_proj"])),
            "no init_from": lambda: sft_config(qwen2, init_from="", **{"model.vocab_size": 256})}[case]()
  with pytest.raises(ConfigError, match=message) as raised:
    from_section(SFTRunConfig, config, "config")
  assert "\n" not in str(raised.value)


def test_an_override_at_the_default_that_contradicts_the_adapter_is_an_error(tmp_path):
  """`--config.lora.alpha=16.0` (alpha's default) over PEFT's qwen2 adapter (lora_alpha 6): a config file holds every
  field, so the run config alone would take it for unset and fill 6; the command line's overrides tell it apart
  (`check_adapter_overrides`). Overrides that agree with the file, dropout, or no init_adapter pass."""
  from jaxpt.engine.config import check_adapter_overrides

  config = sft_config(os.path.join(PEFT, "qwen2"))
  with pytest.raises(ConfigError, match=r"^config\.lora\.alpha=16\.0: contradicts .*/qwen2/adapter_config\.json, "
                     r"which gives lora_alpha \(alpha=6\.0\)$"):
    check_adapter_overrides(config, {"lora.alpha": 16.0, "lora.rank": 2})
  with pytest.raises(ConfigError, match=r"^config\.lora\.rslora=False: contradicts "):
    check_adapter_overrides(sft_config(edited_adapter(tmp_path, use_rslora=True)), {"lora.rslora": False})
  check_adapter_overrides(config, {"lora.alpha": 6.0, "lora.rank": 2, "lora.dropout": 0.0, "model.d_model": 64})
  check_adapter_overrides(sft_config(""), {"lora.alpha": 16.0})


def test_the_cli_refuses_an_override_at_the_default_that_contradicts_the_adapter(tmp_path):
  """End to end through `jaxpt sft`: exit 2 and one line naming the field, before any work in the workdir (before,
  the run trained with alpha 6)."""
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  workdir = tmp_path / "run"
  done = subprocess.run([sys.executable, "-m", "jaxpt.cli", "sft", "--config",
                         os.path.join(ROOT, "experiments", "configs", "sft_hf.py"), f"--workdir={workdir}",
                         f"--config.init_from=hf:{os.path.join(ASSETS, 'qwen2')}",
                         f"--config.lora.init_adapter={os.path.join(PEFT, 'qwen2')}", "--config.lora.alpha=16"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
  assert re.fullmatch(r"jaxpt sft: config error: config\.lora\.alpha=16\.0: contradicts .*adapter_config\.json, "
                      r"which gives lora_alpha \(alpha=6\.0\)\n", done.stderr), done.stderr
  assert not workdir.exists()


def test_other_refusals(tmp_path):
  qwen2 = os.path.join(PEFT, "qwen2")
  with pytest.raises(ConfigError, match=r"^adapter='.*': takes an hf:BASE path"):
    jaxpt.load(str(tmp_path), adapter=qwen2)
  siamese = ModelConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=128,
                        norm_scheme="siamese_post_pre")
  with pytest.raises(ConfigError, match=r"^model\.norm_scheme='siamese_post_pre': PEFT adapters need a model "
                     r"transformers has a class for"):
    hf_peft.save_adapters({}, siamese, LoRAConfig(rank=2), str(tmp_path / "x"))
  model = jaxpt.load(f"hf:{os.path.join(ASSETS, 'qwen2')}")
  with pytest.raises(ValueError, match=r"^save_adapters: hf:.* has no LoRA adapters"):
    model.save_adapters(str(tmp_path / "x"))
  assert not os.path.exists(tmp_path / "x")


def test_load_names_a_tensor_of_another_shape(tmp_path):
  """jaxpt.load(..., adapter=) checks the file's shapes before it reads any array."""
  directory = str(tmp_path / "qwen2")
  shutil.copytree(os.path.join(PEFT, "qwen2"), directory)
  tensors = load_file(os.path.join(directory, hf_peft.ADAPTER_WEIGHTS))
  name = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
  save_file({**tensors, name: tensors[name][:32]}, os.path.join(directory, hf_peft.ADAPTER_WEIGHTS))
  with pytest.raises(ConfigError, match=r"^adapter='.*': .*adapter_model\.safetensors: tensor 'base_model\.model\."
                     r"model\.layers\.1\.self_attn\.q_proj\.lora_B\.weight' has shape \[32, 2\]; the model's q "
                     r"adapter with rank 2 is \[64, 2\]"):
    jaxpt.load(f"hf:{os.path.join(ASSETS, 'qwen2')}", adapter=directory)


def test_a_qlora_run_from_peft_adapters_starts_with_them_over_the_quantized_base(lora_run, tmp_path):
  """lora.init_adapter with lora.base_quant=int8: the adapters are PEFT's, the base kernels are the codes of the
  checkpoint's (quantized once, after the adapters were put in)."""
  _, _, _, base = lora_run
  config = experiment_config("sft_hf", base, **{**SFT, "steps": 1, "lora.init_adapter": os.path.join(PEFT, "qwen2"),
                                                "lora.base_quant": "int8", "lora.base_quant_block": 16})
  built = jaxpt.build("sft", config, str(tmp_path / "qlora"))
  initial = jax.device_get(built.training.init_state().params)
  _, tensors, _ = golden("qwen2")
  value = initial["decoder"]["layers"]["attn"]["value"]
  stem = "base_model.model.model.layers.0.self_attn.v_proj"
  np.testing.assert_array_equal(value["lora_a"][0], tensors[f"{stem}.lora_A.weight"].T)
  np.testing.assert_array_equal(value["lora_b"][0].reshape(2, -1), tensors[f"{stem}.lora_B.weight"].T)
  float_base = hf.load_params(base, built.config.model)["decoder"]["layers"]["attn"]["value"]["kernel"]
  quant = built.config.lora.quant
  codes, scales = jax.device_get(quant_lib.quantize(jnp.asarray(float_base), quant, axis=1))
  np.testing.assert_array_equal(value["kernel_q"], codes)
  np.testing.assert_array_equal(value["kernel_scale"], scales)


def test_an_adapter_export_notes_a_base_that_is_no_checkpoint_and_a_quantized_base(lora_run):
  import dataclasses

  from jaxpt.api import adapter_caveats

  run = jaxpt.load(lora_run[0], dtype="float32")
  assert adapter_caveats(run) == []  # started from hf:, float base
  other = dataclasses.replace(run, base_model=None, lora=dataclasses.replace(run.lora, base_quant="nf4"))
  notes = adapter_caveats(other)
  assert len(notes) == 2 and "base_model_name_or_path is null" in notes[0] and "nf4-quantized" in notes[1], notes
