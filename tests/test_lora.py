"""LoRA (`jaxpt.nn.lora`): the adapter against a float64 NumPy statement, B = 0 leaves every residual scheme's logits
equal to the base, merge == unmerged, the `lora` section's errors, and a step that trains (and has optimizer state
for) the adapters alone."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.engine.builder import build_training, training_mesh
from jaxpt.engine.state import trainable_part
from jaxpt.models.config import NORM_SCHEMES, ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.dense import Dense
from jaxpt.nn.lora import LoRA, LoRAConfig
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.trainers.pretrain import PretrainRunConfig
from jaxpt.trainers.sft import SFTRunConfig

TINY = dict(vocab_size=64, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, mlp_dim=32, max_seq_len=16)


def numpy_lora(x, w, a, b, scale):
  """y = x W + s (x A) B and its gradients of sum(y * g) w.r.t. x, A, B, in float64."""
  x, w, a, b = (np.asarray(t, np.float64) for t in (x, w, a, b))
  return x @ w + scale * (x @ a) @ b


def test_dense_adapter_matches_float64_numpy_with_gradients():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 6)).astype(np.float32)
  g = rng.normal(size=(5, 7)).astype(np.float32)
  layer = Dense((7,), ("embed", "mlp"), lora=LoRA(rank=3, scale=lora_lib.lora_scale(8.0, 3)))
  params = nn.meta.unbox(layer.init(jax.random.PRNGKey(0), x)["params"])
  assert params["lora_a"].shape == (6, 3) and params["lora_b"].shape == (3, 7)
  assert np.all(np.asarray(params["lora_b"]) == 0) and np.abs(params["lora_a"]).max() <= 1 / np.sqrt(6)
  params = dict(params, lora_b=jnp.asarray(rng.normal(size=(3, 7)), jnp.float32))
  scale = 8.0 / 3
  y = layer.apply({"params": params}, x)
  w, a, b = (np.asarray(params[k], np.float64) for k in ("kernel", "lora_a", "lora_b"))
  np.testing.assert_allclose(y, numpy_lora(x, w, a, b, scale), rtol=1e-5, atol=1e-5)
  grads, dx = jax.grad(lambda p, x: jnp.sum(layer.apply({"params": p}, x) * g), argnums=(0, 1))(params, x)
  g64, x64 = np.asarray(g, np.float64), np.asarray(x, np.float64)
  np.testing.assert_allclose(grads["lora_b"], scale * (x64 @ a).T @ g64, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grads["lora_a"], scale * x64.T @ (g64 @ b.T), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grads["kernel"], x64.T @ g64, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, g64 @ w.T + scale * g64 @ b.T @ a.T, rtol=1e-5, atol=1e-5)


def test_rslora_scale_and_targets():
  assert lora_lib.lora_scale(16.0, 4) == 4.0 and lora_lib.lora_scale(16.0, 4, rslora=True) == 8.0
  assert lora_lib.resolve_targets("q,v") == ("q", "v")
  assert lora_lib.resolve_targets("mlp_.*") == ("mlp_in", "mlp_out")
  assert lora_lib.resolve_targets(".*") == lora_lib.PROJECTIONS
  assert LoRAConfig().spec() is None and LoRAConfig(rank=4, alpha=8.0, targets="o").spec() == LoRA(4, 2.0, 0.0, ("o",))


def perturbed(params, rng):
  """`params` with every lora_b set to random values (B = 0 makes every adapter a no-op)."""
  keys = iter(jax.random.split(rng, 1000))
  return jax.tree_util.tree_map_with_path(
      lambda path, p: jax.random.normal(next(keys), p.shape, p.dtype) * 0.1
      if jax.tree_util.keystr(path).endswith("['lora_b']") else p, params)


@pytest.mark.parametrize("scheme", NORM_SCHEMES)
def test_zero_b_is_the_base_and_merge_equals_unmerged_for_every_scheme(scheme):
  config = ModelConfig(**dict(TINY, num_layers=1), norm_scheme=scheme, scan_layers=False)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 8)), jnp.int32)
  spec = LoRA(rank=2, scale=2.0)
  lora_model, base_model = TransformerLM(config, lora=spec), TransformerLM(config)
  params = nn.meta.unbox(lora_model.init(jax.random.PRNGKey(0), tokens)["params"])

  def logits(params):  # (adapted at init, base, adapted with B != 0, merged base model)
    trained = perturbed(params, jax.random.PRNGKey(2))
    base = lambda p: base_model.apply({"params": p}, tokens)
    return (lora_model.apply({"params": params}, tokens), base(lora_lib.base_params(params)),
            lora_model.apply({"params": trained}, tokens), base(lora_lib.merge_params(trained, 2.0)))

  at_init, base, adapted, merged = logits(params)
  np.testing.assert_array_equal(at_init, base)
  np.testing.assert_allclose(adapted, merged, rtol=1e-5, atol=1e-5)
  assert np.abs(adapted - base).max() > 1e-3  # the adapters act


def sft_config(**lora):
  return {"model": TINY, "optim": {}, "data": {"seq_len": 8, "batch_size": 2}, "lora": lora,
          "decode": {"prompt_len": 8, "max_new_tokens": 8, "eval_problems": 0, "batch_size": 1}}


@pytest.mark.parametrize("lora, message", [
    ({"rank": 2, "targets": "q,ffn"}, r"^config\.lora\.targets='q,ffn': 'ffn' matches no projection \(projections: "
                                      r"q, k, v, o, mlp_in, mlp_out\)$"),
    ({"rank": 2, "targets": "q("}, r"^config\.lora\.targets='q\(': 'q\(' is not a regular expression"),
    ({"rank": 9, "targets": "k"}, r"^config\.lora\.rank=9: larger than the dims of projection 'k' \(16 -> 8\)$"),
    ({"rank": -1}, r"^config\.lora\.rank=-1: must be >= 0$"),
    ({"rank": 2, "dropout": 1.0}, r"^config\.lora\.dropout=1\.0: must be in \[0\.0, 1\.0\)$"),
    ({"rank": 2, "base_dtype": "int8"}, r"^config\.lora\.base_dtype='int8': must be one of float32, bfloat16$"),
])
def test_bad_lora_settings_are_one_line_errors_naming_the_field(lora, message):
  with pytest.raises(ConfigError, match=message):
    from_section(SFTRunConfig, sft_config(**lora), "config")


def test_moe_mlp_targets_and_pretraining_refuse_lora():
  moe = dict(sft_config(rank=2), model=dict(TINY, num_experts=2, experts_per_token=1))
  with pytest.raises(ConfigError, match=r"^config\.lora\.targets='q,k,v,o,mlp_in,mlp_out': projection 'mlp_in' has "
                     r"no adapter in this model \(MoE experts have none\)"):
    from_section(SFTRunConfig, moe, "config")
  assert from_section(SFTRunConfig, dict(moe, lora={"rank": 2, "targets": "q,v"}), "config").lora.rank == 2
  with pytest.raises(ConfigError, match=r"^config\.lora\.rank=2: jaxpt pretrain trains every parameter; LoRA is "
                     r"for jaxpt sft, grpo, ppo, rm, dpo or kto$"):
    from_section(PretrainRunConfig, {k: v for k, v in sft_config(rank=2).items() if k != "decode"}, "config")


@pytest.fixture(scope="module")
def steps():
  """The shared step compiled for a tiny LM with and without LoRA (rank 2 on every projection)."""
  built = {}
  for rank in (0, 2):
    config = from_section(SFTRunConfig, dict(sft_config(rank=rank, alpha=4.0), optim={"warmup_steps": 0}), "config")
    model = TransformerLM(config.model, lora=config.lora.spec())
    shapes = {k: jax.ShapeDtypeStruct((2, 8), jnp.int32 if k != "weights" else jnp.float32)
              for k in ("inputs", "targets", "weights")}
    built[rank] = build_training(config, training_mesh(config, 2), model, (jnp.zeros((1, 8), jnp.int32),), shapes,
                                 loss_fn=make_lm_loss_fn(model))
  return built


def test_only_adapters_train_have_optimizer_state_and_gradient_matmuls(steps):
  training = steps[2]
  state = training.init_state()
  moments = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)
             if np.ndim(_) > 0]
  assert moments and all(path.endswith(("['lora_a']", "['lora_b']")) for path in moments), moments
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(0, 64, (2, 8)).astype(np.int32), "targets": rng.integers(0, 64, (2, 8)).astype(
      np.int32), "weights": np.ones((2, 8), np.float32)}
  before = jax.tree.map(np.asarray, state.params)
  for _ in range(3):
    state, metrics = training.train_step(state, batch)
  after = jax.tree.map(np.asarray, state.params)
  for path, leaf in jax.tree_util.tree_leaves_with_path(before):
    new = after
    for key in path:
      new = new[key.key]
    changed = not np.array_equal(leaf, new)
    assert changed == jax.tree_util.keystr(path).endswith(("['lora_a']", "['lora_b']")), jax.tree_util.keystr(path)
  # the frozen base's weight gradients are not computed: the LoRA step has fewer FLOPs than the full one
  flops = {rank: t.sharded.train_step.cost_analysis()["flops"] for rank, t in steps.items()}
  assert flops[2] < 0.9 * flops[0], flops


def test_trainable_part_keeps_only_marked_leaves():
  tree = {"a": {"kernel": 1, "lora_a": 2}, "b": {"scale": 3}}
  mask = {"a": {"kernel": False, "lora_a": True}, "b": {"scale": False}}
  assert trainable_part(tree, mask) == {"a": {"lora_a": 2}}
  assert trainable_part(tree, None) is tree
  assert dataclasses.is_dataclass(LoRAConfig)


def test_adapter_trees_take_apart_and_put_back():
  """adapter_params keeps the paths to the adapters alone; replace_adapters and with_adapters put them back, the
  latter from a whole adapted tree or from its adapters alone."""
  adapted = {"attn": {"query": {"kernel": 1, "lora_a": 2, "lora_b": 3}, "norm": {"scale": 4}},
             "mlp": {"wo": {"kernel": 5}}, "embedding": 6}
  adapters = lora_lib.adapter_params(adapted)
  assert adapters == {"attn": {"query": {"lora_a": 2, "lora_b": 3}}}
  assert lora_lib.adapter_params({"embedding": 6, "mlp": {"wo": {"kernel": 5}}}) == {}
  new = {"attn": {"query": {"lora_a": 20}}}
  replaced = lora_lib.replace_adapters(adapted, new)
  assert replaced == {**adapted, "attn": {"query": {"kernel": 1, "lora_a": 20, "lora_b": 3}, "norm": {"scale": 4}}}
  base = lora_lib.base_params(adapted)
  assert lora_lib.with_adapters(base, adapted) == adapted == lora_lib.with_adapters(base, adapters)
  assert lora_lib.with_adapters(base, {}) == base


def test_adapters_split_like_their_kernels_under_the_sharding_rules():
  """A along `embed` over fsdp like its kernel's in axis, B along heads / mlp over tensor, the rank axis whole."""
  from jaxpt.parallel.rules import get_rules

  model = TransformerLM(ModelConfig(**TINY), lora=LoRA(rank=2, scale=1.0))
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  specs = nn.logical_to_mesh(nn.get_partition_spec(boxed), get_rules("fsdp_tp"))["decoder"]["layers"]
  assert tuple(specs["attn"]["query"]["lora_a"]) == (None, "fsdp", None)
  assert tuple(specs["attn"]["query"]["lora_b"]) == (None, None, "tensor", None)
  assert tuple(specs["attn"]["out"]["lora_a"]) == (None, "tensor", None, None)
  assert tuple(specs["attn"]["out"]["lora_b"]) == (None, None, "fsdp")
  assert tuple(specs["mlp"]["wo"]["lora_a"]) == (None, "tensor", None)


