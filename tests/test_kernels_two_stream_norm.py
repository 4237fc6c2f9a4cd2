"""Fused two-stream-norm boundaries (kernels/two_stream_norm): the reference against the spec's equations, the
Pallas kernels (interpret mode on CPU) against the reference -- outputs and every gradient -- the model's
`kernel` switch, and lowering for TPU (Mosaic) and GPU (Triton) targets without those devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxpt.kernels.two_stream_norm as tsn
from jaxpt.kernels.two_stream_norm import layout
from jaxpt.kernels.two_stream_norm import reference
from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from tests.xla_flags import COMPILER_OPTIONS

EPS = 1e-5
SMALL_TILES = {"block_rows": 16, "chunk_rows": 8}  # several blocks and a chunk loop on tiny shapes
BF16_TILES = {"block_rows": 32, "chunk_rows": 16}  # bf16 packs 16 rows per TPU tile


def compiled(fn, *args):
  """`jax.jit(fn)` compiled for `args` as the suite compiles (interpret-mode kernels make large HLO)."""
  return jax.jit(fn).trace(*args).lower().compile(compiler_options=COMPILER_OPTIONS)


def norm_params(key, d, layernorm):
  k1, k2 = jax.random.split(key)
  params = {"scale": 1.0 + 0.3 * jax.random.normal(k1, (d,))}
  if layernorm:
    params["bias"] = 0.3 * jax.random.normal(k2, (d,))
  return params


def boundary_inputs(shape, layernorm, dtype, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 8)
  d = shape[-1]
  rows = [(s * jax.random.normal(k, shape) + o).astype(dtype)
          for k, s, o in zip(keys[:3], (1.0, 3.0, 2.0), (0.5, -1.0, 0.0))]
  norms = [norm_params(k, d, layernorm) for k in keys[3:6]]
  return rows, norms, jnp.float32(np.sqrt(6.0))


# --- the reference against a plain float64 statement of the spec -------------------------------------------

def np_norm(p, x):
  x = np.asarray(x, np.float64)
  if "bias" in p:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS) * p["scale"] + p["bias"]
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + EPS) * p["scale"]


@pytest.mark.parametrize("layernorm", [False, True])
def test_reference_states_the_spec_equations(layernorm):
  (xh_prev, y_prev, z), (post, pre, in_norm), c = boundary_inputs((3, 5, 40), layernorm, jnp.float32)
  np64 = lambda t: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), t)
  post64, pre64, in_norm64 = np64(post), np64(pre), np64(in_norm)
  p = np.asarray(xh_prev, np.float64) + np.asarray(z, np.float64) / float(c)
  y = np.asarray(y_prev, np.float64) + np.asarray(z, np.float64)
  xh = np_norm(post64, p)
  h = np_norm(in_norm64, xh + np_norm(pre64, y))
  got = reference.post_pre_boundary(xh_prev, y_prev, z, c, post, pre, in_norm, EPS)
  for a, b in zip(got, (xh, y, h)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
  xh0, y0, h0 = reference.post_pre_boundary(xh_prev, y_prev, None, None, post, pre, in_norm, EPS)
  np.testing.assert_array_equal(y0, y_prev)
  np.testing.assert_allclose(xh0, np_norm(post64, xh_prev), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(h0, np_norm(in_norm64, np_norm(post64, xh_prev) + np_norm(pre64, y_prev)),
                             rtol=2e-5, atol=2e-5)
  c1 = np.linspace(0.5, 1.5, 40)
  np.testing.assert_allclose(reference.hybrid_entry(xh_prev, y_prev, jnp.asarray(c1, jnp.float32), pre, EPS),
                             c1 * np.asarray(xh_prev, np.float64) + np_norm(pre64, y_prev), rtol=2e-5, atol=2e-5)
  x, y_u, h_u = reference.hybrid_entry_update(xh_prev, y_prev, z, c, jnp.asarray(c1, jnp.float32), pre, EPS)
  np.testing.assert_allclose(x, p, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(y_u, y, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(h_u, c1 * p + np_norm(pre64, y), rtol=2e-5, atol=2e-5)


# --- Pallas kernels against the reference: outputs and every gradient ---------------------------------------

def compare(fn_pallas, fn_ref, args, cotangent_seed, dtype):
  """Forward outputs and the VJP for random cotangents (all args, including norm params, c and c1)."""
  out_p, vjp_p = compiled(lambda *a: jax.vjp(fn_pallas, *a), *args)(*args)
  if dtype == jnp.float32:
    out_r, vjp_r = jax.vjp(fn_ref, *args)
    tol = {"rtol": 1e-4, "atol": 1e-4}
  else:  # bf16 kernel (f32 math inside) against the reference run in f32 on the same bf16 inputs
    args32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), args)
    out_r, vjp_r = jax.vjp(fn_ref, *args32)
    tol = {"rtol": 5e-2, "atol": 8e-2}
  out_p, out_r = jax.tree_util.tree_leaves(out_p), jax.tree_util.tree_leaves(out_r)
  for a, b in zip(out_p, out_r):
    assert a.dtype == dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)
  keys = jax.random.split(jax.random.PRNGKey(cotangent_seed), len(out_p))
  cts = [jax.random.normal(k, a.shape) for k, a in zip(keys, out_p)]
  structure = jax.tree_util.tree_structure(fn_ref(*args))
  grads_p = vjp_p(jax.tree_util.tree_unflatten(structure, [c.astype(dtype) for c in cts]))
  grads_r = vjp_r(jax.tree_util.tree_unflatten(structure, [c.astype(out_r[0].dtype) for c in cts]))
  paths = jax.tree_util.tree_flatten_with_path(grads_r)[0]
  for (path, g_r), g_p in zip(paths, jax.tree_util.tree_leaves(grads_p)):
    g_p, g_r = np.asarray(g_p, np.float32), np.asarray(g_r, np.float32)
    scale = max(1.0, float(np.max(np.abs(g_r))))  # weight gradients sum over rows
    np.testing.assert_allclose(g_p / scale, g_r / scale, err_msg=jax.tree_util.keystr(path), **tol)
    assert np.any(g_r != 0), jax.tree_util.keystr(path)


POST_PRE_CASES = [  # (shape, layernorm, dtype, update, tiles)
    ((37, 200), False, jnp.float32, True, SMALL_TILES),    # ragged rows and d, two blocks of two chunks
    ((37, 200), True, jnp.float32, True, SMALL_TILES),
    ((2, 9, 128), True, jnp.float32, False, {}),          # default tiling, rows 18 -> 24
    ((24, 136), False, jnp.float32, False, SMALL_TILES),
    ((37, 200), True, jnp.bfloat16, True, BF16_TILES),
    ((2, 8, 256), False, jnp.bfloat16, True, {}),
]


@pytest.mark.parametrize("shape, layernorm, dtype, update, tiles", POST_PRE_CASES)
def test_post_pre_kernel_matches_reference(shape, layernorm, dtype, update, tiles):
  (xh_prev, y_prev, z), norms, c = boundary_inputs(shape, layernorm, dtype)

  def run(impl, **kw):
    if update:
      return lambda xp, yp, z, c, post, pre, in_norm: tsn.post_pre_boundary(xp, yp, z, c, post, pre, in_norm, eps=EPS,
                                                                         impl=impl, **kw)
    return lambda xp, yp, post, pre, in_norm: tsn.post_pre_boundary(xp, yp, None, None, post, pre, in_norm, eps=EPS,
                                                                impl=impl, **kw)

  args = (xh_prev, y_prev, z, c, *norms) if update else (xh_prev, y_prev, *norms)
  compare(run("pallas", **tiles), run("reference"), args, cotangent_seed=len(shape), dtype=dtype)


@pytest.mark.parametrize("shape, layernorm, dtype, update", [((37, 200), False, jnp.float32, False),
                                                             ((37, 200), True, jnp.float32, True),
                                                             ((3, 7, 128), True, jnp.bfloat16, False),
                                                             ((40, 136), False, jnp.bfloat16, True)])
def test_hybrid_entry_kernel_matches_reference(shape, layernorm, dtype, update):
  (x, y, z), (norm_y, _, _), c = boundary_inputs(shape, layernorm, dtype, seed=3)
  c1 = 1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(9), (shape[-1],))
  tiles = SMALL_TILES if dtype == jnp.float32 else BF16_TILES
  if update:
    run = lambda impl, **kw: lambda x, y, z, c, c1, n: tsn.hybrid_entry_update(x, y, z, c, c1, n, eps=EPS,
                                                                               impl=impl, **kw)
    args = (x, y, z, c, c1, norm_y)
  else:
    run = lambda impl, **kw: lambda x, y, c1, n: tsn.hybrid_entry(x, y, c1, n, eps=EPS, impl=impl, **kw)
    args = (x, y, c1, norm_y)
  compare(run("pallas", **tiles), run("reference"), args, cotangent_seed=1, dtype=dtype)


def test_c_may_be_traced_under_scan():
  """c scanned along layers (as under nn.scan): the kernel's outputs and d/dc follow the reference."""
  (xh_prev, y_prev, z), norms, _ = boundary_inputs((16, 128), False, jnp.float32)
  cs = jnp.sqrt(2.0 * jnp.arange(1.0, 4.0))

  def stack(impl):
    def loss(cs, xp):
      def step(carry, c):
        xh, y, h = tsn.post_pre_boundary(carry, y_prev, z, c, *norms, eps=EPS, impl=impl)
        return xh + 0.1 * h, jnp.sum(y * h)
      last, per_layer = jax.lax.scan(step, xp, cs)
      return jnp.sum(last ** 2) + jnp.sum(per_layer)
    return compiled(jax.value_and_grad(loss, argnums=(0, 1)), cs, xh_prev)

  (v_p, g_p), (v_r, g_r) = stack("pallas")(cs, xh_prev), stack("reference")(cs, xh_prev)
  np.testing.assert_allclose(v_p, v_r, rtol=1e-5)
  for a, b in zip(g_p, g_r):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_plans_pad_to_the_backend_tiling():
  tpu = layout.make_plan(16384, 1000, platform="tpu")
  assert tpu.d_pad == 1024 and tpu.block_rows % 8 == 0 and tpu.rows_pad % tpu.block_rows == 0
  gpu = layout.make_plan(37, 1000, platform="gpu")
  assert gpu.d_pad == 1024 and gpu.rows_pad % gpu.block_rows == 0 and gpu.block_rows % gpu.chunk_rows == 0
  assert layout.make_plan(37, 200, platform="cpu").platform == "interpret"
  assert layout.make_plan(40, 128, platform="tpu", itemsize=2).rows_pad == 48  # 16-row bf16 tiles
  with pytest.raises(ValueError, match="multiple of 16"):
    layout.make_plan(64, 128, platform="tpu", block_rows=16, chunk_rows=8, itemsize=2)
  with pytest.raises(ValueError, match="impl='triton'"):
    tsn.post_pre_boundary(*[jnp.ones((8, 128))] * 3, 1.0, {"scale": jnp.ones(128)}, {"scale": jnp.ones(128)},
                          {"scale": jnp.ones(128)}, eps=EPS, impl="triton")


