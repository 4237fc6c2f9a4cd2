"""`jaxpt <subcommand> --config <file.py> [--config.field=value ...] --workdir DIR`.

Each subcommand is a function `(config, workdir) -> exit code` registered with `@subcommand(name, help)`;
they share the `--config` (ml_collections config file, Flax-examples style) and `--workdir` flags. A config
error prints one line naming the field and exits 2, without a traceback.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (experiments/configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")


@dataclasses.dataclass(frozen=True)
class Subcommand:
  name: str
  help: str
  run: Callable[[Any, str], int]


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str) -> Callable:
  """Registers `fn(config, workdir) -> int` as `jaxpt <name>`."""

  def decorator(fn: Callable[[Any, str], int]) -> Callable[[Any, str], int]:
    SUBCOMMANDS[name] = Subcommand(name, help, fn)
    return fn

  return decorator


@subcommand("pretrain", "Pretrain a transformer LM (metrics.jsonl, TensorBoard, loss.png, checkpoints in workdir).")
def _pretrain(config: Any, workdir: str) -> int:
  from jaxpt.train.config import validate_config

  validate_config(config)  # fail before importing or building anything heavy
  from jaxpt.train.pretrain import pretrain

  result = pretrain(config, workdir)
  step = int(result.state.step)
  if result.preempted:
    print(f"jaxpt pretrain: SIGTERM at step {step}; checkpoint saved in {workdir}, rerun to resume.")
  else:
    summary = ", ".join(f"{k}={result.last_row[k]:.4g}" for k in ("loss", "eval_loss", "eval_ppl")
                        if k in result.last_row)
    print(f"jaxpt pretrain: finished step {step} in {workdir}" + (f": {summary}" if summary else ""))
  return 0


def _usage() -> str:
  lines = ["usage: jaxpt <subcommand> --config <file.py> [--config.field=value ...] --workdir DIR", "",
           "subcommands:"]
  lines += [f"  {c.name:<10} {c.help}" for c in SUBCOMMANDS.values()]
  return "\n".join(lines)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with an unknown `--config.<field>` override reported in one line (exit 2)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"jaxpt: {e}\n\n{_usage()}", file=sys.stderr)
  except (AttributeError, KeyError) as e:
    field = str(e).strip("\"'")
    print(f"jaxpt: config error: no config field {field!r} for an override "
          f"({' '.join(a for a in argv[1:] if a.startswith('--config.'))})", file=sys.stderr)
  sys.exit(2)


def _run(name: str) -> Callable[[list[str]], int]:
  def run(argv: list[str]) -> int:
    from jaxpt.models.config import ConfigError

    if len(argv) > 1:
      print(f"jaxpt {name}: unexpected arguments {argv[1:]}\n\n{_usage()}", file=sys.stderr)
      return 2
    if _CONFIG.value is None or not _WORKDIR.value:
      print(f"jaxpt {name}: --config and --workdir are required\n\n{_usage()}", file=sys.stderr)
      return 2
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax/tfds INFO lines drown the progress bar; -v 0 brings them back
    try:
      return SUBCOMMANDS[name].run(_CONFIG.value, _WORKDIR.value)
    except ConfigError as e:
      print(f"jaxpt {name}: config error: {e}", file=sys.stderr)
      return 2

  return run


def main(argv: list[str] | None = None) -> None:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  name = argv[1]
  if name not in SUBCOMMANDS:
    print(f"jaxpt: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
    sys.exit(2)
  app.run(_run(name), argv=[f"{argv[0]} {name}"] + argv[2:], flags_parser=_parse_flags)


if __name__ == "__main__":
  main()
