"""Initialisers shared by the projection layers, annotated with logical axis names."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn


def dense_init(logical_axes: Sequence[str]):
  """Fan-in scaled truncated normal (variance 1/fan_in) with logical axis names for sharding.

  Flax's Dense/DenseGeneral call it on the flattened `[fan_in, fan_out]` kernel shape.
  """
  init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  return nn.with_logical_partitioning(init, tuple(logical_axes))
