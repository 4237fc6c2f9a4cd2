"""Validation of the `data` config section; every error names the field as `data.<field>`."""

from __future__ import annotations

import dataclasses
from typing import Any

_MISSING = object()
_FIELD_TYPES = {"path": str, "tfds_name": str, "tfds_text_key": str, "tfds_data_dir": str, "seq_len": int,
                "batch_size": int, "eval_batches": int, "eval_fraction": float, "max_corpus_bytes": int}


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """The validated, typed copy of a `data` ConfigDict (or any object with these attributes)."""

  path: str
  tfds_name: str
  tfds_text_key: str
  tfds_data_dir: str
  seq_len: int
  batch_size: int
  eval_batches: int
  eval_fraction: float
  max_corpus_bytes: int


def _field(config: Any, name: str, kind: type) -> Any:
  value = getattr(config, name, _MISSING)
  if value is _MISSING:
    raise ValueError(f"data.{name}: missing from the data config")
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if kind is str and value is None:
    value = ""
  if not isinstance(value, kind) or isinstance(value, bool):
    raise ValueError(f"data.{name} must be a {kind.__name__}, got {value!r}")
  return value


def validate(config: Any) -> DataSettings:
  """Checks the fields of a `data` config and returns them as `DataSettings`; raises ValueError naming the field."""
  settings = DataSettings(**{name: _field(config, name, kind) for name, kind in _FIELD_TYPES.items()})
  if settings.seq_len <= 1:
    raise ValueError(f"data.seq_len must be > 1, got {settings.seq_len}")
  if settings.batch_size <= 0:
    raise ValueError(f"data.batch_size must be > 0, got {settings.batch_size}")
  if settings.eval_batches < 0:
    raise ValueError(f"data.eval_batches must be >= 0, got {settings.eval_batches}")
  if not 0.0 < settings.eval_fraction < 1.0:
    raise ValueError(f"data.eval_fraction must be in (0, 1), got {settings.eval_fraction}")
  if settings.max_corpus_bytes <= 0:
    raise ValueError(f"data.max_corpus_bytes must be > 0, got {settings.max_corpus_bytes}")
  if settings.tfds_name and not settings.tfds_text_key:
    raise ValueError("data.tfds_text_key must name the text feature when data.tfds_name is set")
  return settings
