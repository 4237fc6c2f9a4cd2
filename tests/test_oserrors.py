"""The OS cause of a failure leads its line, however the wrapping library words or cuts its message (issue 33)."""

import errno

import pytest

from jaxpt.oserrors import describe, errno_of, writing

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


TFDS_FULL_DISK = ('Failed to finalize writing of split "train": write() failed: No space left on device; writing '
                  '/w/tfds/x/incomplete.AB12_1.0.0/x-train.array_record-00000-of-00001; at byte 20480')


def test_a_failed_write_in_words_only_is_found():
  assert errno_of(RuntimeError(TFDS_FULL_DISK)) == errno.ENOSPC
  assert errno_of(RuntimeError("Disk quota exceeded")) == errno.EDQUOT
  assert errno_of(RuntimeError("no space left")) is None


@pytest.mark.parametrize("error", [RuntimeError(TFDS_FULL_DISK), OSError(errno.ENOSPC, "No space left on device")])
def test_writing_names_the_path_of_a_failure_that_named_none_and_removes_the_temporary(tmp_path, error):
  temporary = tmp_path / "cache.tmp1"
  temporary.mkdir()
  (temporary / "part.npy").write_bytes(b"x")
  with pytest.raises(OSError) as raised:
    with writing("/w/cache", temporary=str(temporary)):
      raise error
  assert describe(raised.value) == "ENOSPC: No space left on device: /w/cache"
  assert raised.value.__cause__ is error and not temporary.exists()


def test_writing_passes_other_errors_unchanged_and_removes_a_temporary_file(tmp_path):
  temporary = tmp_path / "model.tmp1"
  temporary.write_bytes(b"x")
  named = OSError(errno.EACCES, "Permission denied", "/corpus/a.txt")
  try:
    try:
      raise FileNotFoundError(errno.ENOENT, "No such file or directory")
    except OSError:
      raise KeyError("a config error that an OS error led to")  # noqa: B904
  except KeyError as e:
    chained = e
  for error in (named, chained, ValueError("bad")):
    with pytest.raises(type(error)) as raised:
      with writing("/w/model", temporary=str(temporary)):
        raise error
    assert raised.value is error
  assert not temporary.exists()