# --- the model's kernel switch ---------------------------------------------------------------------------

TINY = ModelConfig(vocab_size=50, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=24,
                   max_seq_len=64, scan_layers=True)


def test_kernel_field_is_validated():
  with pytest.raises(ConfigError, match="model.kernel='triton': must be one of reference, pallas"):
    from_section(ModelConfig, dict(dataclasses.asdict(TINY), kernel="triton"), "model")


def randomised(params, seed=1):
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed)
  moved = [leaf + jnp.asarray(rng.normal(0.0, 0.3, leaf.shape), leaf.dtype)
           if any(k in jax.tree_util.keystr(p) for k in ("scale", "bias", "c1")) else leaf for p, leaf in leaves]
  return jax.tree_util.tree_unflatten(treedef, moved)


def lm_loss(cfg, tokens):
  def loss(params):
    logits = TransformerLM(cfg).apply({"params": params}, tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1))
  return loss


def assert_trees_close(got, want, **tol):
  paths = jax.tree_util.tree_flatten_with_path(want)[0]
  for (path, w), g in zip(paths, jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, w, err_msg=jax.tree_util.keystr(path), **tol)


def test_model_gradients_equal_with_the_kernel_switch():
  """siamese_post_pre with LayerNorm (siamese_hybrid_pre: see the training test below)."""
  cfg = dataclasses.replace(TINY, norm_scheme="siamese_post_pre", norm_type="layernorm")
  fused_cfg = dataclasses.replace(cfg, kernel="pallas")
  params = init_params(cfg, jax.random.PRNGKey(0))
  fused_shapes = jax.eval_shape(lambda: init_params(fused_cfg, jax.random.PRNGKey(0)))
  assert jax.tree_util.tree_structure(fused_shapes) == jax.tree_util.tree_structure(params)  # same tree
  jax.tree_util.tree_map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail("shape"),
                         params, fused_shapes)
  params = randomised(params)
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 8), 0, cfg.vocab_size)
  loss_r, grads_r = compiled(jax.value_and_grad(lm_loss(cfg, tokens)), params)(params)
  loss_p, grads_p = compiled(jax.value_and_grad(lm_loss(fused_cfg, tokens)), params)(params)
  np.testing.assert_allclose(loss_p, loss_r, rtol=1e-5)
  assert_trees_close(grads_p, grads_r, rtol=1e-4, atol=2e-6)


