"""One small registry type: named things a config can pick (losses of one kind, advantages, biases, blocks, norms,
sharding rules). Imports nothing from jaxpt, so every layer may hold one.

    ADVANTAGES = Registry("advantage estimator")

    @ADVANTAGES.register("grpo")
    def grpo_advantages(...): ...

    ADVANTAGES.get("grpo")   # KeyError: "unknown advantage estimator 'ppo' (known: drgrpo, grpo, ...)"
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
  """Name -> object, in registration order. `what` names the kind of thing in error messages."""

  def __init__(self, what: str):
    self.what = what
    self._items: dict[str, T] = {}

  def add(self, name: str, item: T) -> T:
    """Registers `item` as `name`; ValueError if another object already has that name."""
    if name in self._items and self._items[name] is not item:
      raise ValueError(f"{self.what} {name!r} is already registered (by {_owner(self._items[name])})")
    self._items[name] = item
    return item

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator form of `add`."""
    return lambda item: self.add(name, item)

  def get(self, name: str) -> T:
    """The object registered as `name`; KeyError naming the known names otherwise."""
    if name not in self._items:
      raise KeyError(f"unknown {self.what} {name!r} (known: {', '.join(self.names()) or 'none'})")
    return self._items[name]

  def names(self) -> tuple[str, ...]:
    return tuple(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self._items)

  def __len__(self) -> int:
    return len(self._items)


def _owner(item: object) -> str:
  return getattr(item, "__module__", None) or type(item).__name__
