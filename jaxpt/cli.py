"""`jaxpt <subcommand> --config <file.py> [--config.field=value ...] --workdir DIR`.

Each subcommand names a trainer's run-config dataclass and its `run_*(run_config, workdir) -> exit code`; the
config file is checked once, here, into that dataclass. They share the `--config` (ml_collections config file,
Flax-examples style) and `--workdir` flags. Exit codes: 0 finished; 2 a config or data error (one line naming the
field, or the file and line; no traceback); 3 a non-finite loss, gradient or parameter stopped the run (nothing of
it saved); 4 another live run holds the workdir's lock; 75 a SIGTERM stopped it after saving a checkpoint (rerun the
same command to resume).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (experiments/configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Multi-process start-up (jax.distributed.initialize). auto: when a coordinator address is given (flag or "
    "JAX_COORDINATOR_ADDRESS) or TPU_WORKER_HOSTNAMES lists several hosts; on: always (unset values are "
    "auto-detected, e.g. on a TPU pod slice); off: never.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process runs).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")


@dataclasses.dataclass(frozen=True)
class Subcommand:
  """`jaxpt <name>`: `<module>.<run>(run_config, workdir) -> exit code`, its config a `<module>.<config_class>`."""

  name: str
  help: str
  module: str
  config_class: str
  run: str

  def __call__(self, config: Any, workdir: str) -> int:
    """Checks `config` once (ConfigError naming the field) and runs the subcommand on the checked run config."""
    from jaxpt.config import from_section
    from jaxpt.train.lock import workdir_lock

    module = importlib.import_module(self.module)
    run_config = from_section(getattr(module, self.config_class), config, "config")
    with workdir_lock(workdir):  # before any data work in the workdir
      return getattr(module, self.run)(run_config, workdir)


SUBCOMMANDS: dict[str, Subcommand] = {c.name: c for c in (
    Subcommand("pretrain", "Pretrain a transformer LM (metrics.jsonl, TensorBoard, loss.png, checkpoints in workdir).",
               "jaxpt.train.pretrain", "PretrainRunConfig", "run_pretrain"),
    Subcommand("sft", "Supervised fine-tuning on a math task (response-only loss; answer accuracy in the eval).",
               "jaxpt.train.sft", "SFTRunConfig", "run_sft"),
    Subcommand("grpo", "GRPO / CLIPO post-training with KV-cache rollouts and verifiable rewards.",
               "jaxpt.train.grpo", "GRPORunConfig", "run_grpo"),
    Subcommand("rm", "Train a reward model (Bradley-Terry, DIR, ODIN) and write its evaluation report.",
               "jaxpt.train.rm", "RMRunConfig", "run_rm"),
)}


def _usage() -> str:
  lines = ["usage: jaxpt <subcommand> --config <file.py> [--config.field=value ...] --workdir DIR",
           "         [--distributed=auto|on|off --coordinator_address=HOST:PORT --num_processes=N --process_id=I]",
           "",
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
    from jaxpt.config import ConfigError, DataError
    from jaxpt.train.lock import WorkdirLocked
    from jaxpt.train.loop import EXIT_NONFINITE, NonFiniteError

    if len(argv) > 1:
      print(f"jaxpt {name}: unexpected arguments {argv[1:]}\n\n{_usage()}", file=sys.stderr)
      return 2
    if _CONFIG.value is None or not _WORKDIR.value:
      print(f"jaxpt {name}: --config and --workdir are required\n\n{_usage()}", file=sys.stderr)
      return 2
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax/tfds INFO lines drown the progress bar; -v 0 brings them back
    from jaxpt.parallel.distributed import initialize

    initialize(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)  # before any jax work
    try:
      return SUBCOMMANDS[name](_CONFIG.value, _WORKDIR.value)
    except ConfigError as e:
      print(f"jaxpt {name}: config error: {e}", file=sys.stderr)
      return 2
    except DataError as e:
      print(f"jaxpt {name}: data error: {e}", file=sys.stderr)
      return 2
    except NonFiniteError as e:
      print(f"jaxpt {name}: {e}", file=sys.stderr)
      return EXIT_NONFINITE
    except WorkdirLocked as e:
      print(f"jaxpt {name}: {e}", file=sys.stderr)
      return 4

  return run


def main(argv: list[str] | None = None) -> None:
  from jaxpt.host_allocator import reuse_freed_host_memory

  reuse_freed_host_memory()  # before JAX allocates: XLA:CPU step buffers are reused, not page-faulted anew
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