def test_training_loss_curve_is_the_same_either_way():
  """siamese_hybrid_pre, RMSNorm, remat: equal first-step gradients and equal AdamW loss curves."""
  cfg = dataclasses.replace(TINY, norm_scheme="siamese_hybrid_pre", remat="full")
  tokens = jax.random.randint(jax.random.PRNGKey(3), (4, 9), 0, cfg.vocab_size)
  optimizer = optax.adamw(3e-3, weight_decay=0.1)
  params = randomised(init_params(cfg, jax.random.PRNGKey(0)))

  def curve(cfg):
    def step(params, opt_state):
      value, grads = jax.value_and_grad(lm_loss(cfg, tokens))(params)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, value, grads

    state = (params, optimizer.init(params))
    step = compiled(step, *state)
    values, first_grads = [], None
    for _ in range(3):
      *state, value, grads = step(*state)
      values.append(float(value))
      first_grads = grads if first_grads is None else first_grads
    return np.array(values), first_grads

  (reference_curve, grads_r), (fused_curve, grads_p) = curve(cfg), curve(dataclasses.replace(cfg, kernel="pallas"))
  assert reference_curve[-1] < reference_curve[0]
  assert_trees_close(grads_p, grads_r, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(fused_curve, reference_curve, rtol=1e-4)


def test_bfloat16_model_with_the_kernel_tracks_float32():
  """bf16 compute with the fused kernels (f32 inside) stays as close to the f32 model as the reference path."""
  cfg = dataclasses.replace(TINY, norm_scheme="siamese_post_pre", dtype="bfloat16")
  params = randomised(init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 8), 0, cfg.vocab_size)
  logits = lambda c: compiled(TransformerLM(c).apply, {"params": params}, tokens)({"params": params}, tokens)
  exact = logits(dataclasses.replace(cfg, dtype="float32"))
  error_reference = float(jnp.max(jnp.abs(logits(cfg) - exact)))
  error_fused = float(jnp.max(jnp.abs(logits(dataclasses.replace(cfg, kernel="pallas")) - exact)))
  assert error_fused < max(2 * error_reference, 1e-2), (error_fused, error_reference)
