"""Sharded training on 8 simulated CPU devices (run by tests/test_parallel_sharded.py in its own process).

Not collected by the main suite (the name does not match test_*.py): XLA must see 8 host devices before the
backend starts, which this module arranges at import. Run directly with
  python -m pytest tests/multidevice/sharded_training.py
"""

import os

# 8 host devices; the suite's cheaper XLA:CPU codegen (tests/xla_flags.py: compile time dominates these tiny
# programs; every run here uses it).
from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

import functools  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from experiments.configs import tiny  # noqa: E402
import jaxpt  # noqa: E402
from jaxpt import parallel  # noqa: E402
from jaxpt.config import ConfigError, config_dict  # noqa: E402
from jaxpt.data.packing import make_batch  # noqa: E402
from jaxpt.models.config import ModelConfig  # noqa: E402
from jaxpt.models.transformer import TransformerLM  # noqa: E402
from jaxpt.engine.checkpoint import Checkpointer  # noqa: E402
from jaxpt.trainers.lm import make_lm_loss_fn  # noqa: E402
from jaxpt.engine.optim import OptimConfig, decay_mask, make_optimizer  # noqa: E402
from jaxpt.engine.sharded import shard_training, sharded_init, train_state_sharding  # noqa: E402
from jaxpt.engine.state import TrainState  # noqa: E402
from jaxpt.engine.step import make_train_step  # noqa: E402

BATCH, SEQ, STEPS = 16, 16, 3
MESHES = {  # preset -> mesh sizes (data, fsdp, tensor) on 8 devices
    "dp": dict(data=8),
    "fsdp": dict(data=1, fsdp=8),
    "tp": dict(data=2, tensor=4),
    "fsdp_tp": dict(data=2, fsdp=2, tensor=2),
}
SCHEMES = {  # siamese also covers an untied LM head
    "pre": dict(norm_scheme="pre"),
    "siamese_post_pre": dict(norm_scheme="siamese_post_pre", tie_embeddings=False),
}
EXPERT_MESHES = {"ep": dict(data=2, expert=4), "fsdp_ep": dict(data=1, fsdp=2, expert=4)}
MOE_SCHEMES = {  # 4 experts, top-2: dropless (ragged_dot), and capacity 1.0 (some assignments dropped)
    "moe": dict(norm_scheme="pre", num_experts=4, experts_per_token=2),
    "moe_capacity": dict(norm_scheme="pre", num_experts=4, experts_per_token=2, moe_capacity_factor=1.0),
}


def test_eight_devices():
  assert jax.device_count() == 8


class Setup:
  """Model, optimizer and un-jitted init/step functions of one residual scheme (tiny, fp32)."""

  def __init__(self, scheme, accum=1):
    self.config = ModelConfig(vocab_size=256, d_model=32, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=64,
                              max_seq_len=SEQ, **{**SCHEMES, **MOE_SCHEMES}[scheme])
    self.model = TransformerLM(self.config)
    init_rng, self.train_rng = jax.random.split(jax.random.PRNGKey(0))
    self.dummy = jnp.zeros((1, SEQ), jnp.int32)
    self.boxed = jax.eval_shape(self.model.init, init_rng, self.dummy)["params"]
    optim = OptimConfig(learning_rate=1e-2, warmup_steps=1)
    self.optimizer, schedule = make_optimizer(optim, STEPS, mask=decay_mask(self.boxed))
    self.init_rng = init_rng
    self.step_fn = make_train_step(make_lm_loss_fn(self.model, z_loss=1e-4), self.optimizer, schedule,
                                   grad_accum_steps=accum)

  def init_fn(self):
    params = nn.meta.unbox(self.model.init(self.init_rng, self.dummy)["params"])
    return TrainState.create(params, self.optimizer, self.train_rng)


def batch(step):
  """Packed rows with two or three documents each (segment masks, positions, padding)."""
  rng = np.random.default_rng(step)
  tokens = rng.integers(0, 256, (BATCH, SEQ))
  cuts = np.sort(rng.integers(1, SEQ, (BATCH, 2)), axis=1)
  index = np.arange(SEQ)
  segments = 1 + (index >= cuts[:, :1]) + (index >= cuts[:, 1:])
  segments[:, -2:] = 0  # padding
  return make_batch(tokens, segments)


@functools.cache
def setup(scheme, accum=1):
  return Setup(scheme, accum)


