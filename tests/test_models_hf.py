"""Hugging Face checkpoint import (`jaxpt.models.hf`) against `transformers`' own outputs, without torch.

The fixtures under tests/assets/hf/<family>/ were written by tools/make_hf_fixtures.py (torch + transformers, in a
separate venv): tiny random Llama (Llama-3 RoPE scaling, untied), Mistral (sharded, sliding window), Qwen2 (q/k/v
biases, tied) and Qwen3 (q/k norm, head_dim 32 != 64 / 4, norm eps 0.02) models, with transformers' fp32 logits of
fixed input ids [2, 12] and its greedy continuations (8 tokens).
"""

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxpt.config import ConfigError, DataError
from jaxpt.models import hf
from jaxpt.models.transformer import TransformerLM, unstack_layers
from jaxpt.rl.sampler import SamplingConfig, make_sampler
from tests import reference_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "tests", "assets", "hf")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def tolerance(reference_logits) -> float:
  """max abs logit error allowed: 1e-4 relative to the logit scale."""
  return 1e-4 * max(1.0, float(np.abs(reference_logits).max()))


class Loaded:
  """One family's fixture loaded once: config, params, reference arrays, a jitted forward."""

  def __init__(self, family: str):
    self.path = os.path.join(ASSETS, family)
    self.config, self.params = hf.load(self.path)
    with np.load(os.path.join(self.path, "reference.npz")) as ref:
      self.ref = dict(ref)
    self.forward = jax.jit(lambda params, ids, config=self.config: TransformerLM(config).apply(
        {"params": params}, ids))

  def logits_error(self) -> float:
    return float(np.abs(np.asarray(self.forward(self.params, self.ref["input_ids"])) - self.ref["logits"]).max())

  def reference_error(self, **changes) -> float:
    """Max abs error of the float64 NumPy reference equations (tests/reference_model.py) with `changes`."""
    config = dataclasses.replace(self.config, **changes)
    params = unstack_layers(self.params, config.num_layers)
    logits, _ = reference_model.forward(params, self.ref["input_ids"], config)
    return float(np.abs(logits - self.ref["logits"]).max())


@pytest.fixture(scope="module")
def loaded():
  cache = {}
  return lambda family: cache.setdefault(family, Loaded(family))


def test_config_json_maps_to_model_config():
  llama, mistral, qwen2, qwen3 = (hf.read_config(os.path.join(ASSETS, f)) for f in FAMILIES)
  common = dict(vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=128,
                norm_scheme="pre", norm_type="rmsnorm", mlp_type="swiglu", param_dtype="float32", dtype="float32")
  for config in (llama, mistral, qwen2, qwen3):
    assert {k: getattr(config, k) for k in common} == common
  assert (llama.rope_scaling, llama.rope_scaling_factor, llama.rope_low_freq_factor, llama.rope_high_freq_factor,
          llama.rope_original_max_len, llama.rope_theta) == ("llama3", 8.0, 1.0, 4.0, 64, 500000.0)
  assert (llama.tie_embeddings, llama.norm_eps, llama.head_dim, llama.qkv_bias, llama.max_seq_len) == (
      False, 1e-5, 16, False, 128)
  assert (mistral.tie_embeddings, mistral.max_seq_len, mistral.rope_scaling) == (False, 64, "none")  # window 64
  assert (qwen2.qkv_bias, qwen2.attn_out_bias, qwen2.tie_embeddings, qwen2.rope_theta) == (True, False, True, 1e6)
  assert (qwen3.qk_norm, qwen3.head_dim, qwen3.norm_eps, qwen3.tie_embeddings) == (True, 32, 0.02, True)
  assert hf.read_config(os.path.join(ASSETS, "qwen2"), scan_layers=False, dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, loaded):
  model = loaded(family)
  error = model.logits_error()
  print(f"{family}: max abs logit error {error:.2e} (max |logit| {np.abs(model.ref['logits']).max():.1f})")
  assert error <= tolerance(model.ref["logits"])


def test_parity_sees_the_rope_scaling_and_the_norm_eps(loaded):
  """The tolerance is tight enough to catch a Llama-3 scaling or an RMSNorm eps left out (checked on the NumPy
  reference equations, which match transformers too)."""
  llama, qwen3 = loaded("llama"), loaded("qwen3")
  assert llama.reference_error() <= tolerance(llama.ref["logits"])
  assert llama.reference_error(rope_scaling="none") > tolerance(llama.ref["logits"])
  assert qwen3.reference_error() <= tolerance(qwen3.ref["logits"])
  assert qwen3.reference_error(norm_eps=1e-6) > tolerance(qwen3.ref["logits"])


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_matches_transformers(family, loaded):
  model = loaded(family)
  ids = model.ref["input_ids"]
  sample = make_sampler(model.config, SamplingConfig(max_new_tokens=8, greedy=True), prompt_len=ids.shape[1])
  out = sample(model.params, jnp.asarray(ids), jnp.ones_like(ids), jax.random.PRNGKey(0))
  np.testing.assert_array_equal(out.tokens, model.ref["greedy"])


