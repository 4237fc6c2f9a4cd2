"""LoRA: trainable low-rank adapters beside frozen projections, as pure functions plus the `lora` config section.

For a projection `Dense` with kernel W [*in_shape, *out_shape] (flattened: [k, n]) and rank r:

    y = x W + s (dropout(x) A) B        A [*in_shape, r] (flattened [k, r]),  B [r, *out_shape] ([r, n])
    s = alpha / r                        (rsLoRA: s = alpha / sqrt(r))
    merged: W' = W + s A B               (the same y when dropout is off)

A starts kaiming-uniform as PEFT's (`kaiming_uniform_(a=sqrt(5))`: U(-1/sqrt(k), 1/sqrt(k))), B at 0, so an adapted
model starts equal to its base. A's logical axes are the kernel's in axes then `lora`, B's `lora` then the
kernel's out axes; no sharding rule names `lora`, so the rank axis stays whole and the other axes split as the
kernel's do (A along `embed` over fsdp, B along heads / mlp over tensor). The adapters of a projection live beside
its kernel: `.../query/lora_a`, `.../query/lora_b` (stacked `[layers, ...]` under `nn.scan` like every param).

The projections (`PROJECTIONS`): q, k, v, o (attention's query / key / value / out) and mlp_in (SwiGLU's wi_gate and
wi_up, GELU's wi), mlp_out (wo). `LoRA.at(name)` is what one projection gets (None: no adapter there).

Why not qwix (0.1.8, tunix's LoRA): tried on `TransformerLM` it gave adapters to the MLP kernels only (attention
kernels [d, heads, head_dim] are reshaped before their matmul, which qwix does not trace back to a param), failed
with `UnexpectedTracerError` under `nn.scan` (scan_layers=True, the default layout), and its interception would
also rewrite the `jnp.dot`s inside jaxpt's custom-VJP `matmul` (`jaxpt.nn.dense`). Here the adapter is two params
and two matmuls in `Dense`, so scan, remat, logical-axis sharding and every residual scheme work unchanged.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.config import ConfigError, Section, at_least, in_range, one_of

__all__ = ["ADAPTER_NAMES", "LORA_AXIS", "PROJECTIONS", "LoRA", "LoRAConfig", "adapter_mask", "adapter_params",
           "base_params", "lora_delta", "lora_scale", "merge_kernel", "merge_params", "replace_adapters",
           "resolve_targets", "with_adapters"]

PROJECTIONS = ("q", "k", "v", "o", "mlp_in", "mlp_out")
ADAPTER_NAMES = ("lora_a", "lora_b")  # the adapter params beside a projection's kernel
LORA_AXIS = "lora"  # the logical name of the rank axis (no rule splits it)
BASE_DTYPES = ("float32", "bfloat16")


def lora_scale(alpha: float, rank: int, rslora: bool = False) -> float:
  """s = alpha / r, or alpha / sqrt(r) with rsLoRA."""
  return alpha / (math.sqrt(rank) if rslora else rank)


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """s (x A) B for x [tokens, k], A [k, r], B [r, n] -> [tokens, n] (float32 accumulation, x's dtype)."""
  xa = jnp.dot(x, a.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)
  return (scale * jnp.dot(xa, b.astype(x.dtype), preferred_element_type=jnp.float32)).astype(x.dtype)


def merge_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """W + s A B in float32, cast to W's dtype: kernel [*lead, *in, *out], A [*lead, *in, r], B [*lead, r, *out];
  `lead` is the stacked-layer axis of scanned params (or nothing)."""
  lead = a.ndim + b.ndim - 2 - kernel.ndim
  shape_lead = kernel.shape[:lead]
  fan_in = math.prod(a.shape[lead:-1])
  a2 = a.reshape(shape_lead + (fan_in, a.shape[-1])).astype(jnp.float32)
  b2 = b.reshape(shape_lead + (b.shape[lead], -1)).astype(jnp.float32)
  delta = (scale * jnp.matmul(a2, b2)).reshape(kernel.shape)
  return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def merge_params(params: Any, scale: float) -> Any:
  """The params tree with every adapted kernel replaced by W + s A B and the adapters dropped: the tree the same
  model without LoRA reads (a sampler, an export)."""
  if not isinstance(params, dict):
    return params
  if "lora_a" in params:
    rest = {k: merge_params(v, scale) for k, v in params.items() if k not in ADAPTER_NAMES}
    return dict(rest, kernel=merge_kernel(params["kernel"], params["lora_a"], params["lora_b"], scale))
  return {k: merge_params(v, scale) for k, v in params.items()}


def base_params(params: Any) -> Any:
  """The params tree without its adapters (the same arrays, no copy): the base model, adapters off."""
  if not isinstance(params, dict):
    return params
  return {k: base_params(v) for k, v in params.items() if k not in ADAPTER_NAMES}


def with_adapters(base: Any, adapted: Any) -> Any:
  """`base` (a params tree without adapters) with the adapters of `adapted` (an adapted params tree, or only its
  `adapter_params`) put back beside their kernels."""
  if not isinstance(base, dict) or not isinstance(adapted, dict):
    return base
  out = {k: with_adapters(v, adapted.get(k)) for k, v in base.items()}
  out.update({k: v for k, v in adapted.items() if k in ADAPTER_NAMES})
  return out


def adapter_params(params: Any) -> Any:
  """The part of `params` (a dict tree) that leads to its adapter leaves (lora_a / lora_b), nothing else."""
  out = {}
  for key, value in params.items() if isinstance(params, dict) else ():
    sub = value if key in ADAPTER_NAMES else adapter_params(value)
    if not isinstance(sub, dict) or sub:
      out[key] = sub
  return out


def replace_adapters(params: Any, adapters: Any) -> Any:
  """`params` with each adapter leaf that `adapters` (an `adapter_params` tree) holds put in its place."""
  if not isinstance(params, dict) or not isinstance(adapters, dict):
    return params
  return {k: adapters[k] if k in ADAPTER_NAMES and k in adapters else replace_adapters(v, adapters.get(k))
          for k, v in params.items()}


def adapter_mask(params: Any) -> Any:
  """A tree of bools shaped like `params` (boxed or not): True at the adapter leaves."""

  def leaf(path, _):
    return any(getattr(key, "key", None) in ADAPTER_NAMES for key in path)

  return jax.tree_util.tree_map_with_path(leaf, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def kaiming_uniform_init(num_in_axes: int):
  """PEFT's A init: U(-1/sqrt(k), 1/sqrt(k)), k = the product of the first `num_in_axes` dims."""

  def init(key, shape, dtype=jnp.float32):
    bound = 1.0 / math.sqrt(math.prod(shape[:num_in_axes]))
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


@dataclasses.dataclass(frozen=True)
class LoRA:
  """What the model's projections get: rank r, scale s, adapter dropout, the projections adapted (`PROJECTIONS`);
  `deterministic` (dropout off) is set by the block that holds the projections."""

  rank: int
  scale: float
  dropout: float = 0.0
  targets: tuple[str, ...] = PROJECTIONS
  deterministic: bool = True

  def at(self, projection: str) -> "LoRA | None":
    """This LoRA for `projection` when it is a target, else None."""
    return self if projection in self.targets else None


def resolve_targets(targets: str) -> tuple[str, ...]:
  """The projections `targets` names: comma-separated names or regular expressions, each matched whole against
  `PROJECTIONS` ('q,v', 'mlp_.*', '.*'). ValueError for an item that is no valid expression or matches nothing."""
  found: set[str] = set()
  for item in (part.strip() for part in targets.split(",")):
    try:
      pattern = re.compile(item)
    except re.error as e:
      raise ValueError(f"{item!r} is not a regular expression ({e})") from None
    matched = {name for name in PROJECTIONS if pattern.fullmatch(name)}
    if not matched:
      raise ValueError(f"{item!r} matches no projection (projections: {', '.join(PROJECTIONS)})")
    found |= matched
  return tuple(name for name in PROJECTIONS if name in found)


@dataclasses.dataclass(frozen=True)
class LoRAConfig(Section):
  """The `lora` section: low-rank adapters on the model's projections; only they (and heads new to the run) train.

  Attributes:
    rank: r, the adapters' rank; 0 = off (every parameter trains).
    alpha: the adapters' scale is alpha / r (alpha / sqrt(r) with rslora).
    dropout: dropout on the adapters' input in training (0 = off).
    targets: the adapted projections, comma-separated names or regular expressions matched whole against q, k, v,
      o (attention's query, key, value, out), mlp_in (wi_gate and wi_up, or GELU's wi), mlp_out (wo).
    rslora: scale by alpha / sqrt(r) (rank-stabilised LoRA) instead of alpha / r.
    base_dtype: the dtype the frozen base params are kept in: float32 | bfloat16 (adapters stay float32).
    init_adapter: '' = fresh adapters (B = 0); or a PEFT adapter directory (adapter_config.json +
      adapter_model.safetensors, `jaxpt.models.hf_peft`) whose adapters start the run, over the base `init_from`
      gives; its r, lora_alpha, use_rslora, target_modules and lora_dropout fill rank, alpha, rslora, targets and
      dropout left at their defaults (a set rank, alpha, rslora or targets that contradicts them is an error).
  """

  rank: int = 0
  alpha: float = 16.0
  dropout: float = 0.0
  targets: str = "q,k,v,o,mlp_in,mlp_out"
  rslora: bool = False
  base_dtype: str = "float32"
  init_adapter: str = ""

  def check(self) -> None:
    at_least(self, "rank", 0)
    in_range(self, "alpha", 0.0, low_open=True)
    in_range(self, "dropout", 0.0, 1.0, high_open=True)
    one_of(self, "base_dtype", BASE_DTYPES)
    try:
      resolve_targets(self.targets)
    except ValueError as e:
      raise ConfigError("targets", str(e), self.targets) from None

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return lora_scale(self.alpha, self.rank, self.rslora)

  def spec(self) -> LoRA | None:
    """The model's `LoRA` (None when rank is 0)."""
    if not self.enabled:
      return None
    return LoRA(self.rank, self.scale, self.dropout, resolve_targets(self.targets))

  def check_dims(self, dims: dict[str, tuple[int, int]], scheme_note: str = "") -> None:
    """ConfigError naming `rank` when it exceeds min(k, n) of a targeted projection; `dims`: projection ->
    (k, n), absent for a projection the model lacks (MLP experts: ConfigError naming `targets`)."""
    if not self.enabled:
      return
    for name in resolve_targets(self.targets):
      if name not in dims:
        raise ConfigError("targets", f"projection {name!r} has no adapter in this model{scheme_note} (projections "
                          f"with adapters: {', '.join(dims)})", self.targets)
      k, n = dims[name]
      if self.rank > min(k, n):
        raise ConfigError("rank", f"larger than the dims of projection {name!r} ({k} -> {n})", self.rank)