@functools.cache
def reference(scheme, accum=1):
  """Single-device run: plain jit, no mesh. (losses per step, final state as numpy)."""
  s = setup(scheme, accum)
  state = jax.jit(s.init_fn)()
  step = jax.jit(s.step_fn)
  losses = []
  for t in range(STEPS):
    state, metrics = step(state, batch(t))
    losses.append(float(metrics["loss"]))
  return losses, jax.tree.map(np.asarray, state)


@functools.cache
def sharded(scheme, preset, accum=1):
  """The same 3 steps through jaxpt.parallel on an 8-device mesh: (losses, final state, ShardedTraining)."""
  s = setup(scheme, accum)
  mesh_config = parallel.MeshConfig(**{**MESHES, **EXPERT_MESHES}[preset], rules=preset)
  mesh = parallel.make_mesh(mesh_config)
  shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch(0).items()}
  training = shard_training(s.init_fn, s.step_fn, s.boxed, s.optimizer, mesh, mesh_config.logical_rules, shapes)
  state = training.init_state()
  losses = []
  for t in range(STEPS):
    state, metrics = training.train_step(state, parallel.global_batch(batch(t), training.batch_sharding, BATCH))
    losses.append(float(metrics["loss"]))
  return losses, state, training


# Pre-Norm on every mesh, SiameseNorm (two streams, untied head) on the mesh of all three axes by default; its other
# meshes are `slow` (tests/test_parallel_sharded)
@pytest.mark.parametrize("scheme,preset", [
    (scheme, preset) if scheme == "pre" or preset == "fsdp_tp" else pytest.param(scheme, preset, marks=pytest.mark.slow)
    for scheme in SCHEMES for preset in MESHES] + [("moe", "ep"), ("moe_capacity", "fsdp_ep")])
def test_matches_single_device(scheme, preset):
  """Loss and state after 3 steps; under the ep presets each device holds one expert's weights (and a quarter of
  the batch)."""
  want_losses, want = reference(scheme)
  losses, state, _ = sharded(scheme, preset)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  got = jax.tree.map(np.asarray, state)
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path[0]))
  if scheme in MOE_SCHEMES:
    experts = state.params["decoder"]["layers"]["mlp"]["wi_gate"]  # [layers, experts, embed, mlp]
    assert experts.sharding.spec[1] == "expert" and experts.addressable_shards[0].data.shape[1] == 1


def test_grad_accumulation_matches_single_device():
  """2 micro-batches of 8 rows, each spread over data x fsdp = 4 devices (and tensor-parallel)."""
  want_losses, want = reference("pre", accum=2)
  losses, state, _ = sharded("pre", "fsdp_tp", accum=2)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=2e-6)


def _strip(spec):
  """PartitionSpec without trailing None (unsplit) entries."""
  entries = list(spec)
  while entries and entries[-1] is None:
    entries.pop()
  return P(*entries)


def _leaf(tree, *keys):
  for key in keys:
    tree = tree[key]
  return tree


# (param path, preset) -> (mesh PartitionSpec, shard shape); params are [layers, ...] under decoder/layers.
QUERY = ("decoder", "layers", "attn", "query", "kernel")  # [2, 32, 4, 8]: layers, embed, heads, kv
WO = ("decoder", "layers", "mlp", "wo", "kernel")  # [2, 64, 32]: layers, mlp, embed
EMBED = ("embedding",)  # [256, 32]: vocab, embed
EXPECTED = {
    ("dp", QUERY): (P(), (2, 32, 4, 8)),
    ("dp", EMBED): (P(), (256, 32)),
    ("fsdp", QUERY): (P(None, "fsdp", None, None), (2, 4, 4, 8)),
    ("fsdp", WO): (P(None, None, "fsdp"), (2, 64, 4)),
    ("fsdp", EMBED): (P(None, "fsdp"), (256, 4)),
    ("tp", QUERY): (P(None, None, "tensor", None), (2, 32, 1, 8)),
    ("tp", WO): (P(None, "tensor", None), (2, 16, 32)),
    ("tp", EMBED): (P("tensor", None), (64, 32)),
    ("fsdp_tp", QUERY): (P(None, "fsdp", "tensor", None), (2, 16, 2, 8)),
    ("fsdp_tp", WO): (P(None, "tensor", "fsdp"), (2, 32, 16)),
    ("fsdp_tp", EMBED): (P("tensor", "fsdp"), (128, 16)),
}


@pytest.mark.parametrize("preset,path", list(EXPECTED), ids=[f"{p}-{k[-2] if len(k) > 1 else k[0]}"
                                                             for p, k in EXPECTED])
