"""QLoRA (`lora.base_quant`): blockwise int8 / NF4 quantization (`jaxpt.nn.quant`) against float64 NumPy statements
with their per-block error bounds, the quantized `Dense` and its adapter gradients against NumPy, B = 0 giving the
dequantized base's logits, a tiny SFT run (only adapters change, loss falls, bitwise resume), the plan's params
bytes against the real quantized tree, the one-line refusals, an hf: start quantized as it streams in, and GRPO's
rollouts on the codes against the merged ones (the sampler itself: tests/test_qlora_sampler.py)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpt
from experiments.configs import dpo_tiny, grpo_tiny, rm_tiny, sft_lora_tiny
from jaxpt.config import ConfigError, from_section
from jaxpt.engine.metrics import read_metrics
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.dense import Dense
from jaxpt.nn.quant import NF4, Quant, dequantize, quantize
from jaxpt.trainers import plan
from jaxpt.trainers.sft import SFTRunConfig
from tests.micro_grpo import OVERRIDES as GRPO_MICRO
from tests.test_train_lora import LORA, PAIRS, SFT, assert_bitwise, changed_leaves, config_of, is_adapter, run_twice

NF4_HALF_GAP = float(np.max(np.diff(NF4.astype(np.float64)))) / 2


def numpy_quantize(w, scheme, block):
  """float64 statement of `jaxpt.nn.quant` for w [m, k, n] blocked along k: (values in [-127, 127] or NF4 indices,
  per-block scales [m, k / B, n])."""
  m, k, n = w.shape
  blocks = w.astype(np.float64).reshape(m, k // block, block, n)
  absmax = np.abs(blocks).max(axis=2, keepdims=True)
  if scheme == "int8":
    scale = absmax / 127.0
    return np.round(blocks / np.where(scale > 0, scale, 1.0)).reshape(m, k, n), scale[:, :, 0]
  normed = blocks / np.where(absmax > 0, absmax, 1.0)
  index = np.abs(normed[..., None] - NF4.astype(np.float64)).argmin(-1)  # the nearest NF4 value
  return index.reshape(m, k, n), absmax[:, :, 0]


def numpy_decode(codes, scales, scheme, block):
  """float64 W~ from stored codes (int8, or uint8 with two NF4 indices a byte: low nibble = even row)."""
  codes = np.asarray(codes)
  if scheme == "int8":
    values = codes.astype(np.float64)
  else:
    m, rows, n = codes.shape
    index = np.empty((m, 2 * rows, n), np.int64)
    index[:, 0::2], index[:, 1::2] = codes & 15, codes >> 4
    values = NF4.astype(np.float64)[index]
  m, k, n = values.shape
  return (values.reshape(m, k // block, block, n) * np.asarray(scales, np.float64)[:, :, None, :]).reshape(m, k, n)


@pytest.mark.parametrize("scheme", ["int8", "nf4"])
def test_quantize_dequantize_match_numpy_within_the_block_bounds(scheme):
  block = 16
  w = np.array(jax.random.normal(jax.random.PRNGKey(0), (2, 64, 6)) * 0.3, np.float32)
  w[0, :block, 0] = 0.0  # a block of zeros: scale 0, decodes to 0
  codes, scales = quantize(jnp.asarray(w), Quant(scheme, block), axis=1)
  assert codes.dtype == (np.int8 if scheme == "int8" else np.uint8)
  assert codes.shape == (2, 64 // (2 if scheme == "nf4" else 1), 6) and scales.shape == (2, 4, 6)
  want_values, want_scales = numpy_quantize(w, scheme, block)
  np.testing.assert_allclose(scales, want_scales, rtol=1e-6)
  got = numpy_decode(codes, scales, scheme, block)
  index = got / np.repeat(np.where(want_scales > 0, want_scales, 1.0), block, axis=1)
  if scheme == "int8":
    np.testing.assert_allclose(index, want_values, atol=1e-4)
  else:  # the stored NF4 indices (decoded back from W~ / s) are the float64 nearest ones
    stored = np.abs(index[..., None] - NF4.astype(np.float64)).argmin(-1)
    assert (stored == want_values).mean() == 1.0
  np.testing.assert_allclose(dequantize(codes, scales, Quant(scheme, block)), got, rtol=1e-6, atol=1e-7)
  bound = np.repeat(want_scales / 2 if scheme == "int8" else want_scales * NF4_HALF_GAP, block, axis=1)
  err = np.abs(got - w)
  assert np.all(err <= bound * (1 + 1e-5) + 1e-7), float((err - bound).max())
  assert np.all(got[0, :block, 0] == 0.0)
  assert err.mean() < bound.mean() / 2  # rounding to nearest: well inside the bound on average


@pytest.mark.parametrize("scheme", ["int8", "nf4"])
def test_quantized_dense_and_its_adapter_gradients_match_numpy(scheme):
  """An out-projection-like Dense [heads, head_dim] -> [d] (blocked along head_dim): y = x W~ + s (x A) B, and the
  gradients of sum(y * g) in A, B and x, against float64 NumPy."""
  quant, heads, hd, d, rank, scale = Quant(scheme, 8), 2, 16, 12, 3, 1.5
  dense = Dense((d,), ("heads", "kv", "embed"), num_in_axes=2, lora=lora_lib.LoRA(rank, scale, quant=quant))
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 5, heads, hd))
  params = nn.meta.unbox(dense.init(jax.random.PRNGKey(2), x)["params"])
  params["lora_b"] = jax.random.normal(jax.random.PRNGKey(3), params["lora_b"].shape) * 0.1
  assert params["kernel_q"].shape == (heads, hd // quant.pack, d) and params["kernel_scale"].shape == (heads, 2, d)
  w = numpy_decode(params["kernel_q"].reshape(heads, hd // quant.pack, d),
                   params["kernel_scale"], scheme, 8).reshape(heads * hd, d)
  x2 = np.asarray(x, np.float64).reshape(-1, heads * hd)
  a = np.asarray(params["lora_a"], np.float64).reshape(heads * hd, rank)
  b = np.asarray(params["lora_b"], np.float64)
  g = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (15, d)), np.float64)
  y = x2 @ w + scale * (x2 @ a) @ b
  np.testing.assert_allclose(dense.apply({"params": params}, x).reshape(15, d), y, rtol=1e-4, atol=1e-5)

  def loss(adapters, x):
    out = dense.apply({"params": {**params, **adapters}}, x)
    return jnp.sum(out.reshape(15, d) * g.astype(np.float32))

  grads, dx = jax.grad(loss, argnums=(0, 1))({k: params[k] for k in ("lora_a", "lora_b")}, x)
  np.testing.assert_allclose(grads["lora_b"], scale * (x2 @ a).T @ g, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(grads["lora_a"].reshape(-1, rank), scale * x2.T @ (g @ b.T), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(dx.reshape(15, -1), g @ (w + scale * a @ b).T, rtol=1e-4, atol=1e-5)


MODEL = ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64, max_seq_len=16,
                    remat="none")


@pytest.mark.parametrize("scheme", [pytest.param("int8", marks=pytest.mark.slow), "nf4"])
def test_b_zero_gives_the_dequantized_base_and_only_adapters_get_gradients(scheme):
  spec = lora_lib.LoRA(4, 2.0, quant=Quant(scheme, 16))
  model, tokens = TransformerLM(MODEL, lora=spec), (jnp.arange(16, dtype=jnp.int32)[None] * 5) % 64
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"])
  apply = jax.jit(lambda m, p: m.apply({"params": p}, tokens), static_argnums=0)
  logits = apply(model, params)
  dequantized = jax.jit(lora_lib.dequantize_params, static_argnums=1)(lora_lib.base_params(params), spec.quant)
  base = apply(TransformerLM(MODEL), dequantized)
  np.testing.assert_array_equal(logits, base)  # B = 0: exactly the dequantized base
  reference = apply(model.clone(lora=lora_lib.base_spec(spec)), lora_lib.base_params(params))
  np.testing.assert_array_equal(reference, base)  # the reference reads the codes, no float copy
  requantize = jax.jit(lambda p: lora_lib.quantize_params(lora_lib.dequantize_params(p, spec.quant), spec.quant))
  again = requantize(params)
  # W~ requantizes to itself: the same codes; the scales to the rounding of (127 s) / 127 (int8)
  stored = dict(jax.tree_util.tree_leaves_with_path(params))
  for path, leaf in jax.tree_util.tree_leaves_with_path(again):
    if jax.tree_util.keystr(path).endswith("['kernel_q']"):
      np.testing.assert_array_equal(leaf, stored[path])
    np.testing.assert_allclose(leaf, stored[path], rtol=2e-7, atol=0)
  # merged (W~ + s A B) == the LoRA model once B != 0
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: v + 0.05 if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
  merged = apply(TransformerLM(MODEL), jax.jit(lora_lib.merge_params, static_argnums=(1, 2))(params, spec.scale,
                                                                                               spec.quant))
  np.testing.assert_allclose(apply(model, params), merged, rtol=1e-5, atol=1e-5)
  grads = jax.jit(jax.grad(lambda p: jnp.mean(model.apply({"params": p}, tokens) ** 2), allow_int=True))(params)
  for path, grad in jax.tree_util.tree_leaves_with_path(grads):
    name = jax.tree_util.keystr(path)
    if name.endswith("['kernel_q']"):
      assert grad.dtype == jax.dtypes.float0
    if is_adapter(name):
      assert np.abs(np.asarray(grad)).max() > 0, name


def test_adapter_gradients_are_the_same_under_remat():
  """remat full recomputes the dequantized matmuls in the backward: the adapters' gradients are unchanged."""
  import dataclasses

  spec, tokens = lora_lib.LoRA(4, 2.0, quant=Quant("int8", 16)), (jnp.arange(16, dtype=jnp.int32)[None] * 5) % 64
  grads = {}
  for remat in ("none", "full"):
    model = TransformerLM(dataclasses.replace(MODEL, remat=remat), lora=spec)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"])
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: v + 0.05 if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
    loss = lambda p, model=model: jnp.mean(model.apply({"params": p}, tokens) ** 2)
    grads[remat] = jax.jit(jax.grad(loss, allow_int=True))(params)["decoder"]["layers"]["attn"]["out"]
  for remat in ("full",):
    for name in ("lora_a", "lora_b"):
      np.testing.assert_allclose(grads[remat][name], grads["none"][name], rtol=1e-5, atol=1e-8)
    assert np.abs(np.asarray(grads[remat]["lora_a"])).max() > 0


