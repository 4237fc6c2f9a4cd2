"""Start-up progress lines on stderr for the command line: `jaxpt pretrain: preparing data in W ...`.

Building a run takes seconds to minutes before the first step (data preparation, tokenizer training, compiling);
`say` tells the user which of them is under way. Only `jaxpt` commands turn it on (`enable`), so library callers
(tests, notebooks) stay quiet. In a multi-process run only process 0 speaks. This module imports nothing from jaxpt.
"""

from __future__ import annotations

import sys

_command: str | None = None


def enable(command: str | None) -> None:
  """`say` prints `jaxpt <command>: ...` lines from now on (None: it prints nothing)."""
  global _command
  _command = command


def say(message: str) -> None:
  """One flushed stderr line `jaxpt <command>: <message>` when enabled (process 0 only)."""
  if _command is None:
    return
  import jax

  if jax.process_index() == 0:
    print(f"jaxpt {_command}: {message}", file=sys.stderr, flush=True)
