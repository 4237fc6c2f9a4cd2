"""jaxpt.parallel without devices: mesh-shape resolution, rule presets, validation errors, distributed start-up."""

import flax.linen as nn
import jax
import pytest
from jax.sharding import AbstractMesh

from experiments.configs import tiny
import jaxpt
from jaxpt import parallel
from jaxpt.config import ConfigError, config_dict, from_section
from jaxpt.parallel import distributed
from jaxpt.trainers.pretrain import PretrainRunConfig


def validate_config(config) -> PretrainRunConfig:
  return from_section(PretrainRunConfig, config, "config")


def test_default_mesh_is_all_devices_on_data():
  config = validate_config(tiny.get_config()).mesh
  assert parallel.resolve_mesh_shape(config, 8) == {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
  assert parallel.resolve_mesh_shape(config, 1) == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}
  mesh = parallel.make_mesh(config)
  assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1, "expert": 1}


def test_minus_one_takes_the_rest():
  config = parallel.MeshConfig(data=2, fsdp=-1, tensor=2)
  assert parallel.resolve_mesh_shape(config, 16) == {"data": 2, "fsdp": 4, "tensor": 2, "expert": 1}


@pytest.mark.parametrize("sizes,devices,pattern", [
    (dict(data=3), 8, r"config.mesh.data=3 x config.mesh.fsdp=1 x config.mesh.tensor=1: .*3 devices but there are 8"),
    (dict(data=-1, tensor=3), 8, r"config.mesh.tensor=3: the fixed sizes multiply to 3, .*8 devices"),
    (dict(data=2, fsdp=2, tensor=4), 8, r"the mesh has 16 devices but there are 8"),
])
def test_mesh_not_tiling_devices_names_sizes_and_fields(sizes, devices, pattern):
  config = parallel.MeshConfig(**{"rules": "fsdp_tp", **sizes})
  with pytest.raises(ConfigError, match=pattern):
    parallel.resolve_mesh_shape(config, devices)


@pytest.mark.parametrize("mesh,pattern", [
    (dict(data=0), r"config.mesh.data=0: must be a positive integer or -1"),
    (dict(data=-1, fsdp=-1), r"config.mesh.fsdp=-1: at most one mesh axis may be -1 \(config.mesh.data is -1 too\)"),
    (dict(rules="zero"), r"config.mesh.rules='zero': must be one of dp, fsdp, tp, fsdp_tp, ep, fsdp_ep"),
    (dict(data=2, expert=4, rules="fsdp_tp"), r"config.mesh.expert=4: config.mesh.rules='fsdp_tp' splits nothing"),
    (dict(tensor=2, rules="fsdp"), r"config.mesh.tensor=2: config.mesh.rules='fsdp' splits nothing over .*'tensor'"),
    (dict(data=2, tensor=4, rules="dp"), r"config.mesh.tensor=4: config.mesh.rules='dp' splits nothing"),
])
def test_static_mesh_errors_name_the_field(mesh, pattern):
  config = tiny.get_config()
  config.mesh = config_dict(parallel.MeshConfig, **mesh)
  with pytest.raises(ConfigError, match=pattern):
    validate_config(config)


def test_unknown_mesh_field():
  config = tiny.get_config()
  config.mesh.pipeline = 2
  with pytest.raises(ConfigError, match=r"config.mesh.pipeline: unknown field"):
    validate_config(config)


def test_global_batch_must_split_over_data_and_fsdp():
  mesh = AbstractMesh((2, 4, 1, 1), parallel.MESH_AXES)
  parallel.check_global_batch(16, mesh)
  with pytest.raises(ConfigError, match=r"config.data.batch_size=12: .*config.mesh.data=2 x config.mesh.fsdp=4 = 8"):
    parallel.check_global_batch(12, mesh)


def test_build_fails_on_a_mesh_larger_than_the_devices_before_data_work(tmp_path):

  config = tiny.get_config()
  config.mesh = config_dict(parallel.MeshConfig, data=jax.device_count() + 1)
  with pytest.raises(ConfigError, match=rf"config.mesh.data={jax.device_count() + 1} .*there are "):
    jaxpt.build("pretrain", config, str(tmp_path))
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("preset,names,want", [
    # activations: the batch takes data x fsdp first, so `embed` stays whole
    ("fsdp_tp", ("batch", "length", "embed"), (("data", "fsdp"), None, None)),
    ("fsdp_tp", ("batch", "length", "heads", "kv"), (("data", "fsdp"), None, "tensor", None)),
    ("fsdp_tp", ("batch", "length", "vocab"), (("data", "fsdp"), None, "tensor")),
    # parameters
    ("fsdp_tp", ("layers", "embed", "mlp"), (None, "fsdp", "tensor")),
    ("fsdp_tp", ("vocab", "embed"), ("tensor", "fsdp")),
    ("fsdp", ("layers", "embed", "kv_heads", "kv"), (None, "fsdp", None, None)),
    ("tp", ("layers", "embed", "kv_heads", "kv"), (None, None, "tensor", None)),
    ("tp", ("layers", "mlp", "embed"), (None, "tensor", None)),
    ("dp", ("vocab", "embed"), (None, None)),
    ("dp", ("batch", "length", "mlp"), (("data", "fsdp"), None, None)),
    # expert parallelism: the batch also over `expert`, the experts' weights split over it
    ("ep", ("batch", "length", "embed"), (("data", "fsdp", "expert"), None, None)),
    ("ep", ("layers", "expert", "embed", "mlp"), (None, "expert", None, None)),
    ("fsdp_ep", ("layers", "expert", "mlp", "embed"), (None, "expert", None, "fsdp")),
    ("fsdp_tp", ("layers", "expert", "embed", "mlp"), (None, None, "fsdp", "tensor")),
])
def test_rule_presets_map_logical_axes(preset, names, want):
  assert tuple(nn.logical_to_mesh_axes(names, parallel.get_rules(preset))) == want


def test_rule_presets_use_the_mesh_axes_they_promise():
  assert parallel.mesh_axes_used(parallel.get_rules("dp")) == {"data", "fsdp"}
  assert parallel.mesh_axes_used(parallel.get_rules("fsdp")) == {"data", "fsdp"}
  assert parallel.mesh_axes_used(parallel.get_rules("tp")) == {"data", "fsdp", "tensor"}
  with pytest.raises(KeyError, match="unknown sharding rules"):
    parallel.get_rules("zero3")


def test_distributed_start_up_modes(monkeypatch):
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
  assert not distributed.should_initialize("auto", None)
  assert distributed.should_initialize("auto", "10.0.0.2:1234")
  assert distributed.should_initialize("on", None)
  assert not distributed.should_initialize("off", "10.0.0.2:1234")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1v-n-0,t1v-n-1")
  assert distributed.should_initialize("auto", None)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
  assert not distributed.should_initialize("auto", None)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.2:1234")
  assert distributed.should_initialize("auto", None)
  with pytest.raises(ValueError, match="--distributed='yes'"):
    distributed.should_initialize("yes", None)
  assert not distributed.initialize("off")
