"""Hugging Face export (`jaxpt.models.hf_export`): the inverse of the import, tensor for tensor.

An imported fixture (tests/assets/hf, written by transformers) exported again must give back transformers' own
tensors byte for byte and the same config; models transformers has no class for (SiameseNorm, Post-Norm,
HybridNorm) go to a jaxpt-native directory and come back with identical params and logits, whether the layers were
scanned or not. The live check that `transformers` itself loads an export to the same logits is the `slow` test.
"""

import dataclasses
import errno
import json
import os
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import jaxpt
from jaxpt.config import ConfigError
from jaxpt.models import hf, hf_config, hf_export
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from tools.file_tree import snapshot
from tests.test_models_hf import ASSETS, FAMILIES, ROOT, reference_python, tolerance

IDS = np.array([[3, 17, 42, 9, 250, 1, 77, 5], [8, 8, 100, 2, 31, 64, 0, 12]], np.int32)


def read_tensors(directory: str) -> dict[str, np.ndarray]:
  """Every tensor of a checkpoint directory (single file or sharded), by name."""
  out = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      with safe_open(os.path.join(directory, name), framework="numpy") as f:
        out.update({key: f.get_tensor(key) for key in f.keys()})
  return out


def logits(config: ModelConfig, params, ids=IDS) -> np.ndarray:
  return np.asarray(TransformerLM(config).apply({"params": params}, ids))


def random_model(**fields) -> tuple[ModelConfig, dict]:
  config = ModelConfig(vocab_size=256, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64,
                       max_seq_len=64, **fields)
  params = nn.meta.unbox(TransformerLM(config).init(jax.random.PRNGKey(1), jnp.zeros((1, 4), jnp.int32))["params"])
  return config, jax.tree.map(lambda x: x + 0.01 * jnp.ones_like(x), params)  # norm scales != 1: a swap shows


@pytest.mark.parametrize("family", FAMILIES)
def test_export_of_an_import_gives_back_transformers_tensors_byte_for_byte(family, tmp_path):
  source = os.path.join(ASSETS, family)
  config, params = hf.load(source)
  assert hf_export.save_hf(params, config, str(tmp_path / "out")) == "transformers"
  exported, original = read_tensors(str(tmp_path / "out")), read_tensors(source)
  assert exported.keys() == original.keys()
  for name, tensor in original.items():
    assert exported[name].dtype == tensor.dtype and exported[name].shape == tensor.shape, name
    np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
  assert hf.read_config(str(tmp_path / "out")) == config
  written = hf_config.read_hf_json(str(tmp_path / "out"))
  expected_type = {"mistral": "llama"}.get(family, family)  # a window >= max_seq_len is plain causal attention
  assert written["model_type"] == expected_type and written["architectures"] == [hf_config.FAMILIES[expected_type][0]]


@pytest.mark.parametrize("family", FAMILIES)
def test_an_export_keeps_the_special_ids_of_the_checkpoint_it_came_from(family, tmp_path):
  """config.json's bos/eos/pad_token_id come back as the source had them. No fixture has a pad_token_id; the export
  used to claim the EOS id (Llama, Mistral: their tokenizers have no pad token, so pad_id falls back to EOS) or the
  tokenizer's pad token (Qwen), and to drop Qwen's bos_token_id."""
  source = os.path.join(ASSETS, family)
  jaxpt.load(f"hf:{source}").save_hf(str(tmp_path / "out"))
  written, original = hf_config.read_hf_json(str(tmp_path / "out")), hf_config.read_hf_json(source)
  assert {k: written.get(k) for k in hf_config.SPECIAL_IDS} == {k: original.get(k) for k in hf_config.SPECIAL_IDS}
  assert "pad_token_id" not in written and original["pad_token_id"] is None


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_an_export_without_its_source_config_claims_only_the_tokenizers_pad_token(family, tmp_path):
  """A run fine-tuned from a checkpoint keeps its tokenizer, not its config.json: pad_token_id is the tokenizer's
  pad token (Qwen's <|endoftext|>), and none where it has none (Llama), not the EOS id batches are padded with."""
  model = dataclasses.replace(jaxpt.load(f"hf:{os.path.join(ASSETS, family)}"), special_ids=None)
  model.save_hf(str(tmp_path / "out"))
  written = hf_config.read_hf_json(str(tmp_path / "out"))
  assert written["eos_token_id"] == model.tokenizer.eos_id
  assert written.get("pad_token_id") == model.tokenizer.configured_pad_id == {"llama": None, "qwen2": 0}[family]


