"""Meshes, logical-axis -> mesh-axis rules, sharding helpers, multi-host start-up and memory reports.

Models name their axes logically; this package maps those names onto a (data, fsdp, tensor) device mesh.
"""

from jaxpt.parallel.distributed import initialize
from jaxpt.parallel.memory import compiled_memory, log_memory
from jaxpt.parallel.mesh import MeshConfig, check_global_batch, data_parallel_size, make_mesh, resolve_mesh_shape
from jaxpt.parallel.rules import DATA_AXES, MESH_AXES, RULES, get_rules, mesh_axes_used
from jaxpt.parallel.sharding import (MeshLayout, activation_sharding, all_rows, batch_sharding,
                                     check_param_divisibility, full_batch, global_batch, global_batches,
                                     param_shardings, process_batch_slice, process_rows, replicated, state_shardings,
                                     with_activation_sharding)

__all__ = ["DATA_AXES", "MESH_AXES", "MeshConfig", "MeshLayout", "RULES", "activation_sharding", "all_rows",
           "batch_sharding", "check_global_batch", "check_param_divisibility", "compiled_memory",
           "data_parallel_size", "full_batch", "get_rules", "global_batch", "global_batches", "initialize",
           "log_memory", "make_mesh", "mesh_axes_used", "param_shardings", "process_batch_slice", "process_rows",
           "replicated", "resolve_mesh_shape", "state_shardings", "with_activation_sharding"]
