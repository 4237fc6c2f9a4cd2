"""Losses registered by name, so a config can pick one (`config.loss.name`).

A loss is a pure function of arrays returning `(loss, metrics)`; this module imports no model, train or data code.
"""

from __future__ import annotations

from typing import Callable, Dict

LossFn = Callable[..., tuple]

_LOSSES: Dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
  """Decorator: `@register_loss('lm_cross_entropy')` makes the function available as `get_loss(name)`."""

  def decorator(fn: LossFn) -> LossFn:
    if name in _LOSSES and _LOSSES[name] is not fn:
      raise ValueError(f"loss {name!r} is already registered by {_LOSSES[name].__module__}")
    _LOSSES[name] = fn
    return fn

  return decorator


def get_loss(name: str) -> LossFn:
  """Returns the loss registered as `name`; the KeyError lists the known names."""
  if name not in _LOSSES:
    raise KeyError(f"unknown loss {name!r} (known: {', '.join(known_losses()) or 'none'})")
  return _LOSSES[name]


def known_losses() -> list[str]:
  return sorted(_LOSSES)
