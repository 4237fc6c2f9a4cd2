"""TPU and GPU without the devices: each Pallas kernel (forward, forward + backward; bf16 and fp32), a SiameseNorm
train step and the rollout engine's paged attention (JAX's Pallas paged attention kernels) are exported with
`jax.export` from this CPU for TPU (Mosaic: `tpu_custom_call`) and CUDA (Triton: `__gpu$xla.gpu.triton`), lowered
and never run, so a change that breaks either lowering fails here."""

import collections
import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

import jaxpt.kernels.two_stream_norm as tsn
from jaxpt.kernels.two_stream_norm import layout
from jaxpt.models import fused
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.nn.attention import pallas_paged_attention
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.engine.optim import OptimConfig, make_optimizer
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import make_train_step

S = jax.ShapeDtypeStruct
EPS = 1e-5
MOSAIC, TRITON = "tpu_custom_call", "__gpu$xla.gpu.triton"
# kernel platform -> (jax.export platform, the custom call its kernels lower to, export's keyword arguments);
# jax.export refuses the Triton call (not a custom call it guarantees stable) unless told to let it through
TARGETS = {
    "tpu": ("tpu", MOSAIC, {}),
    "gpu": ("cuda", TRITON, {"disabled_checks": [export.DisabledSafetyCheck.custom_call(TRITON)]}),
}
CALL = re.compile(r"custom_call @(tpu_custom_call|__gpu\$xla\.gpu\.triton)\(")
KERNEL_NAME = re.compile(r'\b(?:kernel_)?name = "(\w+)"')  # Mosaic: kernel_name = "...", Triton: name = "..."
FORWARD, BACKWARD = "_forward_kernel", "_backward_kernel"


def exported_text(fn, target, *args, **kwargs):
  """MLIR text of `jax.jit(fn)` exported for `target` on abstract `args`."""
  return export.export(jax.jit(fn), platforms=[target], **kwargs)(*args).mlir_module()


def kernel_calls(text):
  """Counter of (custom call target, kernel name) over the Mosaic and Triton calls of a module's text."""
  calls = collections.Counter()
  for line in text.splitlines():  # one op a line
    call = CALL.search(line)
    if call:
      name = KERNEL_NAME.search(line)
      calls[call.group(1), name and name.group(1)] += 1
  return calls


# --- the kernels -----------------------------------------------------------------------------------------------

KERNELS = ("post_pre_boundary", "post_pre_boundary(z=None)", "hybrid_entry", "hybrid_entry_update")
CASES = {  # id -> (row shape, norm type, tiling)
    "aligned": ((2, 128, 1024), "rmsnorm", {}),
    "padded": ((600, 1000), "layernorm", {}),  # d and rows padded, several row blocks
    "chunked": ((600, 1000), "rmsnorm", {"block_rows": 128, "chunk_rows": 32}),  # the in-kernel chunk loop
}


def kernel_and_args(kernel, shape, norm_type, dtype, platform, tiles):
  """(fn, abstract args) of one kernel built for `platform`."""
  rows, vec, c = S(shape, dtype), S(shape[-1:], jnp.float32), S((), jnp.float32)
  norm = {"scale": vec, "bias": vec} if norm_type == "layernorm" else {"scale": vec}
  kw = dict(eps=EPS, impl="pallas", platform=platform, **tiles)
  if kernel == "post_pre_boundary":
    return lambda xp, yp, z, c, n: tsn.post_pre_boundary(xp, yp, z, c, *n, **kw), (rows, rows, rows, c, [norm] * 3)
  if kernel == "post_pre_boundary(z=None)":
    return lambda xp, yp, n: tsn.post_pre_boundary(xp, yp, None, None, *n, **kw), (rows, rows, [norm] * 3)
  if kernel == "hybrid_entry":
    return lambda x, y, c1, n: tsn.hybrid_entry(x, y, c1, n, **kw), (rows, rows, vec, norm)
  update = lambda xp, yp, z, c, c1, n: tsn.hybrid_entry_update(xp, yp, z, c, c1, n, **kw)
  return update, (rows, rows, rows, c, vec, norm)


