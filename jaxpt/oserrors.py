"""One line for a failure that the operating system caused, its errno leading: `ENOSPC: No space left on device`.

Libraries wrap OS errors in messages of their own (tensorstore's run to hundreds of characters, with the path and
the OS error code at the end: `... [os_error_code='27']`; orbax re-raises them as ValueError or RuntimeError). Where
the cause is, and whether it survives a cut of the message, must not depend on how long the path is, so the cause is
found in the error itself (its errno, a chained OSError's, or the code written in the message) and put first.

    describe(OSError(28, "No space left on device", "/w/x"))   # "ENOSPC: No space left on device: /w/x"
    describe(ValueError("Error writing ... [os_error_code='27']"))
                                                    # "EFBIG: File too large (ValueError: Error writing ...)"

`writing(path, temporary)` turns such a library error, raised while writing `path`, into OSError(errno, strerror,
path), which the CLI prints as that one line, and removes the attempt's temporary file or folder.

This module imports nothing from jaxpt.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from typing import Iterator

_CODE_IN_MESSAGE = re.compile(r"os_error_code\W{0,3}(\d+)")  # tensorstore: [os_error_code='27'] / =27
# Failures to write, which libraries may report as text only (TFDS / array_record: 'write() failed: No space left on
# device; writing <path>'): the C library's words for them, which the OS error's own strerror repeats.
_WORDS_IN_MESSAGE = {os.strerror(code): code for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)}
_DETAIL_CHARS = 240  # how much of the wrapping library's first line follows the cause


def errno_of(error: BaseException) -> int | None:
  """The OS error number behind `error`: its own errno, that of an exception it was raised from or while handling,
  the `os_error_code` tensorstore writes into its message, or the words of a failed write (ENOSPC's 'No space left
  on device', EDQUOT, EFBIG, EROFS) in its message; None when no OS error is behind it."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno:
      return error.errno
    match = _CODE_IN_MESSAGE.search(str(error))
    if match and int(match[1]) in errno.errorcode:
      return int(match[1])
    code = next((code for words, code in _WORDS_IN_MESSAGE.items() if words in str(error)), None)
    if code is not None:
      return code
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


@contextlib.contextmanager
def writing(path: str, temporary: str | None = None) -> Iterator[None]:
  """Around the writing of `path` (through a library, or into `temporary`, this attempt's file or folder that is
  renamed to `path` once complete), so that a full disk is one line naming the cause and `path` and leaves nothing:
  an OSError naming no file (Python's file writes) and a library's error behind which a failed write is found
  (TFDS's RuntimeError 'Failed to finalize writing of split ...: No space left on device') leave as
  OSError(errno, strerror, path), raised from it; other errors (an OSError naming its file, a config error) pass
  unchanged. Any failure removes `temporary`."""
  try:
    yield
  except BaseException as e:
    if temporary is not None:
      if os.path.isdir(temporary):
        shutil.rmtree(temporary, ignore_errors=True)
      else:
        with contextlib.suppress(OSError):  # never made, or not removable: the error that matters is `e`
          os.remove(temporary)
    if isinstance(e, OSError) and e.errno and e.filename is None:
      raise OSError(e.errno, os.strerror(e.errno), path) from e
    code = errno_of(e) if isinstance(e, Exception) and not isinstance(e, OSError) else None
    if code in _WORDS_IN_MESSAGE.values():
      raise OSError(code, os.strerror(code), path) from e
    raise


def write_atomically(path: str, data: str | bytes) -> None:
  """Writes `data` to `path` whole or not at all: into a temporary beside it, renamed over `path` once complete (a
  kill leaves the old file); a failure (a full disk: one line naming the cause and `path`) leaves no temporary."""
  temporary = f"{path}.tmp{os.getpid()}"
  with writing(path, temporary=temporary), open(temporary, "wb" if isinstance(data, bytes) else "w") as f:
    f.write(data)
  os.replace(temporary, path)
