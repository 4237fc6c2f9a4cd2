"""`jaxpt <subcommand> --help` lists every config field from the run-config dataclasses (path, type, default,
meaning); every field has a meaning; an unknown `--config.<field>` override is one clean line."""

import dataclasses
import os
import re
import subprocess
import sys
import typing

import pytest

from jaxpt import cli
from jaxpt.cli_config import unknown_override
from jaxpt.config import Section, describe_fields, field_help
from jaxpt.config_fields import attributes_block
from jaxpt.engine.trainers import TRAINERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "configs", "tiny.py")


def _sections(cls):
  """`cls` and every section class nested in it."""
  yield cls
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(hints[field.name]):
      yield from _sections(hints[field.name])


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_config_field_has_a_one_line_meaning(name):
  """A new field without an entry in its section's `Attributes:` docstring block fails here."""
  rows = describe_fields(cli.SUBCOMMANDS[name].config_type)
  missing = [row.path for row in rows if not row.help.strip()]
  assert not missing, f"jaxpt {name}: fields without a meaning (add them to their section's `Attributes:`): {missing}"
  assert any(row.section for row in rows) and any("." in row.path for row in rows)  # nested sections included
  for cls in _sections(cli.SUBCOMMANDS[name].config_type):  # and no entry names a field that is gone
    for klass in cls.__mro__:
      if issubclass(klass, Section) and klass is not Section:
        stale = set(attributes_block(klass.__dict__.get("__doc__") or "")) - {f.name for f in dataclasses.fields(klass)}
        assert not stale, f"{klass.__name__}'s `Attributes:` names no field: {sorted(stale)}"


def test_field_help_reads_attributes_blocks_with_continuations_and_bases():
  @dataclasses.dataclass(frozen=True)
  class Base(Section):
    """A base.

    Attributes:
      a: the first field, whose meaning
        goes on.
      b (int): the second.

    Later prose is not part of it.
    """

    a: int = 1
    b: int = 2

  @dataclasses.dataclass(frozen=True)
  class Child(Base):
    """A child.

    Attributes:
      c: the child's own.
    """

    c: str = "x"
    d: float = 0.5

  assert field_help(Child) == {"a": "the first field, whose meaning goes on.", "b": "the second.",
                               "c": "the child's own.", "d": ""}


def test_help_lists_fields_defaults_and_meanings(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["jaxpt", "pretrain", "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert re.search(r"^  optim\.learning_rate +float +0\.003 +peak learning rate", out, re.M), out
  assert re.search(r"^  data\.seq_len +int +required +tokens per packed row", out, re.M), out
  assert re.search(r"^  model +section +required +the transformer", out, re.M), out
  assert re.search(r"^  steps +int +1000 +total loop steps", out, re.M), out
  for name in ("sft", "rm", "grpo"):
    with pytest.raises(SystemExit) as exit_info:
      cli.main(["jaxpt", "help", name])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(row.path in out for row in describe_fields(cli.SUBCOMMANDS[name].config_type))
  assert re.search(r"^  sampling\.max_new_tokens +int +40 ", out, re.M), out  # the section's default instance's
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["jaxpt", "eval", "-h"])
  assert exit_info.value.code == 0 and "--step N" in capsys.readouterr().out


def test_help_from_the_command_line_exits_0():
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "pretrain", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "optim.grad_accum_steps" in result.stdout and "allow_changes" in result.stdout


def test_unknown_override_is_one_clean_line(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jaxpt.cli", "pretrain", "--config", TINY, "--workdir",
                           str(tmp_path / "run"), "--config.modle.d_model=3"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip() == "jaxpt pretrain: config error: no config field 'modle' (did you mean 'model'?)", \
      result.stderr


@pytest.mark.parametrize("override, message", [
    ("--config.model.d_modle=3", "no config field 'model.d_modle' (did you mean 'model.d_model'?)"),
    ("--config.stepz=3", "no config field 'stepz' (did you mean 'steps'?)"),
    ("--config.steps.x=3", "no config field 'steps.x'"),
    ("--config.no_such_field=1", "no config field 'no_such_field'"),
])
def test_unknown_override_names_the_field_and_the_closest(override, message):
  argv = ["jaxpt pretrain", "--config", TINY, "--steps=1", override]
  config_type = TRAINERS.get("pretrain").config_type
  assert unknown_override(config_type, argv, KeyError("'x'\nDid you mean ...")) == message