def test_params_and_moments_sharded_as_rules_say(preset, path):
  spec, shard_shape = EXPECTED[(preset, path)]
  _, state, _ = sharded("pre", preset)
  adam = state.opt_state[1][0]  # chain(clip, adamw): adamw's ScaleByAdamState
  for leaf in (_leaf(state.params, *path), _leaf(adam.mu, *path), _leaf(adam.nu, *path)):
    assert _strip(leaf.sharding.spec) == _strip(spec)
    assert {s.data.shape for s in leaf.addressable_shards} == {shard_shape}
  assert state.step.sharding.is_fully_replicated


def test_fsdp_state_memory_per_device_is_an_eighth_of_dp():
  dp, fsdp = sharded("pre", "dp")[2].memory, sharded("pre", "fsdp")[2].memory
  assert fsdp["argument_mib"] < dp["argument_mib"] / 5, (dp, fsdp)
  assert fsdp["peak_mib"] < dp["peak_mib"]


def _template(scheme, mesh_config, devices=None, abstract=False):
  """(state, its shardings) laid out on the mesh: made by the sharded init, or (abstract) only its shapes, dtypes
  and shardings (what `Checkpointer.restore_latest` reads of a template: no init compiled)."""
  s = setup(scheme)
  mesh = parallel.make_mesh(mesh_config, devices)
  shapes, sharding = train_state_sharding(s.init_fn, s.boxed, s.optimizer, mesh, mesh_config.logical_rules)
  if abstract:
    return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), shapes, sharding), sharding
  return sharded_init(s.init_fn, sharding, mesh, mesh_config.logical_rules)(), sharding


def test_checkpoint_restores_on_another_mesh_and_one_device(tmp_path):
  saved_config = parallel.MeshConfig(data=1, fsdp=2, tensor=4, rules="fsdp_tp")
  state, _ = _template("pre", saved_config)
  state = state.replace(params=jax.tree.map(lambda p: p + 0.5, state.params), step=state.step + 7)
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(state)
  checkpointer.close()
  want = jax.tree.map(np.asarray, state)
  targets = {"(4,2)": (parallel.MeshConfig(data=1, fsdp=4, tensor=2, rules="fsdp_tp"), None),
             "1 device": (parallel.MeshConfig(data=1), jax.devices()[:1])}
  for name, (mesh_config, devices) in targets.items():
    template, sharding = _template("pre", mesh_config, devices, abstract=True)
    checkpointer = Checkpointer(str(tmp_path))
    restored = checkpointer.restore_latest(template)
    checkpointer.close()
    assert int(restored.step) == 7, name
    for got, ref, sh in zip(jax.tree.leaves(restored), jax.tree.leaves(want), jax.tree.leaves(sharding)):
      assert got.sharding == sh, name
      np.testing.assert_array_equal(np.asarray(got), ref, err_msg=name)
  kernel = _leaf(restored.params, *QUERY)
  assert len(kernel.sharding.device_set) == 1


def _run_config(**mesh):
  config = tiny.get_config()
  config.data.batch_size = 12
  config.mesh = config_dict(parallel.MeshConfig, **mesh)
  return config


def test_mesh_not_dividing_devices_fails_naming_fields(tmp_path):

  with pytest.raises(ConfigError, match=r"config.mesh.data=3 x config.mesh.fsdp=1 x config.mesh.tensor=1: "
                                        r".*3 devices but there are 8"):
    jaxpt.build("pretrain", _run_config(data=3), str(tmp_path))
  with pytest.raises(ConfigError, match=r"config.mesh.tensor=3.*multiply to 3.*8 devices"):
    jaxpt.build("pretrain", _run_config(data=-1, tensor=3), str(tmp_path))


def test_batch_not_divisible_by_data_parallel_axes_fails_naming_fields(tmp_path):

  with pytest.raises(ConfigError, match=r"config.data.batch_size=12: .*config.mesh.data=1 x config.mesh.fsdp=8 = 8"):
    jaxpt.build("pretrain", _run_config(data=1, fsdp=8), str(tmp_path))
  assert not os.listdir(tmp_path)  # failed before any data work


def test_uneven_parameter_split_fails_naming_param(tmp_path):
  s = setup("pre")
  mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=1, tensor=8, rules="tp"))
  with pytest.raises(ConfigError, match=r"config.mesh.tensor=8 \(config.mesh.rules='tp'\): parameter .*attn.*"
                                        r"'(kv_)?heads' has size 4, not divisible by 8"):
    parallel.check_param_divisibility(s.boxed, mesh, parallel.get_rules("tp"), "tp")