QLORA = {**SFT, "steps": 8, "log_every": 2, "eval_every": 0, "lora.base_quant": "nf4", "lora.base_quant_block": 16}


@pytest.fixture(scope="module")
def sft_qlora(tmp_path_factory):  # ~50 s on 2 busy cores
  root = tmp_path_factory.mktemp("sft_qlora")
  config = config_of(sft_lora_tiny, QLORA)
  built = jaxpt.build("sft", config, str(root / "whole"))
  initial = jax.device_get(built.training.init_state().params)
  whole = jaxpt.train("sft", config, str(root / "whole"), built=built)
  jaxpt.train("sft", config, str(root / "split"), built=built, stop_at=4)
  resumed = jaxpt.train("sft", config, str(root / "split"), built=built)
  return built, initial, whole, resumed, read_metrics(str(root / "whole")), str(root / "whole")


@pytest.mark.slow
def test_sft_with_qlora_trains_adapters_alone_and_resumes_bitwise(sft_qlora):
  built, initial, whole, resumed, rows, _ = sft_qlora
  assert rows[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
  codes = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(initial)
           if jax.tree_util.keystr(path).endswith("['kernel_q']")]
  assert codes and all(leaf.dtype == np.uint8 for leaf in codes)
  changed = changed_leaves(initial, jax.device_get(whole.state.params))
  assert changed and all(is_adapter(p) for p in changed), changed
  assert_bitwise(resumed.state, whole.state)


