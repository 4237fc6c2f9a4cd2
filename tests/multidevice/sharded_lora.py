"""LoRA training on 8 simulated CPU devices (run by tests/test_parallel_sharded.py in its own process): the shared
step with adapters on a data x fsdp x tensor mesh equals the one-device run, and the adapters and their moments are
split as their kernels' logical axes say (A along embed over fsdp, B along heads / mlp over tensor); with a quantized
base (QLoRA) too, its codes split as the kernels and its scales as the kernels' out axes; `init_from` that QLoRA run
restores its codes, scales and adapters split as the kernels they belong to (not whole on every device) and starts
from its merged policy, also quantized again one projection at a time into the codes' shardings.

  python -m pytest tests/multidevice/sharded_lora.py
"""

import os

from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxpt import parallel  # noqa: E402
from jaxpt.config import from_section  # noqa: E402
from jaxpt.engine.builder import build_training, lifted, stream_quantizer  # noqa: E402
from jaxpt.engine.checkpoint import Checkpointer, load_run_params  # noqa: E402
from jaxpt.engine.init_from import adapted_target, run_params  # noqa: E402
from jaxpt.engine.record import record_launch  # noqa: E402
from jaxpt.models.transformer import TransformerLM  # noqa: E402
from jaxpt.nn import lora as lora_lib  # noqa: E402
from jaxpt.trainers.lm import make_lm_loss_fn  # noqa: E402
from jaxpt.trainers.sft import SFTRunConfig  # noqa: E402

BATCH, SEQ, STEPS = 8, 8, 3
MODEL = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64, max_seq_len=16,
             norm_scheme="siamese_post_pre")


def run(mesh_sizes, devices, **lora):
  config = from_section(SFTRunConfig, {
      "model": MODEL, "optim": {"warmup_steps": 0, "learning_rate": 1e-2},
      "data": {"seq_len": SEQ, "batch_size": BATCH},
      "decode": {"prompt_len": 8, "max_new_tokens": 8, "eval_problems": 0, "batch_size": 1},
      "mesh": dict(mesh_sizes, rules="fsdp_tp"), "lora": {"rank": 2, "alpha": 4.0, **lora}}, "config")
  mesh = parallel.make_mesh(config.mesh, devices)
  model = TransformerLM(config.model, lora=config.lora.spec())
  shapes = {k: jax.ShapeDtypeStruct((BATCH, SEQ), jnp.float32 if k == "weights" else jnp.int32)
            for k in ("inputs", "targets", "weights")}
  training = build_training(config, mesh, model, (jnp.zeros((1, SEQ), jnp.int32),), shapes,
                            loss_fn=make_lm_loss_fn(model))
  state, losses = training.init_state(), []
  for t in range(STEPS):
    rng = np.random.default_rng(t)
    batch = {"inputs": rng.integers(0, 64, (BATCH, SEQ)).astype(np.int32),
             "targets": rng.integers(0, 64, (BATCH, SEQ)).astype(np.int32),
             "weights": np.ones((BATCH, SEQ), np.float32)}
    state, metrics = training.train_step(state, parallel.global_batch(batch, training.sharded.batch_sharding, BATCH))
    losses.append(float(metrics["loss"]))
  return losses, state, training


def test_lora_on_8_devices_matches_one_device_and_splits_the_adapters():
  want_losses, want, _ = run({"data": 1}, jax.devices()[:1])
  losses, state, _ = run({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices())
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  for path, got, ref in zip(jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(state.params),
                            jax.tree.leaves(want.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path[0]))
  attn = state.params["decoder"]["layers"]["attn"]
  assert tuple(attn["query"]["lora_a"].sharding.spec)[:2] == (None, "fsdp")
  assert tuple(attn["query"]["lora_b"].sharding.spec)[:3] == (None, None, "tensor")
  moments = state.opt_state[1][0].mu["decoder"]["layers"]["attn"]["query"]
  assert moments["lora_b"].sharding.spec == attn["query"]["lora_b"].sharding.spec
  assert "kernel" not in moments  # no optimizer state for the frozen base


def test_qlora_on_8_devices_matches_one_device_and_splits_codes_and_scales(tmp_path):
  quant = {"base_quant": "nf4", "base_quant_block": 8}
  want_losses, want, _ = run({"data": 1}, jax.devices()[:1], **quant)
  losses, state, training = run({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices(), **quant)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  for path, got, ref in zip(jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(state.params),
                            jax.tree.leaves(want.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path[0]))
  query = state.params["decoder"]["layers"]["attn"]["query"]
  assert query["kernel_q"].dtype == jnp.uint8 and tuple(query["kernel_q"].sharding.spec)[:3] == (None, "fsdp", "tensor")
  assert tuple(query["kernel_scale"].sharding.spec)[:3] == (None, None, "tensor")
  init_from_restores_the_codes_split(training, state, str(tmp_path / "qlora"))


def init_from_restores_the_codes_split(training, state, workdir):
  """`init_from` the QLoRA run: codes, scales and adapters are restored split as the run itself held them (their
  kernels' axes) into a plain model's template on the mesh, and the start is the run's merged policy."""
  record_launch(workdir, training.config, {})
  checkpointer = Checkpointer(workdir, async_save=False)
  checkpointer.save(state)
  checkpointer.close()
  plain = TransformerLM(training.config.model)
  boxed = jax.eval_shape(lambda: plain.init(jax.random.PRNGKey(0), jnp.zeros((1, SEQ), jnp.int32)))["params"]
  shardings = parallel.param_shardings(boxed, training.sharded.mesh, training.sharded.rules)
  template = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  restored = load_run_params(workdir, adapted_target(template, training.config.model, training.config.lora))
  for path, got, held in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(restored),
                             jax.tree.leaves(state.params)):
    assert got.sharding.is_equivalent_to(held.sharding, got.ndim), (jax.tree_util.keystr(path[0]), got.sharding,
                                                                      held.sharding)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(held))
  query = restored["decoder"]["layers"]["attn"]["query"]
  assert tuple(query["kernel_q"].sharding.spec)[:3] == (None, "fsdp", "tensor")  # 1/4 of the codes a device
  assert query["kernel_q"].addressable_shards[0].data.size * 4 == query["kernel_q"].size
  started = run_params(workdir, training.config.model, template)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(started),
               jax.device_get(training.merged_params(state.params)))
  # a QLoRA run started from it: each projection restored alone on the mesh, merged and quantized (a stacked kernel
  # one layer at a time) into the codes' shardings; bitwise the whole start quantized
  quant = training.config.lora.quant
  streamed = lifted(run_params(workdir, training.config.model, template,
                               each=stream_quantizer(state.params, quant, jnp.float32)))
  want = lora_lib.base_params(lora_lib.quantize_params(lora_lib.with_adapters(started, state.params), quant))
  for path, got, ref in zip(jax.tree_util.tree_leaves_with_path(streamed), jax.tree.leaves(streamed),
                            jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref), err_msg=jax.tree_util.keystr(path[0]))
  codes = streamed["decoder"]["layers"]["attn"]["query"]
  assert codes["kernel_q"].sharding.is_equivalent_to(query["kernel_q"].sharding, 4)
  assert codes["kernel_scale"].sharding.is_equivalent_to(query["kernel_scale"].sharding, 4)
