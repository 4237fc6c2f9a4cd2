"""SwiGLU's product `jaxpt.nn.mlp.swiglu`: its value and both gradients against the plain float64 NumPy statement,
and what its backward keeps (its two inputs, where JAX's derivative of the unchecked silu(gate) * up keeps more)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxpt.nn.mlp import swiglu


def swiglu_reference(gate, up, d_hidden):
  """float64: h = gate sigmoid(gate) up; d up = d h gate s; d gate = d h up (s + gate s (1 - s))."""
  s = 1.0 / (1.0 + np.exp(-gate))
  return gate * s * up, d_hidden * up * (s + gate * s * (1.0 - s)), d_hidden * gate * s


def check(gate, up, d_hidden, rtol, atol, recompute=True):
  out, vjp = jax.vjp(lambda g, u: swiglu(g, u, recompute), jnp.asarray(gate, jnp.float32), jnp.asarray(up, jnp.float32))
  d_gate, d_up = vjp(jnp.asarray(d_hidden, jnp.float32))
  want, want_d_gate, want_d_up = swiglu_reference(*(np.asarray(a, np.float32).astype(np.float64)
                                                    for a in (gate, up, d_hidden)))
  for got, expected in ((out, want), (d_gate, want_d_gate), (d_up, want_d_up)):
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("recompute", [True, False])
def test_value_and_gradients_match_the_plain_equations(recompute):
  rng = np.random.default_rng(0)
  gate, up, d_hidden = (3.0 * rng.standard_normal((2, 5, 16)) for _ in range(3))
  check(gate, up, d_hidden, rtol=1e-5, atol=1e-6, recompute=recompute)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, (3, 4), elements=st.floats(-30, 30, width=32)),
       hnp.arrays(np.float32, (3, 4), elements=st.floats(-10, 10, width=32)),
       hnp.arrays(np.float32, (3, 4), elements=st.floats(-10, 10, width=32)))
def test_gradients_hold_over_the_range_of_gates(gate, up, d_hidden):
  """Large gates of either sign included."""
  check(gate, up, d_hidden, rtol=1e-5, atol=1e-6)


def test_jit_grad_in_bfloat16_keeps_the_dtype():
  gate = jnp.linspace(-4, 4, 12, dtype=jnp.bfloat16).reshape(3, 4)
  grads = jax.jit(jax.grad(lambda g, u: swiglu(g, u).astype(jnp.float32).sum(), argnums=(0, 1)))(gate, gate)
  assert all(g.dtype == jnp.bfloat16 for g in grads)
  _, want_d_gate, _ = swiglu_reference(np.asarray(gate, np.float64), np.asarray(gate, np.float64), 1.0)
  np.testing.assert_allclose(np.asarray(grads[0], np.float64), want_d_gate, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fn,kept", [(swiglu, 2), (lambda g, u: swiglu(g, u, recompute=False), 3)])
def test_the_backward_keeps_only_the_inputs(fn, kept):
  """The arrays a VJP closes over are what the forward stores for the backward: gate and up for `swiglu`; JAX's
  derivative of the same product, not recomputed (as under a block remat), keeps at least a third (silu(gate)
  beside up, and the sigmoid's pieces)."""
  gate, up = jnp.ones((4, 8)), jnp.full((4, 8), 2.0)
  _, vjp = jax.vjp(fn, gate, up)
  stored = [x for x in jax.tree_util.tree_leaves(vjp) if getattr(x, "shape", ()) == (4, 8)]
  assert len(stored) >= kept if kept > 2 else len(stored) == kept