def test_sharded_index_checkpoint_reads_both_shards(loaded):
  path = os.path.join(ASSETS, "mistral")
  with hf.Checkpoint(path) as checkpoint:
    assert sorted(map(os.path.basename, set(checkpoint.files.values()))) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
  params = loaded("mistral").params
  assert params["head"]["kernel"].shape == (64, 256)  # lm_head.weight lives in the second shard


def copy_fixture(tmp_path, family="llama"):
  target = tmp_path / family
  shutil.copytree(os.path.join(ASSETS, family), target)
  return target


def edit_json(path, **changes):
  with open(path) as f:
    value = json.load(f)
  value.update(changes)
  for key in [k for k, v in changes.items() if v is ...]:
    del value[key]
  with open(path, "w") as f:
    json.dump(value, f)


def read_tensors(path):
  from safetensors import safe_open
  with safe_open(str(path), framework="numpy") as f:
    return {name: f.get_tensor(name) for name in f.keys()}


def test_bf16_checkpoint_loads_as_bf16_or_cast_to_param_dtype(tmp_path):
  path = copy_fixture(tmp_path)
  tensors = read_tensors(path / "model.safetensors")
  save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}, str(path / "model.safetensors"))
  edit_json(path / "config.json", dtype="bfloat16")
  config, params = hf.load(str(path))
  assert (config.param_dtype, config.dtype) == ("bfloat16", "bfloat16")
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  gate = tensors["model.layers.1.mlp.gate_proj.weight"].astype(ml_dtypes.bfloat16).T
  np.testing.assert_array_equal(params["decoder"]["layers"]["mlp"]["wi_gate"]["kernel"][1], gate)
  config32, params32 = hf.load(str(path), param_dtype="float32", scan_layers=False)
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params32)} == {jnp.dtype(jnp.float32)}
  np.testing.assert_array_equal(params32["decoder"]["layers_1"]["mlp"]["wi_gate"]["kernel"], gate.astype(np.float32))


def break_missing_tensor(path):
  tensors = read_tensors(path / "model.safetensors")
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(path / "model.safetensors"))


