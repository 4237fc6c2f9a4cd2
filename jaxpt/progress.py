"""Start-up progress lines on stderr for the command line: `jaxpt pretrain: preparing data in W ...`.

Building a run takes seconds to minutes before the first step (data preparation, tokenizer training, compiling);
`say` tells the user which of them is under way. Only `jaxpt` commands turn it on (`enable`), so library callers
(tests, notebooks) stay quiet. In a multi-process run only process 0 speaks. `doing()` is the stage under way (the
last `say`, or `set_doing`), for the line the CLI prints when a signal stops a command outside the training loop.
This module imports nothing from jaxpt.
"""

from __future__ import annotations

import sys

_command: str | None = None
_doing = "starting up"


def enable(command: str | None) -> None:
  """`say` prints `jaxpt <command>: ...` lines from now on (None: it prints nothing)."""
  global _command
  _command = command


def set_doing(what: str) -> None:
  """The stage under way is `what` (e.g. 'preparing data in W'), without printing it."""
  global _doing
  _doing = what


def doing() -> str:
  """The stage under way: the last `say`'s message (less its trailing ' ...') or `set_doing`'s, else 'starting up'."""
  return _doing


def say(message: str) -> None:
  """One flushed stderr line `jaxpt <command>: <message>` when enabled (process 0 only); `message` is the stage
  under way from now on (`doing`)."""
  set_doing(message.removesuffix(" ..."))
  if _command is None:
    return
  import jax

  if jax.process_index() == 0:
    print(f"jaxpt {_command}: {message}", file=sys.stderr, flush=True)