def test_sharded_export_writes_an_index_that_the_import_reads(tmp_path):
  config, params = hf.load(os.path.join(ASSETS, "llama"))
  hf_export.save_hf(params, config, str(tmp_path), max_shard_bytes=100_000)
  with open(tmp_path / hf.INDEX_FILE) as f:
    index = json.load(f)
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors")) == files
  assert index["metadata"]["total_size"] == sum(t.nbytes for t in read_tensors(str(tmp_path)).values())
  _, again = hf.load(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, again, params)


@pytest.mark.parametrize("fields,family", [
    (dict(), "llama"), (dict(qkv_bias=True), "qwen2"), (dict(qk_norm=True), "qwen3"),
    (dict(qkv_bias=True, attn_out_bias=True), "llama"),
    (dict(qk_norm=True, qkv_bias=True, attn_out_bias=True), "qwen3"),
    (dict(qk_norm=True, qkv_bias=True), None), (dict(attn_out_bias=True), None), (dict(norm_scheme="post"), None),
    (dict(norm_scheme="siamese_post_pre"), None), (dict(mlp_type="gelu"), None), (dict(norm_type="layernorm"), None),
    (dict(norm_scheme="mhc"), None), (dict(num_experts=4), None),
])
def test_transformers_family_follows_the_attention_options(fields, family):
  assert hf_export.transformers_family(ModelConfig(**fields))[0] == family


@pytest.mark.parametrize("fields", [dict(qkv_bias=True), dict(qk_norm=True, qkv_bias=True, attn_out_bias=True),
                                    dict(rope_scaling="llama3", rope_original_max_len=32, tie_embeddings=False)])
def test_transformers_export_of_a_jaxpt_model_round_trips(fields, tmp_path):
  config, params = random_model(**fields)
  assert hf_export.save_hf(params, config, str(tmp_path)) == "transformers"
  again_config, again = hf.load(str(tmp_path))
  assert again_config == dataclasses.replace(config, head_dim=config.resolved_head_dim)  # config.json names it
  jax.tree.map(np.testing.assert_array_equal, again, params)


@pytest.mark.parametrize("scheme,scan", [("siamese_post_pre", True), ("siamese_hybrid_pre", False), ("post", True),
                                         ("hybrid", False), ("mhc_lite", True)])
def test_native_export_round_trips_any_scheme_in_either_layer_layout(scheme, scan, tmp_path):
  config, params = random_model(norm_scheme=scheme, scan_layers=scan, mlp_type="gelu", norm_type="layernorm")
  assert hf_export.save_hf(params, config, str(tmp_path)) == "jaxpt"
  assert hf_config.read_hf_json(str(tmp_path))["model_type"] == hf_config.NATIVE_TYPE
  assert "decoder.layers.1.attn.query.kernel" in read_tensors(str(tmp_path))  # one tensor per layer either way
  again_config, again = hf.load(str(tmp_path), scan_layers=scan)
  assert again_config == config
  jax.tree.map(np.testing.assert_array_equal, again, params)
  other_config, other = hf.load(str(tmp_path), scan_layers=not scan)  # the other layout reads the same tensors
  np.testing.assert_allclose(logits(other_config, other), logits(config, params), rtol=1e-5, atol=1e-5)


def test_bf16_params_export_as_bf16(tmp_path):
  config, params = random_model(param_dtype="bfloat16", dtype="bfloat16")
  hf_export.save_hf(params, config, str(tmp_path))
  tensors = read_tensors(str(tmp_path))
  assert {t.dtype for t in tensors.values()} == {np.dtype(ml_dtypes.bfloat16)}
  assert hf_config.read_hf_json(str(tmp_path))["dtype"] == "bfloat16"
  again_config, again = hf.load(str(tmp_path))
  assert again_config.param_dtype == "bfloat16"
  jax.tree.map(np.testing.assert_array_equal, again, params)