def test_plan_params_are_the_real_quantized_tree_bytes():
  """`jaxpt plan`'s params figure (codes + scales + the bf16 rest + adapters) is the bytes of the tree a run
  holds: the model's init with the frozen leaves cast as the builder casts them; `frozen_float` the dequantized
  base's (what GRPO's sampler reads)."""
  from jaxpt.engine.builder import frozen_dtype, lora_trainable

  run = from_section(SFTRunConfig, config_of(sft_lora_tiny, {**QLORA, "lora.base_dtype": "bfloat16"}), "config")
  model = TransformerLM(run.model, lora=run.lora.spec())
  boxed = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  params = frozen_dtype(nn.meta.unbox(boxed), run, lora_trainable(boxed))
  planned = plan.param_bytes(run, plan._mesh_shape(run, 1))
  assert planned["params"] == sum(leaf.nbytes for leaf in jax.tree.leaves(params))
  floats = lora_lib.base_params(lora_lib.dequantize_params(params, run.lora.quant, jnp.bfloat16))
  assert planned["frozen_float"] == sum(leaf.nbytes for leaf in jax.tree.leaves(floats))
  codes = [p for p, leaf in jax.tree_util.tree_leaves_with_path(params) if leaf.dtype == jnp.uint8]
  assert len(codes) == 7 and planned["params"] < planned["full"] / 2


