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

QLoRA (`lora.base_quant` int8 | nf4, `jaxpt.nn.quant`): each adapted projection's frozen kernel is kept as codes
`kernel_q` (int8, or two NF4 codes a byte) and float32 absmax scales `kernel_scale`, one per block of
`lora.base_quant_block` inputs along the kernel's last input axis (embed for q / k / v / mlp_in, mlp for mlp_out,
head_dim for o), dequantized inside `Dense`'s matmul (W~ -> compute dtype -> dot). Both keep the kernel's logical
axes (the scales' blocked axis whole), so scan, remat and sharding work unchanged. Only the adapted kernels are
quantized (the default targets are all six projections, as in the paper); embeddings, norms and projections without
adapters stay in `base_dtype`. The base is quantized once, when the run gets it (`quantize_params`: init_from, or
the random init; an `hf:` checkpoint kernel by kernel as it streams in); the reference policy reads the same codes
(`base_spec`: the model with the quantized kernels and no adapters). qwix (google/qwix `_src/core/numerics.py`,
read, not installed here) has an 'nf4' qtype with the same 16-value table (a vmapped argmin, codes stored as
`jnp.uint4`), but its quantized arrays come with its interception of the model's dots, which failed here under
`nn.scan` (below); two params in `Dense` (codes packed two a byte, float32 scales) are what jaxpt's checkpoints,
sharding rules and `jaxpt plan` already read.

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
from jaxpt.nn.quant import QUANT_SCHEMES, Quant, dequantize, quantize

__all__ = ["ADAPTER_NAMES", "LORA_AXIS", "PROJECTIONS", "QUANT_NAMES", "LoRA", "LoRAConfig", "adapter_mask",
           "adapter_params", "base_params", "base_spec", "dequantize_params", "dequantized_layout", "lora_delta",
           "lora_scale", "merge_kernel", "merge_params", "quant_mask", "quantize_params", "replace_adapters",
           "resolve_targets", "with_adapters"]

PROJECTIONS = ("q", "k", "v", "o", "mlp_in", "mlp_out")
ADAPTER_NAMES = ("lora_a", "lora_b")  # the adapter params beside a projection's kernel
LORA_AXIS = "lora"  # the logical name of the rank axis (no rule splits it)
BASE_DTYPES = ("float32", "bfloat16")
QUANT_NAMES = ("kernel_q", "kernel_scale")  # a QLoRA projection's quantized kernel: codes and scales
BASE_QUANTS = ("none",) + QUANT_SCHEMES
ROLLOUT_PARAMS = ("auto", "merged", "unmerged")
ROLLOUTS_WITHOUT_LORA = ("chooses how RL rollouts read LoRA's params, and LoRA is off: set lora.rank > 0 or leave "
                         "lora.rollouts unset")


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


def merge_params(params: Any, scale: float, quant: Quant | None = None, dtype: Any = jnp.float32) -> Any:
  """The params tree with every adapted kernel replaced by W + s A B and the adapters dropped: the tree the same
  model without LoRA reads (a sampler, an export). With `quant` (QLoRA) W is the dequantized base, in `dtype`."""
  if quant is not None:
    params = dequantize_params(params, quant, dtype)
  if not isinstance(params, dict):
    return params
  if "lora_a" in params:
    rest = {k: merge_params(v, scale) for k, v in params.items() if k not in ADAPTER_NAMES}
    return dict(rest, kernel=merge_kernel(params["kernel"], params["lora_a"], params["lora_b"], scale))
  return {k: merge_params(v, scale) for k, v in params.items()}


def quantize_params(params: Any, quant: Quant) -> Any:
  """The params tree (float kernels, adapters beside the adapted ones) with each adapted kernel
  W [*lead, *in, *out] replaced by `kernel_q` and `kernel_scale`, blocked along its last input axis (`jaxpt.nn.quant`;
  lead: the stacked-layer axis of scanned params, or nothing)."""
  if not isinstance(params, dict):
    return params
  out = {k: quantize_params(v, quant) for k, v in params.items()}
  if "lora_a" in params and "kernel" in params:
    codes, scales = quantize(out.pop("kernel"), quant, params["lora_a"].ndim - 2)
    out.update(kernel_q=codes, kernel_scale=scales)
  return out


def dequantize_params(params: Any, quant: Quant, dtype: Any = jnp.float32) -> Any:
  """The params tree with every quantized kernel (`kernel_q`, `kernel_scale`) replaced by its float `kernel`
  W~ in `dtype`: the tree of the same model without quantization (adapters, if any, kept)."""
  if not isinstance(params, dict):
    return params
  out = {k: dequantize_params(v, quant, dtype) for k, v in params.items() if k not in QUANT_NAMES}
  if "kernel_q" in params:
    out["kernel"] = dequantize(params["kernel_q"], params["kernel_scale"], quant, dtype)
  return out


def base_params(params: Any) -> Any:
  """The params tree without its adapters (the same arrays, no copy): the base model, adapters off."""
  if not isinstance(params, dict):
    return params
  return {k: base_params(v) for k, v in params.items() if k not in ADAPTER_NAMES}


def with_adapters(base: Any, adapted: Any) -> Any:
  """`base` (a params tree without adapters) with the adapters of `adapted` (an adapted params tree, or only its
  `adapter_params`) put back beside their kernels (base's own leaves kept: a float base beside a QLoRA tree's adapters
  gives the float tree `quantize_params` takes)."""
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


def dequantized_layout(tree: Any) -> Any:
  """A tree shaped like quantized params (shardings, shapes) -> the same for the dequantized params: a quantized
  kernel's entry is its codes' (`kernel_q` keeps the kernel's logical axes, so its sharding is the kernel's)."""
  if not isinstance(tree, dict):
    return tree
  out = {k: dequantized_layout(v) for k, v in tree.items() if k not in QUANT_NAMES}
  if "kernel_q" in tree:
    out["kernel"] = tree["kernel_q"]
  return out


def quant_mask(params: Any) -> Any:
  """A tree of bools shaped like `params` (boxed or not): True at the quantized kernels' codes and scales."""

  def leaf(path, _):
    return any(getattr(key, "key", None) in QUANT_NAMES for key in path)

  return jax.tree_util.tree_map_with_path(leaf, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


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
  `deterministic` (dropout off) is set by the block that holds the projections. With `quant` (QLoRA) their frozen
  kernels are quantized; `adapters` False: the quantized base alone, adapters off (`base_spec`)."""

  rank: int
  scale: float
  dropout: float = 0.0
  targets: tuple[str, ...] = PROJECTIONS
  deterministic: bool = True
  quant: Quant | None = None
  adapters: bool = True

  def at(self, projection: str) -> "LoRA | None":
    """This LoRA for `projection` when it is a target, else None."""
    return self if projection in self.targets else None


def base_spec(lora: LoRA | None) -> LoRA | None:
  """The `lora` of the model that reads `base_params` (the base, adapters off): None (the plain model) unless the
  base is quantized, then the same targets' quantized kernels without adapters."""
  return None if lora is None or lora.quant is None else dataclasses.replace(lora, adapters=False, dropout=0.0)


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
    base_quant: QLoRA: none | int8 | nf4, the adapted projections' frozen kernels kept quantized (`jaxpt.nn.quant`),
      dequantized to the compute dtype inside their matmuls (the sampler's merged copy: to `base_dtype`); needs
      rank > 0.
    base_quant_block: B, the inputs per absmax scale along each quantized kernel's last input axis (embed, mlp or
      head_dim; B must divide them); float32 scales cost 32 / B bits per param.
    rollouts: the params an RL run's rollout sampler and its log-prob forwards (old policy, KL reference) read:
      merged (W + s A B, a float copy of the base made every step, read by the plain model) | unmerged (the base as
      it trains, QLoRA's codes dequantized inside each matmul, the adapters beside it; the reference: the same
      params with B = 0, exactly the base) | auto: unmerged with a quantized base, merged otherwise. Why: the merged
      copy of a quantized base is the float base the quantization saved (at 7B, ~14 GB in bf16 beside ~4 GB of nf4
      codes); a float base is held anyway. The price, at d512 on CPU (benchmarks/qlora_sampler.py): a decode step on
      the codes 1.17x a merged one, a 16-token rollout of 8 rows 1.32x the merge and the merged sampler's; the
      compiled sampler's peak 95 MiB against 145. Set with lora.rank 0 (LoRA off), it is an error (a command-line
      override even at auto: `jaxpt.engine.config.check_overrides`).
  """

  rank: int = 0
  alpha: float = 16.0
  dropout: float = 0.0
  targets: str = "q,k,v,o,mlp_in,mlp_out"
  rslora: bool = False
  base_dtype: str = "float32"
  init_adapter: str = ""
  base_quant: str = "none"
  base_quant_block: int = 64
  rollouts: str = "auto"

  def check(self) -> None:
    at_least(self, "rank", 0)
    in_range(self, "alpha", 0.0, low_open=True)
    in_range(self, "dropout", 0.0, 1.0, high_open=True)
    one_of(self, "base_dtype", BASE_DTYPES)
    one_of(self, "base_quant", BASE_QUANTS)
    one_of(self, "rollouts", ROLLOUT_PARAMS)
    if self.rollouts != "auto" and not self.enabled:
      raise ConfigError("rollouts", ROLLOUTS_WITHOUT_LORA, self.rollouts)
    if self.base_quant != "none" and not self.enabled:
      raise ConfigError("base_quant", "a quantized base is frozen: it needs adapters to train (set lora.rank > 0; "
                        "full fine-tuning keeps float params)", self.base_quant)
    if self.quant is not None and self.base_quant_block <= self.quant.pack:
      raise ConfigError("base_quant_block", f"must be more than {self.quant.pack} for {self.base_quant}",
                        self.base_quant_block)
    if self.base_quant == "nf4" and self.base_quant_block % 2:
      raise ConfigError("base_quant_block", "must be even for nf4 (two codes a byte)", self.base_quant_block)
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

  @property
  def samples_unmerged(self) -> bool:
    """Whether an RL run's rollouts read the unmerged params (`rollouts`, auto resolved); False without LoRA."""
    return self.enabled and (self.rollouts == "unmerged" or (self.rollouts == "auto" and self.quant is not None))

  @property
  def quant(self) -> Quant | None:
    """The quantization of the frozen base (None: float)."""
    return None if self.base_quant == "none" else Quant(self.base_quant, self.base_quant_block)

  def spec(self) -> LoRA | None:
    """The model's `LoRA` (None when rank is 0)."""
    if not self.enabled:
      return None
    return LoRA(self.rank, self.scale, self.dropout, resolve_targets(self.targets), quant=self.quant)

  def base_spec(self) -> LoRA | None:
    """The `lora` of the model that reads the base alone, adapters off (`base_spec`)."""
    return base_spec(self.spec())

  def check_dims(self, dims: dict[str, tuple[int, int]], scheme_note: str = "",
                 blocked: dict[str, int] | None = None) -> None:
    """ConfigError naming `rank` when it exceeds min(k, n) of a targeted projection; `dims`: projection ->
    (k, n), absent for a projection the model lacks (MLP experts: ConfigError naming `targets`). With a quantized
    base, `blocked`: projection -> the size of its kernel's last input axis, which `base_quant_block` must divide."""
    if not self.enabled:
      return
    for name in resolve_targets(self.targets):
      if name not in dims:
        raise ConfigError("targets", f"projection {name!r} has no adapter in this model{scheme_note} (projections "
                          f"with adapters: {', '.join(dims)})", self.targets)
      k, n = dims[name]
      if self.rank > min(k, n):
        raise ConfigError("rank", f"larger than the dims of projection {name!r} ({k} -> {n})", self.rank)
      if self.quant is not None and blocked is not None and blocked[name] % self.base_quant_block:
        raise ConfigError("base_quant_block", f"must divide projection {name!r}'s blocked input axis "
                          f"({blocked[name]}: embed, mlp or head_dim)", self.base_quant_block)
