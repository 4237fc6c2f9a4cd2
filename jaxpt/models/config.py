"""Model hyper-parameters: one frozen dataclass, validated once, with errors that name the field."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

NORM_SCHEMES = ("pre", "post", "hybrid", "siamese_post_pre", "siamese_hybrid_pre")
SIAMESE_SCHEMES = ("siamese_post_pre", "siamese_hybrid_pre")
NORM_TYPES = ("rmsnorm", "layernorm")
MLP_TYPES = ("swiglu", "gelu")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots")
KERNELS = ("reference", "pallas")


class ConfigError(ValueError):
  """A configuration value is impossible; the message names the field."""


def validated_from_dict(cls: type, values: Mapping[str, Any], prefix: str):
  """`cls(**values)` for a frozen config dataclass with a `validate(prefix)` method: unknown keys and invalid values
  raise ConfigError naming `<prefix>.<field>`."""
  check_known_fields(cls, values, prefix)
  config = cls(**dict(values))
  config.validate(prefix)
  return config


def check_known_fields(cls: type, values: Mapping[str, Any], prefix: str) -> None:
  """ConfigError naming `<prefix>.<field>` for the first key of `values` that is not a field of dataclass `cls`."""
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ConfigError(f"{prefix}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer LM.

  `norm_scheme` picks the residual scheme (see `jaxpt.nn.blocks`). `dtype` is the compute dtype; parameters are
  always kept in `param_dtype`. `head_dim` defaults to d_model // num_heads. `kernel` picks how the siamese
  schemes compute their sub-layer boundaries: `reference` (separate norm modules, XLA fuses what it can) or
  `pallas` (the fused two-stream-norm kernels in `kernels/two_stream_norm`; same parameters). The single-stream
  schemes have no fused boundary and ignore it. `attention_query_chunk` > 0 computes causal attention that many
  queries at a time, skipping the key blocks above the diagonal (same result; see `jaxpt.nn.attention`).
  """

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int | None = None
  mlp_dim: int = 512
  mlp_type: str = "swiglu"
  norm_type: str = "rmsnorm"
  norm_eps: float = 1e-5
  norm_scheme: str = "pre"
  qk_norm: bool = False
  v_norm: bool = False
  tie_embeddings: bool = True
  rope_theta: float = 10000.0
  attention_query_chunk: int = 64
  max_seq_len: int = 2048
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  dropout_rate: float = 0.0
  kernel: str = "reference"

  @classmethod
  def from_dict(cls, values: Mapping[str, Any], prefix: str = "model") -> "ModelConfig":
    return validated_from_dict(cls, values, prefix)

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  @property
  def is_siamese(self) -> bool:
    return self.norm_scheme in SIAMESE_SCHEMES

  def validate(self, prefix: str = "model") -> None:
    def fail(field: str, message: str) -> None:
      raise ConfigError(f"{prefix}.{field}={getattr(self, field)!r}: {message}")

    for field in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim", "max_seq_len"):
      if not isinstance(getattr(self, field), int) or getattr(self, field) <= 0:
        fail(field, "must be a positive integer")
    choices = {"norm_scheme": NORM_SCHEMES, "norm_type": NORM_TYPES, "mlp_type": MLP_TYPES, "dtype": DTYPES,
               "param_dtype": DTYPES, "remat": REMAT_POLICIES, "kernel": KERNELS}
    for field, allowed in choices.items():
      if getattr(self, field) not in allowed:
        fail(field, f"must be one of {', '.join(allowed)}")
    if self.head_dim is None and self.d_model % self.num_heads:
      fail("d_model", f"not divisible by model.num_heads={self.num_heads}")
    if self.head_dim is not None and self.head_dim <= 0:
      fail("head_dim", "must be a positive integer")
    if self.resolved_head_dim % 2:
      fail("head_dim" if self.head_dim else "d_model", "head dimension must be even for RoPE")
    if self.num_heads % self.num_kv_heads:
      fail("num_kv_heads", f"must divide model.num_heads={self.num_heads}")
    if not self.norm_eps > 0:
      fail("norm_eps", "must be positive")
    if not 0.0 <= self.dropout_rate < 1.0:
      fail("dropout_rate", "must be in [0, 1)")
    if not isinstance(self.attention_query_chunk, int) or self.attention_query_chunk < 0:
      fail("attention_query_chunk", "must be a non-negative integer (0: all queries at once)")
    if not self.rope_theta > 0:
      fail("rope_theta", "must be positive")
