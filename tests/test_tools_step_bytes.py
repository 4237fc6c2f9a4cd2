"""`tools/step_bytes.py`: the bytes of HLO types, where an op's metadata says it came from, and the non-matmul
traffic of a small compiled program, counted by hand."""

import jax
import jax.numpy as jnp
import pytest

from tools import step_bytes


def test_array_bytes_of_arrays_and_tuples():
  assert step_bytes.array_bytes("f32[8,512]{1,0}") == 8 * 512 * 4
  assert step_bytes.array_bytes("(bf16[3,4], s32[], pred[10])") == 3 * 4 * 2 + 4 + 10


@pytest.mark.parametrize("op_name,path,part", [
    ("jit(train_step)/transpose(jvp(TransformerLM))/decoder/layers_3/mlp/mul", "bwd decoder/layers_N/mlp/mul", "mlp"),
    ("jit(train_step)/jvp(TransformerLM)/decoder/layers_0/attn_norm/mul", "fwd decoder/layers_N/attn_norm/mul",
     "norms"),
    ("jit(train_step)/jvp(TransformerLM)/decoder/layers_1/attention/attn/div",
     "fwd decoder/layers_N/attention/attn/div", "attention"),
    ("jit(train_step)/jvp(TransformerLM)/decoder/layers_2/add", "fwd decoder/layers_N/add", "residual"),
    ("jit(train_step)/jvp()/exp", "fwd exp", "loss"),
    ("jit(train_step)/add", "fwd add", "optimizer"),
])
def test_an_op_is_placed_by_its_metadata(op_name, path, part):
  assert step_bytes.source_path(op_name) == path
  assert step_bytes.part(op_name) == part


def test_the_elementwise_op_is_counted_and_the_matmul_set_apart():
  """(a * b + 1) @ w on [64, 32] x [32, 16]: one elementwise fusion reads a and b and writes its [64, 32] result
  (3 x 8 KiB); the matmul (a YNNPACK fusion) reads that and w and writes [64, 16] (8 KiB + 2 KiB + 4 KiB)."""
  a = b = jnp.ones((64, 32))
  w = jnp.ones((32, 16))
  text = jax.jit(lambda a, b, w: (a * b + 1) @ w).lower(a, b, w).compile().as_text()
  counted = step_bytes.op_bytes(text)
  assert sorted((moved, is_matmul) for _, moved, is_matmul in counted) == [
      ((64 * 32 + 32 * 16 + 64 * 16) * 4, True), (3 * 64 * 32 * 4, False)]
  report = step_bytes.traffic(text.replace("64,32", "640000,32").replace("64,16", "640000,16"))
  assert report["non_matmul_gb"] == round(3 * 640000 * 32 * 4 / 1e9, 3) and report["parts_gb"] == {
      "optimizer": report["non_matmul_gb"]}  # outside any model
