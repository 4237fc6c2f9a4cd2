"""Hugging Face import on 8 simulated CPU devices (run by tests/test_models_hf.py in its own process).

Not collected by the main suite (the name does not match test_*.py): XLA must see 8 host devices before the
backend starts, which this module arranges at import. Run directly with
  python -m pytest tests/multidevice/hf_sharded_load.py
"""

import os

from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxpt import parallel  # noqa: E402
from jaxpt.models import hf, hf_layout  # noqa: E402
from jaxpt.models.transformer import TransformerLM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(ROOT, "tests", "assets", "hf")


@pytest.fixture(scope="module")
def mesh():
  assert jax.device_count() == 8
  return parallel.make_mesh(parallel.MeshConfig(data=2, fsdp=2, tensor=2, rules="fsdp_tp"))


def test_fsdp_tp_load_is_sharded_and_gives_the_single_device_logits(mesh, monkeypatch):
  path = os.path.join(ASSETS, "llama")
  config = hf.read_config(path)
  reads = []  # (tensor, elements read, elements in the tensor's layer): no read takes a whole tensor

  def recording_read_slice(tensor, source, shape, index):
    block = read_slice(tensor, source, shape, index)
    reads.append((source.name, block.size, int(np.prod(shape))))
    return block

  read_slice = hf_layout.read_slice
  monkeypatch.setattr(hf, "read_slice", recording_read_slice)
  sharded = hf.load_params(path, config, mesh=mesh)
  monkeypatch.undo()
  assert reads and all(size < whole for _, size, whole in reads), [r for r in reads if r[1] >= r[2]]
  single = hf.load_params(path, config)
  layers = sharded["decoder"]["layers"]
  expected = {  # leaf -> spec under fsdp_tp: embed over fsdp, heads / kv_heads / mlp / vocab over tensor
      "embedding": (sharded["embedding"], P("tensor", "fsdp")),
      "query": (layers["attn"]["query"]["kernel"], P(None, "fsdp", "tensor", None)),
      "key": (layers["attn"]["key"]["kernel"], P(None, "fsdp", "tensor", None)),
      "out": (layers["attn"]["out"]["kernel"], P(None, "tensor", None, "fsdp")),
      "wo": (layers["mlp"]["wo"]["kernel"], P(None, "tensor", "fsdp")),
  }
  for name, (leaf, spec) in expected.items():
    assert leaf.sharding.spec == spec, (name, leaf.sharding.spec)
    assert leaf.addressable_shards[0].data.size * 4 == leaf.size, name  # a quarter per device (2 x 2 split)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), sharded, single)
  ids = np.load(os.path.join(path, "reference.npz"))["input_ids"]
  forward = jax.jit(lambda params: TransformerLM(config).apply({"params": params}, ids))
  np.testing.assert_allclose(forward(sharded), forward(single), rtol=1e-5, atol=1e-5)


def test_sharded_index_checkpoint_loads_sharded(mesh):
  path = os.path.join(ASSETS, "mistral")
  config = hf.read_config(path)
  params = hf.load_params(path, config, mesh=mesh)
  assert params["head"]["kernel"].sharding.spec == P("fsdp", "tensor")
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params,
               hf.load_params(path, config))


def test_python_api_on_a_mesh_gives_the_single_device_results(mesh):
  """jaxpt.load(..., mesh=) creates the params in the fsdp_tp sharding; logits and greedy generate equal the
  single-device model's."""
  import jaxpt

  path = f"hf:{os.path.join(ASSETS, 'qwen2')}"
  on_mesh, single = jaxpt.load(path, mesh=mesh), jaxpt.load(path)
  assert on_mesh.params["embedding"].sharding.spec == P("tensor", "fsdp")
  ids = np.arange(24, dtype=np.int32).reshape(2, 12) % 200
  np.testing.assert_allclose(np.asarray(on_mesh.logits(ids)), np.asarray(single.logits(ids)), rtol=1e-5, atol=1e-5)
  prompts = ["x = 1", "def f():"]
  assert on_mesh.generate(prompts, max_new_tokens=6) == single.generate(prompts, max_new_tokens=6)


def test_peft_adapters_load_in_the_rules_sharding_and_give_peft_logits(mesh):
  """jaxpt.load("hf:BASE", adapter=DIR, mesh=): each adapter in its kernel's split (A along embed over fsdp, B
  along kv_heads over tensor, the rank axis whole), the merged model's logits PEFT's (tests/assets/peft)."""
  import jaxpt

  directory = os.path.join(ROOT, "tests", "assets", "peft", "llama")
  model = jaxpt.load(f"hf:{os.path.join(ASSETS, 'llama')}", adapter=directory, mesh=mesh, dtype="float32")
  value = model.adapters["decoder"]["layers"]["attn"]["value"]
  assert value["lora_a"].sharding.spec == P(None, "fsdp", None), value["lora_a"].sharding.spec  # [layers, d, r]
  assert value["lora_b"].sharding.spec == P(None, None, "tensor", None), value["lora_b"].sharding.spec
  assert model.params["decoder"]["layers"]["attn"]["value"]["kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
  reference = np.load(os.path.join(directory, "reference.npz"))
  np.testing.assert_allclose(np.asarray(model.logits(reference["input_ids"])), reference["logits"], rtol=0,
                             atol=1e-5 * float(np.abs(reference["logits"]).max()))
