"""How `jaxpt <subcommand>` tells what is wrong with a config file or a `--config.<field>` override, in one line,
before or after absl runs the file: the file's path and line (a missing file, a SyntaxError, an error raised while
it ran), or the unknown field with the closest one at its level.
"""

from __future__ import annotations

import difflib
import os
import re
import traceback

from jaxpt.config import describe_fields
from jaxpt.oserrors import describe

OVERRIDE = re.compile(r"--?(?:no)?config\.([^=]+)")  # a --config.<field>=value argument


def unknown_override(config_type: type | None, argv: list[str], error: BaseException) -> str:
  """`no config field 'modle' (did you mean 'model'?)`: the first `--config.<path>` override in `argv` that names
  no field of the run config `config_type`, with the closest field at that level."""
  known = {row.path for row in describe_fields(config_type)} if config_type is not None else set()
  for arg in argv[1:]:
    match = OVERRIDE.match(arg)
    if not match or match[1] in known:
      continue
    parts = match[1].split(".")
    depth = next(i for i in range(len(parts)) if ".".join(parts[:i + 1]) not in known)
    unknown, parent = ".".join(parts[:depth + 1]), ".".join(parts[:depth])
    siblings = [k for k in known if k.count(".") == depth and k.startswith(f"{parent}." if parent else "")]
    close = difflib.get_close_matches(unknown, siblings, n=1)
    return f"no config field {unknown!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
  lines = str(error.args[0] if error.args else error).splitlines() or [""]  # the config file lacks a field
  return f"no config field {lines[0].strip(chr(39) + chr(34) + chr(92))!r} in the config file"


def config_path(argv: list[str]) -> str | None:
  """The --config file named in `argv` (without a `:get_config argument` suffix), or None when none is."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1].split(":", 1)[0]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1].split(":", 1)[0]
  return None


def config_file_problem(path: str) -> tuple[int | None, str] | None:
  """(line or None, why) config file `path` cannot be run, found before absl runs it (whose own reports are a
  misleading TypeError or a traceback): it does not exist, is a directory, cannot be read (the OS cause), or is no
  Python (the SyntaxError's line and message); None when it compiles."""
  if not os.path.exists(path):
    return None, "does not exist"
  if not os.path.isfile(path):
    return None, "is a directory, not a file" if os.path.isdir(path) else "is not a regular file"
  try:
    with open(path, "rb") as f:
      compile(f.read(), path, "exec")
  except OSError as e:
    return None, describe(e)
  except SyntaxError as e:
    return e.lineno, f"{type(e).__name__}: {e.msg}"
  except ValueError as e:  # null bytes in the source
    return None, f"ValueError: {e}"
  return None


def raised_in_config_file(path: str, error: BaseException) -> tuple[int, str] | None:
  """(line, 'NameError: <first line>') for an error that running config file `path` raised: the innermost of the
  file's lines in the traceback of `error`, or of an error it was raised from or while handling (absl and
  ml_collections wrap them); None when no traceback passes through the file (e.g. an unknown override)."""
  target, seen, cause = os.path.abspath(path), set(), error
  while cause is not None and id(cause) not in seen:
    seen.add(id(cause))
    lines = [f.lineno for f in traceback.extract_tb(cause.__traceback__) if os.path.abspath(f.filename) == target]
    if lines:
      return lines[-1], describe(cause)
    cause = cause.__cause__ or cause.__context__
  return None