def break_truncated(path):
  data = (path / "model.safetensors").read_bytes()
  (path / "model.safetensors").write_bytes(data[:len(data) // 2])


BAD_INPUTS = {  # case -> (how to break a copy of the llama fixture, the one-line error expected)
    "not_a_directory": (lambda p: shutil.rmtree(p), r"llama: not a Hugging Face checkpoint directory"),
    "no_config": (lambda p: os.remove(p / "config.json"),
                  r"llama: not a Hugging Face checkpoint directory \(no config.json\)"),
    "no_weights": (lambda p: os.remove(p / "model.safetensors"),
                   r"llama: not a Hugging Face checkpoint directory \(no model.safetensors or "),
    "bad_json": (lambda p: (p / "config.json").write_text("{"), r"config.json: not valid JSON"),
    "unknown_model_type": (lambda p: edit_json(p / "config.json", model_type="gpt2"),
                           r"config.json: model_type='gpt2': unsupported \(supported: llama, mistral, qwen2, qwen3\)"),
    "unknown_architecture": (lambda p: edit_json(p / "config.json", architectures=["LlamaForTokenClassification"]),
                             r"config.json: architectures=\['LlamaForTokenClassification'\]: unsupported"),
    "missing_field": (lambda p: edit_json(p / "config.json", hidden_size=...),
                      r"config.json: missing field 'hidden_size'"),
    "unsupported_rope": (lambda p: edit_json(p / "config.json", rope_scaling={"rope_type": "yarn", "factor": 2.0}),
                         r"config.json: rope_scaling.rope_type='yarn': unsupported"),
    "unsupported_activation": (lambda p: edit_json(p / "config.json", hidden_act="gelu"),
                               r"config.json: hidden_act='gelu': unsupported"),
    "missing_tensor": (break_missing_tensor, r"model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight'"),
    "shape_mismatch": (lambda p: edit_json(p / "config.json", intermediate_size=96),
                       r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[128, 64\], "
                       r"config.json implies \[96, 64\]"),
    "truncated": (break_truncated, r"model.safetensors: truncated or not a safetensors file"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_checkpoints_fail_in_one_line_naming_file_and_field(case, tmp_path):
  path = copy_fixture(tmp_path)
  breaker, message = BAD_INPUTS[case]
  breaker(path)
  with pytest.raises(DataError, match=message) as error:
    hf.load(str(path))
  assert "\n" not in str(error.value)


def test_missing_shard_and_contradicting_override_are_named(tmp_path):
  path = copy_fixture(tmp_path, "mistral")
  os.remove(path / "model-00002-of-00002.safetensors")
  with pytest.raises(DataError, match=r"model.safetensors.index.json: weight_map names "
                     r"model-00002-of-00002.safetensors, which is missing"):
    hf.load(str(path))
  with pytest.raises(ConfigError, match=r"model.d_model=32: contradicts .*config.json, which gives 64"):
    hf.read_config(os.path.join(ASSETS, "llama"), d_model=32)
  with pytest.raises(ConfigError, match=r"model.d_modle: unknown field"):
    hf.read_config(os.path.join(ASSETS, "llama"), d_modle=64)
  with pytest.raises(ConfigError, match=r"model.dtype='float16': must be one of"):
    hf.read_config(os.path.join(ASSETS, "llama"), dtype="float16")
  with pytest.raises(DataError, match=r"config.json: num_kv_heads=3: must divide model.num_heads=4"):
    edit_json(copy_fixture(tmp_path, "qwen2") / "config.json", num_key_value_heads=3)
    hf.read_config(str(tmp_path / "qwen2"))
  with pytest.raises(ConfigError, match=r"model.norm_scheme='siamese_post_pre': Hugging Face checkpoints load into "):
    hf.load_params(os.path.join(ASSETS, "llama"), dataclasses.replace(
        hf.read_config(os.path.join(ASSETS, "llama")), norm_scheme="siamese_post_pre"))


def test_llama_attention_bias_means_q_k_v_and_output_biases(tmp_path):
  path = copy_fixture(tmp_path)
  edit_json(path / "config.json", attention_bias=True)
  config = hf.read_config(str(path))
  assert (config.qkv_bias, config.attn_out_bias) == (True, True)
  with pytest.raises(DataError, match=r"model.safetensors: missing tensor 'model.layers.0.self_attn.[qkvo]_proj.bias'"):
    hf.load_params(str(path), config)


def test_loads_into_fsdp_tp_sharding_on_8_devices(tmp_path):
  """tests/multidevice/hf_sharded_load.py in its own process (XLA fixes the host device count at start-up)."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  env.pop("PYTEST_XDIST_WORKER", None)
  suite = os.path.join("tests", "multidevice", "hf_sharded_load.py")
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                         "--basetemp", str(tmp_path / "basetemp"), suite], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert re.search(r"\b[1-9]\d* passed", summary) and "skipped" not in summary, summary


def reference_python() -> str | None:
  """An interpreter with torch and transformers: this one, or $JAXPT_HF_REFERENCE_PYTHON (a venv's python)."""
  if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
    return sys.executable
  return os.environ.get("JAXPT_HF_REFERENCE_PYTHON") or None


@pytest.mark.slow
@pytest.mark.skipif(reference_python() is None, reason="torch + transformers not importable here and "
                    "JAXPT_HF_REFERENCE_PYTHON unset (tools/make_hf_fixtures.py needs them)")
def test_regenerated_fixtures_match_the_committed_ones_and_jaxpt(tmp_path):
  """Reruns the generator live: same weights and greedy tokens as committed, logits within float noise, and
  jaxpt loads the fresh checkpoint to the fresh reference logits."""
  proc = subprocess.run([reference_python(), os.path.join(ROOT, "tools", "make_hf_fixtures.py"), "--out",
                         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for family in FAMILIES:
    fresh, committed = tmp_path / family, os.path.join(ASSETS, family)
    assert sorted(os.listdir(fresh)) == sorted(os.listdir(committed))
    for name in os.listdir(fresh):
      if name.endswith(".safetensors"):
        new, old = read_tensors(fresh / name), read_tensors(os.path.join(committed, name))
        assert new.keys() == old.keys()
        for key in new:
          np.testing.assert_array_equal(new[key], old[key], err_msg=f"{family}/{name}:{key}")
    with np.load(fresh / "reference.npz") as new, np.load(os.path.join(committed, "reference.npz")) as old:
      np.testing.assert_array_equal(new["input_ids"], old["input_ids"])
      np.testing.assert_array_equal(new["greedy"], old["greedy"])
      np.testing.assert_allclose(new["logits"], old["logits"], atol=tolerance(old["logits"]), rtol=0)
      config, params = hf.load(str(fresh))
      logits = TransformerLM(config).apply({"params": params}, new["input_ids"])
      assert float(np.abs(np.asarray(logits) - new["logits"]).max()) <= tolerance(new["logits"])
