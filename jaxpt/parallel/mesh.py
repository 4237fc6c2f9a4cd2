"""Device meshes from `config.mesh`: axes (data, fsdp, tensor), one size of -1 meaning "the rest".

    config.mesh = {data: -1, fsdp: 1, tensor: 1, rules: "fsdp_tp"}   # default: every device on `data`

On one device the default is a (1, 1, 1) mesh, which leaves the program as it was.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from jaxpt.models.config import ConfigError
from jaxpt.parallel.rules import DATA_AXES, MESH_AXES, RULE_PRESETS, Rules, get_rules, mesh_axes_used


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the mesh axes (-1 = all devices left over; at most one) and the rules preset name."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  rules: str = "fsdp_tp"

  @classmethod
  def from_config(cls, config: Any) -> "MeshConfig":
    """From a run config's `mesh` section (defaults where the section or a field is absent); static checks."""
    section = config.get("mesh") if hasattr(config, "get") else None
    values = {} if section is None else (section.to_dict() if hasattr(section, "to_dict") else dict(section))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(f"config.mesh.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    mesh_config = cls(**values)
    mesh_config.validate()
    return mesh_config

  @property
  def sizes(self) -> dict[str, int]:
    return {axis: getattr(self, axis) for axis in MESH_AXES}

  def validate(self) -> None:
    for axis, size in self.sizes.items():
      if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
        raise ConfigError(f"config.mesh.{axis}={size!r}: must be a positive integer or -1 (the rest)")
    if sum(size == -1 for size in self.sizes.values()) > 1:
      wild = [f"config.mesh.{a}=-1" for a, s in self.sizes.items() if s == -1]
      raise ConfigError(f"{', '.join(wild)}: at most one mesh axis may be -1")
    if self.rules not in RULE_PRESETS:
      raise ConfigError(f"config.mesh.rules={self.rules!r}: must be one of {', '.join(RULE_PRESETS)}")
    unused = [a for a, s in self.sizes.items() if s > 1 and a not in mesh_axes_used(get_rules(self.rules))]
    if unused:
      raise ConfigError(f"config.mesh.{unused[0]}={self.sizes[unused[0]]}: config.mesh.rules={self.rules!r} "
                        f"splits nothing over mesh axis {unused[0]!r} (pick rules that use it, or size 1)")

  @property
  def logical_rules(self) -> Rules:
    return get_rules(self.rules)


def resolve_mesh_shape(mesh_config: MeshConfig, num_devices: int) -> dict[str, int]:
  """{axis: size} with -1 resolved; ConfigError naming the fields when the sizes do not tile `num_devices`."""
  sizes = mesh_config.sizes
  fixed = math.prod(s for s in sizes.values() if s != -1)
  described = " x ".join(f"config.mesh.{a}={s}" for a, s in sizes.items())
  if -1 in sizes.values():
    if num_devices % fixed:
      raise ConfigError(f"{described}: the fixed sizes multiply to {fixed}, which does not divide the "
                        f"{num_devices} devices")
    return {a: (num_devices // fixed if s == -1 else s) for a, s in sizes.items()}
  if fixed != num_devices:
    raise ConfigError(f"{described}: the mesh has {fixed} devices but there are {num_devices} "
                      f"(set one axis to -1 to take the rest)")
  return dict(sizes)


def _device_grid(shape: Sequence[int], devices: Sequence[jax.Device]) -> np.ndarray:
  """Devices laid out as `shape`: topology-aware on TPU/GPU (jax mesh_utils), process-major order otherwise."""
  devices = list(devices)
  if devices[0].platform != "cpu":
    from jax.experimental import mesh_utils
    try:
      return mesh_utils.create_device_mesh(tuple(shape), devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
      pass
  ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
  return np.asarray(ordered, dtype=object).reshape(tuple(shape))


def make_mesh(mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `Mesh` over `devices` (default: all devices of all processes) with axes MESH_AXES (Auto sharding mode)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_config, len(devices))
  grid = _device_grid([shape[a] for a in MESH_AXES], devices)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  """Number of ways the batch is split: data x fsdp."""
  return math.prod(mesh.shape[a] for a in DATA_AXES)


def check_global_batch(batch_size: int, mesh: Mesh, field: str = "config.data.batch_size") -> None:
  """ConfigError naming the sizes and fields when the global batch does not split over data x fsdp."""
  dp = data_parallel_size(mesh)
  if batch_size % dp:
    raise ConfigError(f"{field}={batch_size}: not divisible by the data-parallel mesh axes "
                      f"config.mesh.data={mesh.shape['data']} x config.mesh.fsdp={mesh.shape['fsdp']} = {dp}")