@pytest.mark.parametrize("overrides, field", [
    ({"lora.base_quant": "int8"}, "lora.base_quant"),  # rank 0: a frozen base with nothing to train
    ({"lora.rank": 4, "lora.base_quant": "int4"}, "lora.base_quant"),
    ({"lora.rank": 4, "lora.base_quant": "nf4", "lora.base_quant_block": 7}, "lora.base_quant_block"),
    ({"lora.rank": 4, "lora.base_quant": "nf4", "lora.base_quant_block": 2}, "lora.base_quant_block"),
    ({"lora.rank": 4, "lora.base_quant": "int8", "lora.base_quant_block": 24}, "lora.base_quant_block"),
])
def test_refusals_are_one_line_naming_the_field(overrides, field):
  config = config_of(sft_lora_tiny, {**SFT, "lora.rank": 0, **overrides})
  with pytest.raises(ConfigError) as e:
    from_section(SFTRunConfig, config, "config")
  assert e.value.where.endswith(field) and "\n" not in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_qlora_run_starts_others_and_loads_as_its_merged_dequantized_policy(sft_qlora):
  """`init_from` a QLoRA run and `jaxpt.load` of it read W~ + s A B (codes restored, dequantized, merged)."""
  from jaxpt.engine.init_from import init_params

  built, _, whole, _, _, workdir = sft_qlora
  params = whole.state.params
  merged = jax.device_get(built.training.merged_params(params))
  plain = built.training.model.clone(lora=None)
  template = jax.jit(lambda: nn.meta.unbox(plain.init(jax.random.PRNGKey(1), jnp.zeros((1, 8), jnp.int32))["params"]))()
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(init_params(workdir, built.config.model, template)),
               merged)
  tokens = (np.arange(8, dtype=np.int32)[None] * 7) % 100
  want = jax.jit(built.training.model.apply)({"params": params}, tokens)
  np.testing.assert_allclose(jaxpt.load(workdir).logits(tokens), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_qlora_run_started_from_a_qlora_run_holds_its_merged_policy_quantized(sft_qlora, tmp_path):
  """`Training.init_state` of a QLoRA SFT run with `init_from` the QLoRA run (restored one projection at a time,
  merged, quantized again: `init_from.run_params(each=...)`) holds what quantizing its whole merged policy gives."""
  from jaxpt.engine.init_from import init_params

  _, _, _, _, _, workdir = sft_qlora
  built = jaxpt.build("sft", config_of(sft_lora_tiny, {**QLORA, "init_from": workdir}), str(tmp_path))
  params = jax.device_get(built.training.init_state().params)
  plain = TransformerLM(built.config.model)
  template = jax.jit(lambda: nn.meta.unbox(plain.init(jax.random.PRNGKey(1), jnp.zeros((1, 8), jnp.int32))["params"]))()
  loaded = init_params(workdir, built.config.model, template)
  quant = built.config.lora.quant
  want = lora_lib.quantize_params(lora_lib.with_adapters(loaded, lora_lib.dequantize_params(params, quant)), quant)
  jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(want))


