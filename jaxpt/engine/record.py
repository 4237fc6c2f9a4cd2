"""The run record of a workdir: which config and inputs its checkpoints were trained with, checked at every launch.

    workdir/config.json           the config the checkpoints continue from (rewritten only once a launch is accepted)
    workdir/config_history.jsonl  one row per launch (time, host, step resumed from, the changes accepted, the
                                  config and its inputs' digests); appended, never rewritten

config.json's top-level `"trainer"` key names the trainer that made the run (`jaxpt.engine.trainers`); a launch of
another trainer into a workdir holding a checkpoint is refused, whatever `allow_changes` says (a run recorded before
the key was written is classified by the legacy rule, `trainers.legacy_trainer`).

A launch into a workdir that holds a checkpoint resumes that run, so it must describe the same run. Fields that
only say how the run is watched or laid out (`FREE_FIELDS`: log/eval/checkpoint cadence, progress, on_nonfinite,
max_skipped_steps, the mesh) may change freely. Any other difference (model, optim, data, loss, steps, seed, ... and
the `inputs`: digests of the training corpus and of the tokenizer) fails before any work with one line listing the
fields, unless the launch names them in the run config's `allow_changes` ('steps,optim.learning_rate', or whole
sections: 'optim', 'inputs'); the history records what was accepted. A field added to the config after a run was
recorded takes its default on resume, unless that default changes what the run does: the run config's
`recorded_before(recorded)` gives such a field the value the old run had (GRPO's `lora.rollouts`: 'merged'), so a
launch that changes it is refused like any other change. A workdir without a checkpoint starts afresh:
any config is accepted (and recorded).

    check_launch(workdir, config)                  # early, before data work (config fields only)
    record_launch(workdir, config, inputs)         # once the inputs are known and the checkpoint restored (the
                                                   # training loop's `record`): check again, then record
    recorded_config(workdir)                       # config.json as a dict (NoRunRecord: one line)
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import socket
from typing import Any, Mapping

import jax

from jaxpt.config import ConfigError, as_dict
from jaxpt.data.tokenizer import save_tokenizer
from jaxpt.oserrors import write_atomically
from jaxpt.engine.trainers import TRAINER_KEY, TRAINERS, recorded_trainer, trainer_of

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
INPUTS = ("corpus", "tokenizer", "images")  # what a record's `inputs` may hold (digests)
FREE_FIELDS = ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "async_checkpoints", "progress",
               "on_nonfinite", "max_skipped_steps", "mesh", "allow_changes")


class RunMismatch(ConfigError):
  """A launch would resume a run whose recorded config or inputs differ, and `allow_changes` does not name them."""


class NoRunRecord(ValueError):
  """A workdir without a readable run record (no config.json, or not a JSON object there): one line."""


def recorded_config(workdir: str) -> dict:
  """The run config recorded in `workdir/config.json` (NoRunRecord when there is none or it is unreadable)."""
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    with open(path) as f:
      recorded = json.load(f)
  except FileNotFoundError:
    raise NoRunRecord(f"{workdir}: no {CONFIG_FILE} there (not the workdir of a jaxpt run)") from None
  except (OSError, ValueError) as e:
    raise NoRunRecord(f"{path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
  if not isinstance(recorded, dict):
    raise NoRunRecord(f"{path}: not a run config (a JSON object)")
  return recorded


def digest(text: str | bytes) -> str:
  """A short content digest (16 hex digits of SHA-256) for the `inputs` of a record."""
  return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


def run_inputs(corpus_id: str, tokenizer: Any) -> dict[str, str]:
  """A run's `inputs`: digests of its training corpus's identity (content-based) and of its tokenizer model."""
  return {"corpus": digest(corpus_id), "tokenizer": digest(tokenizer.model_proto)}


def resumes(workdir: str) -> bool:
  """Whether a launch into `workdir` resumes a run (it holds a committed checkpoint)."""
  return bool(checkpoint_steps(workdir))


def run_lm_key(workdir: str) -> str | None:
  """The params key under which the checkpoints of the run in `workdir` hold its language model (`Trainer.lm_key`:
  'policy' for a PPO run), or None: its params are the model, or it has no readable record or an unknown trainer
  (whose params the restore itself checks)."""
  try:
    name = recorded_trainer(recorded_config(os.path.expanduser(workdir)))
  except NoRunRecord:
    return None
  return TRAINERS.get(name).lm_key if name in TRAINERS else None


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the committed checkpoints in `workdir/checkpoints` (no orbax involved), ascending."""
  try:
    names = os.listdir(os.path.join(workdir, "checkpoints"))
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(n) for n in names if n.isdigit())


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def _as_json(config: Any) -> dict:
  """A run-config dataclass (or an already JSON-able dict) as the JSON dict config.json holds: a registered
  trainer's run config leads with its `"trainer": name`."""
  trainer = trainer_of(type(config))
  config = as_dict(config) if dataclasses.is_dataclass(config) else dict(config)
  named = {TRAINER_KEY: trainer.name, **config} if trainer is not None else config
  return json.loads(json.dumps(named))  # tuples -> lists, as they read back from the file


def _covered(field: str, names: tuple[str, ...]) -> bool:
  """Whether `field` ('optim.learning_rate') is one of `names` or inside a section named there ('optim')."""
  return any(field == name or field.startswith(f"{name}.") for name in names)