def test_format_transformers_names_the_field_no_class_has(tmp_path):
  config, params = random_model(norm_scheme="siamese_post_pre")
  with pytest.raises(ConfigError, match=r"^model\.norm_scheme='siamese_post_pre': no transformers class "
                     r"\(transformers' decoder models have norm_scheme='pre'\); use format='jaxpt'$"):
    hf_export.save_hf(params, config, str(tmp_path), format="transformers")
  assert not os.path.exists(tmp_path / hf_config.CONFIG_FILE)


def test_never_writes_over_a_checkpoint_or_leaves_half_a_directory(tmp_path, monkeypatch):
  config, params = random_model()
  out = tmp_path / "out"
  hf_export.save_hf(params, config, str(out))
  before = read_tensors(str(out))
  with pytest.raises(FileExistsError, match="exists and is not empty"):
    hf_export.save_hf(params, config, str(out))
  (tmp_path / "file").write_text("x")
  with pytest.raises(FileExistsError, match="is a file"):
    hf_export.save_hf(params, config, str(tmp_path / "file"))
  calls = []

  def failing(block, source):  # the export dies while writing its third tensor
    calls.append(source.name)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return block

  monkeypatch.setattr(hf_export, "to_hf_layout", failing)
  with pytest.raises(KeyboardInterrupt):
    hf_export.save_hf(params, config, str(out), overwrite=True)
  calls.clear()
  with pytest.raises(KeyboardInterrupt):
    hf_export.save_hf(params, config, str(tmp_path / "new"))
  assert sorted(os.listdir(tmp_path)) == ["file", "out"]  # no partial directories, no `new`
  after = read_tensors(str(out))
  assert after.keys() == before.keys() and all((after[k] == before[k]).all() for k in before)


def test_native_config_names_an_unknown_field(tmp_path):
  config, params = random_model(norm_scheme="post")
  hf_export.save_hf(params, config, str(tmp_path))
  written = hf_config.read_hf_json(str(tmp_path))
  written["jaxpt_model"]["n_experts"] = 8
  (tmp_path / hf_config.CONFIG_FILE).write_text(json.dumps(written))
  with pytest.raises(Exception, match=r"config\.json: jaxpt_model\.n_experts: not a ModelConfig field"):
    hf.read_config(str(tmp_path))
  written["jaxpt_model"].pop("n_experts")
  (tmp_path / hf_config.CONFIG_FILE).write_text(json.dumps(written))
  with pytest.raises(ConfigError, match=r"model\.d_model.*contradicts"):
    hf.read_config(str(tmp_path), d_model=64)
  assert hf.read_config(str(tmp_path), max_seq_len=32, remat="full") == dataclasses.replace(
      config, max_seq_len=32, remat="full")


@pytest.mark.slow
@pytest.mark.skipif(reference_python() is None, reason="torch + transformers not importable here and "
                    "JAXPT_HF_REFERENCE_PYTHON unset")
