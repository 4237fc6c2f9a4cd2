"""One line for a failure that the operating system caused, its errno leading: `ENOSPC: No space left on device`.

Libraries wrap OS errors in messages of their own (tensorstore's run to hundreds of characters, with the path and
the OS error code at the end: `... [os_error_code='27']`; orbax re-raises them as ValueError or RuntimeError). Where
the cause is, and whether it survives a cut of the message, must not depend on how long the path is, so the cause is
found in the error itself (its errno, a chained OSError's, or the code written in the message) and put first.

    describe(OSError(28, "No space left on device", "/w/x"))   # "ENOSPC: No space left on device: /w/x"
    describe(ValueError("Error writing ... [os_error_code='27']"))
                                                    # "EFBIG: File too large (ValueError: Error writing ...)"

This module imports nothing from jaxpt.
"""

from __future__ import annotations

import errno
import os
import re

_CODE_IN_MESSAGE = re.compile(r"os_error_code\W{0,3}(\d+)")  # tensorstore: [os_error_code='27'] / =27
_DETAIL_CHARS = 240  # how much of the wrapping library's first line follows the cause


def errno_of(error: BaseException) -> int | None:
  """The OS error number behind `error`: its own errno, that of an exception it was raised from or while handling,
  or the `os_error_code` tensorstore writes into its message; None when no OS error is behind it."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno:
      return error.errno
    match = _CODE_IN_MESSAGE.search(str(error))
    if match and int(match[1]) in errno.errorcode:
      return int(match[1])
    error = error.__cause__ or error.__context__
  return None


def os_cause(code: int) -> str:
  """'ENOSPC: No space left on device' for errno `code`."""
  return f"{errno.errorcode.get(code, f'errno {code}')}: {os.strerror(code)}"


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  line = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
  return line if len(line) <= _DETAIL_CHARS else f"{line[:_DETAIL_CHARS - 3]}..."


def describe(error: BaseException) -> str:
  """One line for `error`, the OS cause first when there is one:
  an OSError -> 'EACCES: Permission denied: /path' (its file names follow: 'src -> dst' for a rename);
  a library error wrapping one -> 'EFBIG: File too large (ValueError: <its first line, cut>)';
  anything else -> 'ValueError: <its first line, cut>'."""
  code = errno_of(error)
  if code is None:
    return _first_line(error)
  if isinstance(error, OSError) and error.errno == code:
    names = " -> ".join(str(n) for n in (error.filename, error.filename2) if n is not None)
    return f"{os_cause(code)}: {names}" if names else os_cause(code)
  return f"{os_cause(code)} ({_first_line(error)})"