def _recorded(workdir: str) -> dict | None:
  """The last accepted launch: the last history row, else (a workdir from before histories) config.json."""
  history = os.path.join(workdir, HISTORY_FILE)
  if os.path.exists(history):
    with open(history) as f:
      rows = [line for line in f if line.strip()]
    for line in reversed(rows):
      try:
        return json.loads(line)
      except ValueError:  # a row cut by a kill mid-write: the one before it holds
        continue
  config_file = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(config_file):
    with open(config_file) as f:
      return {"config": json.load(f), "inputs": {}}
  return None


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list]:
  """{dotted field: [recorded, now]} for the fields both sides have and that differ."""
  return {k: [before[k], after[k]] for k in sorted(before.keys() & after.keys()) if before[k] != after[k]}


def _allowed_names(config: Any) -> tuple[str, ...]:
  return tuple(name.strip() for name in str(getattr(config, "allow_changes", "") or "").split(",") if name.strip())


def check_launch(workdir: str, config: Any, inputs: Mapping[str, str] | None = None) -> dict[str, list]:
  """The changes this launch makes to the run recorded in `workdir` ({field: [recorded, now]}; {} when the
  workdir holds no checkpoint, i.e. the run starts afresh). `inputs` may hold only the digests known so far (an
  early check); only those are compared. Raises RunMismatch (one line listing the fields)
  when a checkpoint exists and a field outside FREE_FIELDS differs without being named in
  `config.allow_changes`, and ConfigError when `allow_changes` names a field that does not exist."""
  current = _flatten({"config": _as_json(config), "inputs": dict(inputs or {})})
  allowed = _allowed_names(config)
  known = [k.split(".", 1)[1] for k in current if k.startswith("config.") and k != f"config.{TRAINER_KEY}"]
  known += [f"inputs.{n}" for n in INPUTS]
  for name in allowed:
    if not any(_covered(field, (name,)) for field in known):
      raise ConfigError("config.allow_changes", f"names {name!r}, which is neither a config field or section nor "
                        f"one of {', '.join(f'inputs.{n}' for n in INPUTS)}", ",".join(allowed))
  recorded = _recorded(workdir)
  if not checkpoint_steps(workdir) or recorded is None:
    return {}
  _check_same_trainer(workdir, recorded.get("config", {}), config)
  before = _flatten({"config": recorded.get("config", {}), "inputs": recorded.get("inputs", {})})
  before.update({f"config.{k}": v for k, v in _recorded_before(config, recorded.get("config", {})).items()
                 if f"config.{k}" not in before})
  changes = {k.split(".", 1)[1] if k.startswith("config.") else k: v for k, v in _changes(before, current).items()}
  changes = {k: v for k, v in changes.items() if not _covered(k, FREE_FIELDS)}
  refused = {k: v for k, v in changes.items() if not _covered(k, allowed)}
  if refused:
    listed = ", ".join(f"{k} ({_short(v[0])} -> {_short(v[1])})" for k, v in refused.items())
    raise RunMismatch(
        "config.allow_changes", f"{workdir} holds a checkpoint of a run with other settings: {listed}. Resume it "
        f"unchanged, pass --config.allow_changes={','.join(refused)} to continue it with the new values "
        "(recorded in config_history.jsonl), or use another --workdir")
  return changes


def _recorded_before(config: Any, recorded: Any) -> dict[str, Any]:
  """{dotted field: value}: the fields added since `recorded` (a config.json) was written whose default would change
  what its run does, at the value that describes it (the run config's `recorded_before`; {} for a dict)."""
  fill = getattr(config, "recorded_before", None)
  return fill(recorded) if fill is not None and isinstance(recorded, Mapping) else {}


def _check_same_trainer(workdir: str, recorded: Mapping[str, Any], config: Any) -> None:
  """RunMismatch (one line naming both trainers) when `config` is another trainer's than the recorded run's."""
  trainer = trainer_of(type(config))
  if trainer is None or not isinstance(recorded, Mapping):
    return
  made_by = recorded_trainer(recorded)
  if made_by != trainer.name:
    raise RunMismatch("workdir", f"holds a checkpoint of a run with other settings: trainer ({made_by!r} -> "
                      f"{trainer.name!r}), which no allow_changes changes; resume it with jaxpt {made_by}, or use "
                      "another --workdir", workdir)


def _ends_with_newline(path: str) -> bool:
  with open(path, "rb") as f:
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


def _short(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else f"{text[:37]}..."


def record_launch(workdir: str, config: Any, inputs: Mapping[str, str], tokenizer: Any = None) -> dict[str, list]:
  """`check_launch` with the inputs known, then (process 0) appends the launch to config_history.jsonl, writes
  config.json and keeps the run's `tokenizer` in `workdir/tokenizer` if it is not there yet (a run built with
  another workdir's setup); returns the accepted changes. Call it after the data is prepared, before training."""
  changes = check_launch(workdir, config, inputs)
  if jax.process_index() != 0:
    return changes
  if tokenizer is not None:
    save_tokenizer(tokenizer, os.path.join(workdir, "tokenizer"))
  steps = checkpoint_steps(workdir)
  row = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "host": socket.gethostname(), "pid": os.getpid(), "resumed_from_step": steps[-1] if steps else None,
         "changes": changes, "config": _as_json(config), "inputs": dict(inputs)}
  os.makedirs(workdir, exist_ok=True)
  history = os.path.join(workdir, HISTORY_FILE)
  cut = os.path.exists(history) and os.path.getsize(history) and not _ends_with_newline(history)
  with open(history, "a") as f:
    f.write(("\n" if cut else "") + json.dumps(row) + "\n")  # after a row cut by a kill, start a new line
    f.flush()
    os.fsync(f.fileno())
  write_atomically(os.path.join(workdir, CONFIG_FILE), json.dumps(row["config"], indent=2))
  return changes