def test_transformers_loads_every_export_to_the_same_logits(tmp_path):
  """Import -> export -> `transformers.AutoModelForCausalLM.from_pretrained` -> the logits jaxpt computes, for
  every fixture family and for jaxpt-made models with each attention option (tools/check_hf_export.py)."""
  cases = {family: hf.load(os.path.join(ASSETS, family)) for family in FAMILIES}
  cases.update({name: random_model(**fields) for name, fields in (
      ("jaxpt_qwen2", dict(qkv_bias=True)), ("jaxpt_qwen3_bias", dict(qk_norm=True, qkv_bias=True,
                                                                       attn_out_bias=True)),
      ("jaxpt_llama3_untied", dict(rope_scaling="llama3", rope_original_max_len=32, tie_embeddings=False)))})
  expected = {}
  for name, (config, params) in cases.items():
    hf_export.save_hf(params, config, str(tmp_path / name))
    expected[name] = logits(config, params)
  np.save(tmp_path / "ids.npy", IDS)
  proc = subprocess.run([reference_python(), os.path.join(ROOT, "tools", "check_hf_export.py"), str(tmp_path),
                         *cases], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for name in cases:
    theirs = np.load(tmp_path / name / "transformers_logits.npy")
    assert float(np.abs(theirs - expected[name]).max()) <= tolerance(expected[name]), name


def test_never_writes_over_a_jaxpt_run_even_with_overwrite(tmp_path):
  config, params = random_model()
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  with pytest.raises(FileExistsError, match="holds a jaxpt run .checkpoints/.; never written over"):
    hf_export.save_hf(params, config, str(tmp_path / "run"), overwrite=True)
  assert os.listdir(tmp_path / "run") == ["checkpoints"]


def _a_checkout(root):
  """A folder a user cares about: a git checkout's shape, hidden files, a nested file, an empty folder."""
  (root / ".git" / "objects").mkdir(parents=True)
  (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
  (root / "precious.txt").write_text("years of work")
  (root / "sub").mkdir()
  (root / "sub" / "x").write_text("x")
  (root / "empty").mkdir()
  return root


def test_overwrite_replaces_only_a_previous_export(tmp_path):
  """Issue 33: `--overwrite` emptied any non-empty directory (a git checkout, `.git` included)."""
  config, params = random_model()
  checkout = _a_checkout(tmp_path / "checkout")
  before = snapshot(str(checkout))
  with pytest.raises(FileExistsError, match=r"checkout: holds files no jaxpt export wrote \(\.git/HEAD, "
                     r"\.git/objects/, empty/ and 2 more\); --overwrite replaces only a previous export"):
    hf_export.save_hf(params, config, str(checkout), overwrite=True)
  assert snapshot(str(checkout)) == before
  assert sorted(os.listdir(tmp_path)) == ["checkout"]  # no work folder left beside it

  out = tmp_path / "out"
  hf_export.save_hf(params, config, str(out))
  assert json.loads((out / hf_export.EXPORT_MARKER).read_text())["files"] == sorted(
      f for f in os.listdir(out) if f != hf_export.EXPORT_MARKER)
  changed = jax.tree.map(lambda p: p + 1, params)
  hf_export.save_hf(changed, config, str(out), overwrite=True)  # a previous export: replaced
  np.testing.assert_array_equal(hf.load(str(out))[1]["embedding"], changed["embedding"])
  assert sorted(os.listdir(tmp_path)) == ["checkout", "out"]

  (out / "notes.md").write_text("mine")  # a previous export that a user added to: refused, untouched
  before = snapshot(str(out))
  with pytest.raises(FileExistsError, match=r"out: holds files no jaxpt export wrote \(notes\.md\)"):
    hf_export.save_hf(params, config, str(out), overwrite=True)
  assert snapshot(str(out)) == before
  (out / "notes.md").unlink()
  (out / hf_export.EXPORT_MARKER).unlink()  # an export without its marker (or from before markers): refused
  with pytest.raises(FileExistsError, match=r"holds files no jaxpt export wrote \(config\.json, model\.safetensors"):
    hf_export.save_hf(params, config, str(out), overwrite=True)


def test_a_file_added_while_the_export_is_written_is_never_lost(tmp_path, monkeypatch):
  """--overwrite checks `out` at the start and again once the old export is moved aside: a file a user put there
  in between is refused, and the old export comes back with it."""
  config, params = random_model()
  out = tmp_path / "out"
  hf_export.save_hf(params, config, str(out))
  write_marker = hf_export._write_marker

  def marker_then_a_user_file(directory, format):
    write_marker(directory, format)
    (out / "late.txt").write_text("mine")

  monkeypatch.setattr(hf_export, "_write_marker", marker_then_a_user_file)
  before = snapshot(str(out))
  with pytest.raises(FileExistsError, match=r"out: holds files no jaxpt export wrote \(late\.txt\)"):
    hf_export.save_hf(jax.tree.map(lambda p: p + 1, params), config, str(out), overwrite=True)
  after = snapshot(str(out))
  assert (out / "late.txt").read_text() == "mine" and {k: v for k, v in after.items() if k != "late.txt"} == before
  assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_full_disk_is_an_oserror_naming_the_file_and_leaves_nothing(small_disk):
  """safetensors reports a full disk as its own SafetensorError (a traceback from `jaxpt export-hf`); it leaves as
  OSError(ENOSPC, ..., the shard's path), which the CLI prints as one line, and the work folder is removed."""
  config, params = random_model()
  disk = small_disk("20k")
  with pytest.raises(OSError, match=r"No space left on device: .*/new/part-0\.safetensors") as raised:
    hf_export.save_hf(params, config, str(disk / "out"))
  assert raised.value.errno == errno.ENOSPC and os.listdir(disk) == []
