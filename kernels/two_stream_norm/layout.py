"""Tiling plan for the row-wise two-stream-norm kernels: padding, block sizes, backend and compiler params.

Every kernel works on `[rows_pad, d_pad]` row arrays split into `grid = rows_pad // block_rows` row blocks; a
program walks its block in `block_rows // chunk_rows` chunks of `[chunk_rows, d_pad]`, so per-block partial sums
(norm-weight gradients) stay few even when a chunk is small (GPU registers).

- TPU (Mosaic): d padded to a multiple of 128, rows to a multiple of the block (itself a multiple of 8);
  VMEM limit set from the block footprint.
- GPU (Triton): d padded to a power of two (Triton block shapes), chunks of ~8k elements.
- anything else: `interpret=True` with the TPU tiling, so CPU tests run the same padding and masking.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

LANES = 128
SUBLANES = 8
SLOTS = 8  # rows of the packed parameter array / columns of the packed statistics array


def round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def pow2_floor(n: int) -> int:
  return 1 << max(0, int(n).bit_length() - 1)


def pow2_ceil(n: int) -> int:
  return 1 << max(0, int(n - 1).bit_length())


def resolve_platform(platform: str | None = None) -> str:
  """'tpu', 'gpu' or 'interpret' (any other backend): `platform` overrides the default backend."""
  name = platform or jax.default_backend()
  if name == "tpu":
    return "tpu"
  if name in ("gpu", "cuda", "rocm"):
    return "gpu"
  return "interpret"


@dataclasses.dataclass(frozen=True)
class Plan:
  rows: int
  d: int
  rows_pad: int
  d_pad: int
  block_rows: int
  chunk_rows: int
  platform: str
  num_warps: int | None = None  # GPU: Triton warps per program (None: by chunk size, `compiler_params`)

  @property
  def grid(self) -> int:
    return self.rows_pad // self.block_rows

  @property
  def chunks(self) -> int:
    return self.block_rows // self.chunk_rows

  @property
  def padded(self) -> bool:
    return self.rows_pad != self.rows or self.d_pad != self.d


def make_plan(rows: int, d: int, platform: str | None = None, block_rows: int | None = None,
              chunk_rows: int | None = None, itemsize: int = 4, num_warps: int | None = None) -> Plan:
  """Block sizes for `[rows, d]` row arrays; explicit `block_rows`/`chunk_rows`/`num_warps` override (tests,
  tuning on a device).

  On TPU the row tiling follows the dtype's native sublane packing: 8 rows for 4-byte, 16 for 2-byte items."""
  platform = resolve_platform(platform)
  sublanes = SUBLANES * max(1, 4 // itemsize)
  if platform == "gpu":
    d_pad = pow2_ceil(max(d, 16))
    chunk = chunk_rows or max(1, pow2_floor(8192 // d_pad))
    block = block_rows or chunk * min(32, pow2_ceil(-(-rows // chunk)))
  else:
    d_pad = round_up(d, LANES)
    chunk = chunk_rows or int(min(512, max(sublanes, pow2_floor((256 * 1024) // d_pad))))
    chunk = min(chunk, round_up(rows, sublanes))
    block = block_rows or chunk
  if block % chunk:
    raise ValueError(f"block_rows={block} is not a multiple of chunk_rows={chunk}")
  if platform != "gpu" and chunk % sublanes:
    raise ValueError(f"chunk_rows={chunk} must be a multiple of {sublanes} for the TPU tiling")
  return Plan(rows=rows, d=d, rows_pad=round_up(rows, block), d_pad=d_pad, block_rows=block, chunk_rows=chunk,
              platform=platform, num_warps=num_warps)


def pad_rows(a, plan: Plan):
  """`[rows, d] -> [rows_pad, d_pad]` with zeros (zero rows stay finite through every norm)."""
  if not plan.padded:
    return a
  return jnp.pad(a, ((0, plan.rows_pad - plan.rows), (0, plan.d_pad - plan.d)))


def unpad_rows(a, plan: Plan):
  return a[:plan.rows, :plan.d] if plan.padded else a


def pack_params(vectors, plan: Plan):
  """Up to SLOTS vectors (`[d]` or scalars, broadcast) -> float32 `[SLOTS, d_pad]`, zeros elsewhere."""
  rows = []
  for v in vectors:
    v = jnp.broadcast_to(jnp.asarray(v, jnp.float32), (plan.d,))
    rows.append(jnp.pad(v, (0, plan.d_pad - plan.d)))
  rows += [jnp.zeros((plan.d_pad,), jnp.float32)] * (SLOTS - len(rows))
  return jnp.stack(rows)


def compiler_params(plan: Plan, row_arrays: int, itemsize: int, temporaries: int = 12) -> dict:
  """`pallas_call` keyword arguments for the plan's backend (interpret / Mosaic TPU / Triton)."""
  if plan.platform == "interpret":
    return {"interpret": True}
  if plan.platform == "tpu":
    from jax.experimental.pallas import tpu as pltpu
    block = plan.block_rows * plan.d_pad
    footprint = 2 * row_arrays * block * itemsize + temporaries * plan.chunk_rows * plan.d_pad * 4
    footprint += 4 * SLOTS * plan.d_pad * 4 + 4 * plan.block_rows * LANES * 4
    limit = int(min(100 * 2 ** 20, max(32 * 2 ** 20, 1.5 * footprint)))
    return {"compiler_params": pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=limit)}
  from jax.experimental.pallas import triton as pltr
  warps = plan.num_warps or (4 if plan.chunk_rows * plan.d_pad <= 4096 else 8)
  return {"compiler_params": pltr.CompilerParams(num_warps=warps, num_stages=1)}


def block_spec(kind: str, plan: Plan):
  """BlockSpecs by role: a row array `[rows_pad, d_pad]`, row statistics `[rows_pad, SLOTS]`, the packed
  parameters `[SLOTS, d_pad]` (whole, every program) and per-block partial sums `[grid, SLOTS, d_pad]`."""
  from jax.experimental import pallas as pl
  if kind == "row":
    return pl.BlockSpec((plan.block_rows, plan.d_pad), lambda i: (i, 0))
  if kind == "stats":
    return pl.BlockSpec((plan.block_rows, SLOTS), lambda i: (i, 0))
  if kind == "params":
    return pl.BlockSpec((SLOTS, plan.d_pad), lambda i: (0, 0))
  if kind == "partial":
    return pl.BlockSpec((pl.squeezed, SLOTS, plan.d_pad), lambda i: (i, 0, 0))
  raise ValueError(f"unknown block role {kind!r}")


def out_shape(kind: str, plan: Plan, dtype):
  shapes = {"row": (plan.rows_pad, plan.d_pad), "stats": (plan.rows_pad, SLOTS),
            "partial": (plan.grid, SLOTS, plan.d_pad)}
  return jax.ShapeDtypeStruct(shapes[kind], dtype)


def chunk_loop(plan: Plan, body, init):
  """Runs `body(rows, carry) -> carry` over the block's chunks; `rows` is the chunk's `pl.ds` row slice."""
  from jax.experimental import pallas as pl
  if plan.chunks == 1:
    return body(pl.ds(0, plan.chunk_rows), init)

  def step(k, carry):
    start = pl.multiple_of(k * plan.chunk_rows, plan.chunk_rows)
    return body(pl.ds(start, plan.chunk_rows), carry)

  return jax.lax.fori_loop(0, plan.chunks, step, init)


def call(kernel, plan: Plan, inputs, in_roles, out_roles, out_dtypes, itemsize: int):
  """`pallas_call` over the plan's grid with BlockSpecs by role (see `block_spec`)."""
  from jax.experimental import pallas as pl
  row_arrays = sum(role == "row" for role in list(in_roles) + list(out_roles))
  return pl.pallas_call(
      kernel,
      out_shape=[out_shape(role, plan, dt) for role, dt in zip(out_roles, out_dtypes)],
      grid=(plan.grid,),
      in_specs=[block_spec(role, plan) for role in in_roles],
      out_specs=[block_spec(role, plan) for role in out_roles],
      **compiler_params(plan, row_arrays, itemsize),
  )(*inputs)