@pytest.mark.slow
def test_an_hf_start_is_quantized_once_from_the_checkpoint(tmp_path):
  """`init_from=hf:DIR` with QLoRA: the run starts from the checkpoint's kernels quantized (what `quantize_params`
  makes of them), its other params as loaded, and B = 0 adapters."""
  from experiments.configs import sft_hf
  from jaxpt.engine.init_from import init_params

  config = sft_hf.get_config()
  config.update_from_flattened_dict({
      "init_from": "hf:tests/assets/hf/qwen2", "steps": 1, "progress": False, "task.name": "arithmetic",
      "task.path": "", "task.train_size": 32, "task.test_size": 8, "task.prompt_format": "plain",
      "model.max_seq_len": 128, "data.seq_len": 128, "data.batch_size": 8, "data.eval_batches": 1,
      "decode.prompt_len": 112, "decode.max_new_tokens": 8, "decode.eval_problems": 8, "decode.batch_size": 8,
      "lora.rank": 4, "lora.base_quant": "int8", "lora.base_quant_block": 16})
  built = jaxpt.build("sft", config, str(tmp_path))
  params = jax.device_get(built.training.init_state().params)
  plain = TransformerLM(built.config.model)
  template = jax.jit(lambda: nn.meta.unbox(plain.init(jax.random.PRNGKey(1), jnp.zeros((1, 8), jnp.int32))["params"]))()
  loaded = init_params(built.config.init_from, built.config.model, template)
  quant = built.config.lora.quant
  want = lora_lib.quantize_params(lora_lib.with_adapters(loaded, lora_lib.dequantize_params(params, quant)), quant)
  jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(want))
  assert all(not np.any(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
             if jax.tree_util.keystr(path).endswith("['lora_b']"))


def test_kernels_quantized_as_they_stream_in_equal_the_whole_base_quantized():
  """An `hf:` QLoRA start quantizes each kernel as the checkpoint streams it in (`builder.stream_quantizer`: the
  float base is never whole; peak memory: benchmarks/qlora_hf_load.py); the codes and the rest are what quantizing
  the loaded base whole gives, with a bf16 base too (the kernels cast first, as `frozen_dtype` casts them)."""
  from jaxpt.engine.builder import lifted, stream_quantizer
  from jaxpt.models import hf

  directory = "tests/assets/hf/qwen2"
  config = hf.read_config(directory)
  spec = lora_lib.LoRA(2, 1.0, quant=Quant("nf4", 16))
  template = nn.meta.unbox(jax.jit(TransformerLM(config, lora=spec).init)(jax.random.PRNGKey(0),
                                                                           jnp.zeros((1, 4), jnp.int32))["params"])
  whole = hf.load_params(directory, config)
  for dtype in (jnp.float32, jnp.bfloat16):
    streamed = lifted(hf.load_params(directory, config, each=stream_quantizer(template, spec.quant, dtype)))
    cast = jax.tree.map(lambda w: w.astype(dtype), whole)
    want = lora_lib.base_params(lora_lib.quantize_params(lora_lib.with_adapters(cast, template), spec.quant))
    assert jax.tree.structure(streamed) == jax.tree.structure(want)
    for path, got in jax.tree_util.tree_leaves_with_path(streamed):
      quantized = jax.tree_util.keystr(path).endswith(("['kernel_q']", "['kernel_scale']"))
      ref = functools.reduce(lambda tree, key: tree[key.key], path, want if quantized else whole)  # others: as read
      np.testing.assert_array_equal(got, ref, jax.tree_util.keystr(path))


@pytest.mark.parametrize("source", ["plain", pytest.param("lora", marks=pytest.mark.slow), "qlora"])
def test_a_jaxpt_run_start_is_quantized_one_projection_at_a_time(source, tmp_path):
  """`init_from` a jaxpt run into a QLoRA run restores the float base in parts (`init_from.run_params(each=...)`):
  the rest at once, then each projection alone (a LoRA run's merged, a QLoRA run's codes dequantized and merged) and
  quantized before the next is read; the params are bitwise those of the whole base restored, then quantized. The
  starting run: a plain, LoRA or QLoRA (int8) model's params, random (codes too), as a checkpoint + config.json."""
  import json

  import optax

  from jaxpt.engine.builder import lifted, stream_quantizer
  from jaxpt.engine.checkpoint import Checkpointer
  from jaxpt.engine.init_from import run_params
  from jaxpt.engine.state import TrainState
  from jaxpt.models.transformer import init_params

  config = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = lambda lora: jax.tree.map(  # the params' shapes (no init compiled), placed on one device
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=one),
      jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), model=TransformerLM(config, lora=lora))))
  rng = np.random.default_rng(0)
  draw = lambda leaf: (rng.integers(-127, 128, leaf.shape).astype(leaf.dtype) if leaf.dtype == jnp.int8 else
                       rng.uniform(0.01, 0.1, leaf.shape).astype(leaf.dtype))
  recorded = {"plain": {}, "lora": {"rank": 2, "alpha": 4.0},
              "qlora": {"rank": 2, "alpha": 4.0, "base_quant": "int8", "base_quant_block": 8}}[source]
  params = jax.tree.map(draw, shapes(from_section(lora_lib.LoRAConfig, recorded, "lora").spec()))
  checkpointer = Checkpointer(str(tmp_path), async_save=False)
  checkpointer.save(TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(0)))
  checkpointer.close()
  (tmp_path / "config.json").write_text(json.dumps({"trainer": "sft", "lora": recorded}))

  spec = lora_lib.LoRA(4, 1.0, quant=Quant("nf4", 8))  # head_dim 8: o's blocked axis
  template, floats = shapes(spec), shapes(None)
  read = []
  quantizer = stream_quantizer(template, spec.quant, jnp.float32)
  each = lambda names, kernel: read.append(names) or quantizer(names, kernel)
  streamed = lifted(run_params(str(tmp_path), config, floats, each=each))
  adapters = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), lora_lib.adapter_params(template))
  whole = lora_lib.with_adapters(run_params(str(tmp_path), config, floats), adapters)
  want = jax.jit(lambda p: lora_lib.base_params(lora_lib.quantize_params(p, spec.quant)))(whole)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(streamed), jax.device_get(want))
  assert len(read) == 7 and all(names[-1] == "kernel" for names in read), read  # q k v o wi_gate wi_up wo


