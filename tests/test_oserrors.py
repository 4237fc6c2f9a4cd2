"""The OS cause of a failure leads its line, however the wrapping library words or cuts its message (issue 33)."""

import errno

import pytest

from jaxpt.oserrors import describe, errno_of

TENSORSTORE_LIKE = ("Error writing local file \"{path}/checkpoints/2/state/d/abc\": Failed to write "
                    "{{\"driver\":\"zarr3\",\"store_data_equal_to_fill_value\":true}}'] [os_error_code='{code}']")


@pytest.mark.parametrize("path_length", [10, 400, 4000])
def test_a_code_at_the_end_of_a_long_library_message_leads_the_line(path_length):
  """The flake the issue names: whether 'File too large' survived depended on the length of the path."""
  error = ValueError(TENSORSTORE_LIKE.format(path="/w" + "x" * path_length, code=errno.EFBIG))
  line = describe(error)
  assert line.startswith("EFBIG: File too large (ValueError: Error writing local file ")
  assert len(line) < 300 and "\n" not in line


def test_an_oserror_names_its_cause_and_its_files():
  assert describe(OSError(errno.ENOSPC, "No space left on device", "/w/data/x")) == \
      "ENOSPC: No space left on device: /w/data/x"
  assert describe(OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")) == \
      "EXDEV: Invalid cross-device link: /a -> /b"


def test_an_os_error_a_library_error_was_raised_from_is_found():
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as e:
      raise RuntimeError("Failed to finalize writing of split \"train\"") from e
  except RuntimeError as wrapped:
    assert errno_of(wrapped) == errno.ENOSPC
    assert describe(wrapped) == "ENOSPC: No space left on device (RuntimeError: Failed to finalize writing of split " \
                                "\"train\")"


def test_an_error_without_an_os_cause_is_its_first_line():
  assert errno_of(ValueError("bad\nmore")) is None
  assert describe(ValueError("bad\nmore")) == "ValueError: bad"
  assert describe(ValueError("os_error_code='999999'")) == "ValueError: os_error_code='999999'"  # not an errno