def with_backward(fn, args):
  """(fn's outputs and its VJP for cotangents given as inputs, abstract args): forward and backward kernels."""
  cotangents = jax.eval_shape(fn, *args)

  def forward_backward(args, cotangents):
    outs, vjp = jax.vjp(fn, *args)
    return outs, vjp(cotangents)

  return forward_backward, (args, cotangents)


@pytest.mark.parametrize("platform", sorted(TARGETS))
@pytest.mark.parametrize("itemsize", [4, 2])
def test_cases_tile_as_named(platform, itemsize):
  """The shapes below exercise what their ids say, on both platforms' plans."""
  def plan(case):
    shape, _, tiles = CASES[case]
    return layout.make_plan(math.prod(shape[:-1]), shape[-1], platform, itemsize=itemsize, **tiles)

  assert not plan("aligned").padded
  padded = plan("padded")
  assert padded.d_pad > padded.d and padded.rows_pad > padded.rows and padded.grid > 1
  assert plan("chunked").chunks > 1


@pytest.mark.parametrize("platform", sorted(TARGETS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_lowers_to_the_platforms_custom_call(kernel, backward, case, dtype, platform):
  shape, norm_type, tiles = CASES[case]
  fn, args = kernel_and_args(kernel, shape, norm_type, dtype, platform, tiles)
  if backward:
    fn, args = with_backward(fn, args)
  target, call, kwargs = TARGETS[platform]
  expected = collections.Counter({(call, FORWARD): 1})
  if backward:
    expected[call, BACKWARD] = 1
  calls = kernel_calls(exported_text(fn, target, *args, **kwargs))
  assert calls == expected, calls


@pytest.mark.parametrize("kernel", ["post_pre_boundary", "hybrid_entry_update"])
def test_num_warps_reaches_the_triton_calls(kernel):
  """The tiling a device check tunes: `num_warps` overrides the plan's warps in every Triton call."""
  target, _, kwargs = TARGETS["gpu"]
  fn, args = kernel_and_args(kernel, (256, 1024), "rmsnorm", jnp.bfloat16, "gpu", {})
  warps = lambda text: set(re.findall(r"num_warps = (\d+)", text))
  assert warps(exported_text(fn, target, *args, **kwargs)) == {"8"}  # the plan's own choice at d 1024
  fn, args = kernel_and_args(kernel, (256, 1024), "rmsnorm", jnp.bfloat16, "gpu", {"num_warps": 16})
  backward, backward_args = with_backward(fn, args)
  assert warps(exported_text(backward, target, *backward_args, **kwargs)) == {"16"}  # forward and backward calls


@pytest.mark.parametrize("target", ["cpu", "tpu"])
def test_interpret_mode_lowers_to_no_kernel_call(target):
  """Negative check: in interpret mode (platform None on a CPU host; "cpu" here, so on any host) the kernels are
  plain HLO with no Mosaic or Triton call, whatever platform the module is exported for."""
  fn, args = with_backward(*kernel_and_args("post_pre_boundary", (600, 1000), "layernorm", jnp.float32, "cpu", {}))
  assert layout.resolve_platform("cpu") == "interpret"
  text = exported_text(fn, target, *args)
  assert kernel_calls(text) == collections.Counter() and MOSAIC not in text and TRITON not in text


# --- the rollout engine's paged attention ---------------------------------------------------------------------

PAGED = {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}  # kernel platform -> `EngineConfig.attention`


def paged_args(dtype):
  """One decode step's abstract inputs: q [8, 1, 8, 128], K/V pools [4 kv heads, 64 pages, 16, 128], tables [8, 8]."""
  pool = S((4, 64, 16, 128), dtype)
  return S((8, 1, 8, 128), dtype), pool, pool, S((8, 8), jnp.int32), S((8,), jnp.int32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("platform", sorted(TARGETS))
def test_paged_attention_lowers_to_the_platforms_kernel(platform, dtype):
  """`engine.attention = "pallas_tpu"` / `"pallas_gpu"` off interpret mode: the module holds the chip's kernel
  call (the TPU one has never run on a TPU; the GPU one ran on an H200); in interpret mode, a CPU host's default,
  none."""
  target, call, kwargs = TARGETS[platform]
  attention = lambda interpret: lambda *a: pallas_paged_attention(*a, kernel=PAGED[platform], interpret=interpret)
  text = exported_text(attention(False), target, *paged_args(dtype), **kwargs)
  assert call in text and sum(kernel_calls(text).values()) == 1
  text = jax.jit(attention(None)).lower(*paged_args(dtype)).as_text()  # interpret mode: host callbacks, no export
  assert MOSAIC not in text and TRITON not in text


# --- a train step ------------------------------------------------------------------------------------------------

TINY = dict(vocab_size=256, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=256, max_seq_len=16,
            scan_layers=True, kernel="pallas")
BATCH, SEQ = 2, 16
OPTIM = OptimConfig(learning_rate=1e-3, warmup_steps=10, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
                    weight_decay=0.1, grad_clip=1.0)
MODELS = {  # id -> ModelConfig fields over TINY
    "siamese_post_pre": dict(norm_scheme="siamese_post_pre"),
    "siamese_hybrid_pre-bf16-remat-layernorm": dict(norm_scheme="siamese_hybrid_pre", dtype="bfloat16",
                                                    remat="full", norm_type="layernorm"),
    "pre": dict(norm_scheme="pre"),  # no fused boundary: `kernel` ignored
}


def abstract_train_step(fields):
  """(step, abstract state, abstract batch), built as benchmarks/train_step.py builds them; nothing allocated."""
  cfg = ModelConfig(**TINY, **fields)
  optimizer, schedule = make_optimizer(OPTIM, total_steps=100)
  state = jax.eval_shape(lambda: TrainState.create(init_params(cfg, jax.random.PRNGKey(0)), optimizer,
                                                   jax.random.PRNGKey(1)))
  batch = {"inputs": S((BATCH, SEQ), jnp.int32), "targets": S((BATCH, SEQ), jnp.int32),
           "weights": S((BATCH, SEQ), jnp.float32)}
  return make_train_step(make_lm_loss_fn(TransformerLM(cfg)), optimizer, schedule), state, batch


@pytest.fixture(scope="module", params=sorted(MODELS))
def train_step(request):
  return request.param, abstract_train_step(MODELS[request.param])


@pytest.mark.parametrize("platform", sorted(TARGETS))
def test_train_step_lowers_with_the_kernels(train_step, platform):
  """Each fused boundary of the scanned block: its forward kernel (again when rematerialised) and its backward."""
  name, (step, state, batch) = train_step
  target, call, kwargs = TARGETS[platform]
  with fused.kernel_platform(platform):
    calls = kernel_calls(exported_text(step, target, state, batch, **kwargs))
  if name == "pre":
    assert calls == collections.Counter()
    return
  assert set(calls) == {(call, FORWARD), (call, BACKWARD)}, calls
  assert calls[call, BACKWARD] == 2 and calls[call, FORWARD] >= 2, calls


def test_kernel_platform_retraces_and_is_validated():
  """The same jitted step exported for TPU under `kernel_platform("tpu")` holds the Mosaic calls, and then under
  `kernel_platform("cpu")` (interpret mode, a CPU host's default) none: the context is part of JAX's trace cache
  key, so the second export traces again rather than reusing the first trace."""
  step, state, batch = abstract_train_step(MODELS["siamese_post_pre"])
  jitted = jax.jit(step)
  calls = {}
  for platform in ("tpu", "cpu"):
    with fused.kernel_platform(platform):
      calls[platform] = kernel_calls(export.export(jitted, platforms=["tpu"])(state, batch).mlir_module())
  assert calls["tpu"][MOSAIC, BACKWARD] == 2 and calls["cpu"] == collections.Counter(), calls
  with pytest.raises(ValueError, match="kernel_platform\\('tpuv5'\\): must be one of"):
    fused.kernel_platform("tpuv5")
