"""The suite's per-process persistent compilation cache (tests/conftest.py) must not change what a test measures:
an executable read back from the cache reports the same compiled memory and cost analysis as a fresh compile
(tests of the plan, LoRA, QLoRA and the reward model read them, and which of their compiles hit the cache depends
on the order the files run in)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def test_a_cached_executable_reports_what_a_fresh_compile_does():
  events = []
  jax.monitoring.register_event_listener(lambda name, **kwargs: events.append(name))

  def loss(x, w):  # shapes no other test compiles, so the first compile is fresh
    return jnp.tanh(x @ w).sum()

  args = (jnp.ones((67, 131)), jnp.ones((131, 29)))
  fresh = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile()
  jax.clear_caches()
  hits = events.count("/jax/compilation_cache/cache_hits")
  cached = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile()
  assert events.count("/jax/compilation_cache/cache_hits") == hits + 1  # read back from the cache
  memory = lambda c: {k: getattr(c.memory_analysis(), k) for k in (
      "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
      "generated_code_size_in_bytes")}
  assert memory(cached) == memory(fresh)
  assert cached.cost_analysis() == fresh.cost_analysis()
