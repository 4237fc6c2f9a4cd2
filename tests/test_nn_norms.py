"""`jaxpt.nn.norms`: RMSNorm and LayerNorm against their equations in float64 NumPy (outputs and gradients), and
their checkpointing: the backward keeps the norm's input, not its float32 intermediates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.nn.norms import make_norm

EPS = 1e-5


def rms_norm_np(x, w):
  return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + EPS) * w


def layer_norm_np(x, w, b):
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt(np.mean(centred ** 2, axis=-1, keepdims=True) + EPS) * w + b


def numeric_grad(f, x, h=1e-6):
  """d sum(f(x) * cotangent) / dx by central differences, float64."""
  grad = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    step = np.zeros_like(x)
    step[i] = h
    grad[i] = (f(x + step) - f(x - step)) / (2 * h)
  return grad


@pytest.mark.parametrize("norm_type", ["rmsnorm", "layernorm"])
def test_norm_and_its_gradients_match_the_equations(norm_type):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 8))
  cotangent = rng.normal(size=x.shape)
  w, b = rng.normal(size=8), rng.normal(size=8)
  params = {"scale": jnp.asarray(w, jnp.float32)} | ({"bias": jnp.asarray(b, jnp.float32)}
                                                      if norm_type == "layernorm" else {})
  norm = make_norm(norm_type, EPS, jnp.float32, jnp.float32, "norm")

  def reference(x):
    return rms_norm_np(x, w) if norm_type == "rmsnorm" else layer_norm_np(x, w, b)

  def loss(x):
    return jnp.sum(norm.apply({"params": params}, x) * cotangent)

  y = norm.apply({"params": params}, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)
  expected = numeric_grad(lambda x: np.sum(reference(x) * cotangent), x)
  np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(x, jnp.float32)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_type", ["rmsnorm", "layernorm"])
def test_the_backward_keeps_only_the_input_not_float32_intermediates(norm_type):
  """A bf16 norm inside a differentiated function saves x (bf16, its input) and the params: no [..., features]
  float32 array (autodiff of the plain norm would store three)."""
  x = jnp.ones((2, 4, 16), jnp.bfloat16)
  norm = make_norm(norm_type, EPS, jnp.bfloat16, jnp.float32, "norm")
  params = norm.init(jax.random.PRNGKey(0), x)

  _, backward = jax.vjp(lambda p, x: jnp.sum(norm.apply(p, x).astype(jnp.float32)), params, x)
  saved = [(leaf.shape, leaf.dtype) for leaf in jax.tree_util.tree_leaves(backward)]  # the residuals it holds
  assert [s for s in saved if s[0] == x.shape] == [(x.shape, jnp.bfloat16)], saved