NF4_16 = {"lora.base_quant": "nf4", "lora.base_quant_block": 16}


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["dpo", "grpo", "rm"])
def test_qlora_on_dpo_grpo_and_rm(trainer, tmp_path):
  """DPO (its reference: the quantized base, adapters off; loss log 2 at B = 0), GRPO (`lora.rollouts` auto: rollouts
  and the KL reference on the codes, the sampler's arguments smaller than the merged float policy) resume bitwise
  and change only the adapters; RM trains its head whole beside them."""
  if trainer == "rm":
    config = config_of(rm_tiny, {**PAIRS, "steps": 3, **NF4_16})
    built = jaxpt.build("rm", config, str(tmp_path))
    initial = jax.device_get(built.training.init_state().params)
    state = jaxpt.train("rm", config, str(tmp_path), built=built).state
    changed = changed_leaves(initial, jax.device_get(state.params))
    assert {p for p in changed if not is_adapter(p)} == {"['head']['kernel']"}, changed
    return
  if trainer == "dpo":
    config, stop_at = config_of(dpo_tiny, {**PAIRS, "steps": 4, **NF4_16}), 2
  else:
    config, stop_at = config_of(grpo_tiny, {**GRPO_MICRO, **LORA, "checkpoint_every": 1, **NF4_16}), 1
  built, initial, whole, resumed, rows, _ = run_twice(trainer, config, tmp_path, stop_at=stop_at)
  assert built.hooks.ref_params is None
  changed = changed_leaves(initial, jax.device_get(whole.state.params))
  assert changed and all(is_adapter(p) for p in changed), changed
  assert_bitwise(resumed.state, whole.state)
  if trainer == "dpo":
    assert rows[0]["dpo_loss"] == pytest.approx(np.log(2.0), abs=1e-6)
  else:
    assert any(0 < row["reward_mean"] < 1 for row in rows if "reward_mean" in row)  # advantages that are not 0
    merged = jax.eval_shape(built.training.merged_params, whole.state.params)
    assert built.config.lora.samples_unmerged and built.hooks.collector.sampler_memory["argument_mib"] * 2**20 < sum(
        leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(merged))


