"""`snapshot(path)`: every file, folder and link under a path with its content's digest, to check that a refused
command left it byte-identical (issue 33: refused means untouched)."""

import hashlib
import os


def snapshot(path: str) -> dict[str, str]:
  """{relative path: 'file <sha256>' | 'dir' | 'link <target>'} of everything under `path` (hidden entries too);
  {} when it does not exist; a file at `path` itself is keyed '.'."""
  if os.path.islink(path):
    return {".": f"link {os.readlink(path)}"}
  if os.path.isfile(path):
    return {".": _file_digest(path)}
  tree = {}
  for folder, dirs, names in os.walk(path):
    for name in dirs + names:
      full = os.path.join(folder, name)
      relative = os.path.relpath(full, path)
      if os.path.islink(full):
        tree[relative] = f"link {os.readlink(full)}"
      elif os.path.isdir(full):
        tree[relative] = "dir"
      else:
        tree[relative] = _file_digest(full)
  return tree


def _file_digest(path: str) -> str:
  with open(path, "rb") as f:
    return f"file {hashlib.file_digest(f, 'sha256').hexdigest()}"
