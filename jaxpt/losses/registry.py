"""Losses registered BY KIND, so a config can pick one by name among the losses its trainer can call.

Kinds (one `Registry` each) and the call each kind's losses share:
  lm:          f(logits [B, S, V], targets [B, S], weights [B, S], **kw) -> (loss, metrics)
  preference:  reward-model / DPO losses on per-pair scores (signatures differ: see `jaxpt.losses.preference`)
  policy:      f(logp [B, T], old_logp [B, T], advantages [B], mask [B, T], **kw) -> (loss, metrics)
  contrastive: f(z [N, D], labels [N], group_ids [N], rng=None, **kw) -> (loss, metrics)
  value:       f(values [B, T], old_values [B, T], returns [B, T], mask [B, T], **kw) -> (loss, metrics)  (critics)
A name lives in exactly one kind; `get_loss(kind, name)` of a name registered under another kind is a KeyError
naming both kinds. A loss is a pure function of arrays returning `(loss, metrics)`; this module imports no model,
train or data code.
"""

from __future__ import annotations

from typing import Callable

from jaxpt.registry import Registry

__all__ = ["LOSS_KINDS", "LossFn", "get_loss", "known_losses", "loss_kind", "register_loss"]

LossFn = Callable[..., tuple]

LOSS_KINDS = ("lm", "preference", "policy", "contrastive", "value")

_KINDS: Registry[Registry[LossFn]] = Registry("loss kind")
for _kind in LOSS_KINDS:
  _KINDS.add(_kind, Registry(f"{_kind} loss"))


def register_loss(kind: str, name: str) -> Callable[[LossFn], LossFn]:
  """Decorator: `@register_loss("lm", "lm_cross_entropy")` makes the function `get_loss("lm", name)`.

  ValueError if `name` is taken, by another function of this kind or by any loss of another kind.
  """
  registry = _KINDS.get(kind)
  for other in LOSS_KINDS:
    if other != kind and name in _KINDS.get(other):
      raise ValueError(f"loss {name!r} is already registered as a {other} loss; it cannot also be a {kind} loss")
  return registry.register(name)


def get_loss(kind: str, name: str) -> LossFn:
  """The `kind` loss registered as `name`; KeyError naming the kind's losses (and the kind `name` has, if any)."""
  registry = _KINDS.get(kind)
  if name not in registry:
    owner = next((k for k in LOSS_KINDS if name in _KINDS.get(k)), None)
    if owner is not None:
      raise KeyError(f"{name!r} is a {owner} loss, not a {kind} loss "
                     f"({kind} losses: {', '.join(registry.names()) or 'none'})")
  return registry.get(name)


def known_losses(kind: str) -> tuple[str, ...]:
  """Names of the `kind` losses, in registration order."""
  return _KINDS.get(kind).names()


def loss_kind(name: str) -> str:
  """The kind `name` is registered under; KeyError listing every loss if none."""
  for kind in LOSS_KINDS:
    if name in _KINDS.get(kind):
      return kind
  known = "; ".join(f"{kind}: {', '.join(known_losses(kind)) or 'none'}" for kind in LOSS_KINDS)
  raise KeyError(f"unknown loss {name!r} (known: {known})")