def test_gradient_accumulation_passes_the_codes_float0_gradients_through():
  """optim.grad_accum_steps > 1 with a quantized base: the accumulated adapter gradients equal one batch's (the
  micro-batches' losses weighted by their tokens), and the codes keep their float0 gradients, as without it."""
  from jaxpt.engine.step import accumulate_gradients

  spec = lora_lib.LoRA(4, 2.0, quant=Quant("int8", 16))
  model, tokens = TransformerLM(MODEL, lora=spec), (jnp.arange(64, dtype=jnp.int32).reshape(4, 16) * 5) % 64
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"])
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: v + 0.05 if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)

  def loss_fn(p, batch, rng):
    del rng
    return jnp.mean(model.apply({"params": p}, batch["tokens"]) ** 2), {"num_tokens": jnp.float32(batch["tokens"].size)}

  grads = {n: jax.jit(lambda p, n=n: accumulate_gradients(loss_fn, p, {"tokens": tokens}, jax.random.PRNGKey(1), n)[0])(
      params) for n in (1, 2)}
  one, two = (dict(jax.tree_util.tree_leaves_with_path(grads[n])) for n in (1, 2))
  for path, grad in one.items():
    if jax.tree_util.keystr(path).endswith("['kernel_q']"):
      assert grad.dtype == two[path].dtype == jax.dtypes.float0
    elif is_adapter(jax.tree_util.keystr(path)):
      np.testing.assert_allclose(two[path], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_grpo_rollouts_on_the_codes_equal_the_merged_ones(tmp_path):
  """The same QLoRA policy (B moved off 0) rolled out by GRPO's collector both ways (`lora.rollouts`): unmerged on
  the codes and merged on the float copy give the same sampled tokens, and old and reference log-probs to
  rounding."""
  built = {}
  for way in ("unmerged", "merged"):
    config = config_of(grpo_tiny, {**GRPO_MICRO, **LORA, **NF4_16, "lora.rollouts": way})
    built[way] = jaxpt.build("grpo", config, str(tmp_path / way))
  params = built["merged"].training.init_state().params
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: v + 0.05 if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
  batch, rng, got = built["merged"].hooks.collector.prompts.batch(0), jax.random.PRNGKey(3), {}
  for way, run in built.items():
    hooks = run.hooks
    ro, _ = hooks.collector.step_rollouts(hooks.policy_params(params), batch, 0, rng)
    inputs = [ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")]
    got[way] = jax.device_get({"tokens": ro["tokens"], "old_logp": ro["old_logp"],
                               "ref_logp": hooks.collector.logprobs(hooks.reference_params(params), *inputs)})
  np.testing.assert_array_equal(got["unmerged"]["tokens"], got["merged"]["tokens"])
  for key in ("old_logp", "ref_logp"):
    np.testing.assert_allclose(got["unmerged"][key], got["merged"][key], rtol=1e-5, atol=1e-5, err_msg=key)
  assert np.abs(got["merged"]["old_logp"] - got["merged"]["ref_logp"]).max() > 1e-3  # the adapters matter