def test_a_bfloat16_base_stays_frozen_beside_float32_adapters():
  config = from_section(SFTRunConfig, dict(sft_config(rank=2, base_dtype="bfloat16"), optim={"warmup_steps": 0}),
                        "config")
  model = TransformerLM(config.model, lora=config.lora.spec())
  shapes = {k: jax.ShapeDtypeStruct((2, 8), jnp.int32 if k != "weights" else jnp.float32)
            for k in ("inputs", "targets", "weights")}
  training = build_training(config, training_mesh(config, 2), model, (jnp.zeros((1, 8), jnp.int32),), shapes,
                            loss_fn=make_lm_loss_fn(model))
  state = training.init_state()
  dtypes = {jax.tree_util.keystr(p): str(leaf.dtype) for p, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
  assert {d for p, d in dtypes.items() if p.endswith(("['lora_a']", "['lora_b']"))} == {"float32"}
  assert {d for p, d in dtypes.items() if not p.endswith(("['lora_a']", "['lora_b']"))} == {"bfloat16"}
  batch = {"inputs": np.ones((2, 8), np.int32), "targets": np.ones((2, 8), np.int32),
           "weights": np.ones((2, 8), np.float32)}
  new, metrics = training.train_step(state, batch)
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
  np.testing.assert_array_equal(new.params["embedding"], state.params["embedding"])
