"""`jaxpt <subcommand> --config <file.py> [--config.field=value ...] --workdir DIR`; `jaxpt eval|export-hf ...`.

Each training subcommand is a registered trainer (`jaxpt.engine.trainers.TRAINERS`: its run-config dataclass and its
build, run by `jaxpt.engine.run.run_command`); the config file is checked once, here, into that dataclass (what is
wrong with a file or an override: `jaxpt.cli_config`). They share
the `--config` (ml_collections config file, Flax-examples style) and `--workdir` flags; `jaxpt <subcommand> --help`
(or `jaxpt help <subcommand>`) lists the run config's fields with their types, defaults and meanings
(`jaxpt.config.describe_fields`). `jaxpt eval --workdir DIR [--step N]` evaluates a checkpoint of an existing run
(`jaxpt.engine.evaluate`); `jaxpt export-hf --workdir DIR --out OUT` writes one as a Hugging Face checkpoint
(`jaxpt.api.run_export_hf`; a LoRA run with `--merge`, or its adapters alone in PEFT's format with `--adapters`).

Exit codes: 0 finished; 2 a config or data error (one line naming the field, or the file and line; no traceback);
3 a non-finite loss, gradient or parameter stopped the run (nothing of it saved), or on_nonfinite='skip' skipped
max_skipped_steps steps in a row; 4 another live run holds the workdir's lock; 5 a checkpoint or filesystem error
(one line: the cause and the path; e.g. a full disk, a read-only workdir, no checkpoint that restores); 75 a
SIGTERM stopped training after saving a checkpoint at that step (rerun the same command to resume); 130 a Ctrl-C
(SIGINT) did, likewise; 143 a SIGTERM outside the training loop (data preparation, compiling, ...: one line naming
what was under way; only finished, atomically written files are kept; rerunning continues), 130 a Ctrl-C there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shutil
import signal
import sys
import textwrap
import threading
from typing import Any, Callable

from absl import app, flags, logging
from ml_collections import config_flags

from jaxpt.cli_config import OVERRIDE, config_file_problem, config_path, raised_in_config_file, unknown_override
from jaxpt.engine.trainers import TRAINERS, Trainer, trainer_list

EXIT_IO = 5  # a checkpoint or filesystem error (CheckpointError, OSError)

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
_STEP = flags.DEFINE_integer("step", None, "jaxpt eval / export-hf: the checkpoint step (default: the latest).")
_OUT = flags.DEFINE_string("out", None, "jaxpt export-hf: the directory to write (new or empty).")
_FORMAT = flags.DEFINE_enum("format", "auto", ["auto", "transformers", "jaxpt"],
                            "jaxpt export-hf: transformers (pre-scheme models), jaxpt (native), auto: the first "
                            "that fits.")
_MERGE = flags.DEFINE_bool("merge", False, "jaxpt export-hf: a LoRA run as the full model with its adapters merged "
                           "(W + s A B).")
_ADAPTERS = flags.DEFINE_bool("adapters", False, "jaxpt export-hf: a LoRA run's adapters alone, in PEFT's format "
                              "(adapter_config.json + adapter_model.safetensors).")
WORKDIR_FLAGS = ("step", "out", "format", "overwrite", "merge", "adapters")  # flags of the workdir subcommands only
_DEVICES = flags.DEFINE_integer("devices", None, "jaxpt plan: the devices the run would have (the mesh's size).")
_DEVICE_GIB = flags.DEFINE_float("device_gib", None, "jaxpt plan: memory of one device in GiB (--device-gib).")
_COMPILE = flags.DEFINE_bool("compile", False, "jaxpt plan: also compile the step from abstract shapes (every planned "
                             "trainer) and report XLA's memory analysis beside the analytic account.")
PLAN_FLAGS = ("devices", "device_gib", "compile")  # flags of jaxpt plan only
PLANNED_MODELS = ("lm", "reward", "actor_critic")  # the trainers jaxpt plan reads (`jaxpt.trainers.plan.PLANNED`)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "jaxpt export-hf: replace a previous export in --out (one that "
                                "holds only the files its jaxpt_export.json lists; anything else is refused).")


@dataclasses.dataclass(frozen=True)
class Subcommand(Trainer):
  """`jaxpt <name>`: a registered trainer (`jaxpt.engine.trainers.TRAINERS`), its config a
  `<module>.<config_class>`, run by `jaxpt.engine.run.run_command` (build, start line, train, summary line)."""

  def __call__(self, config: Any, workdir: str) -> int:
    """Checks `config` once (ConfigError naming the field) and runs the subcommand on the checked run config."""
    from jaxpt import progress
    from jaxpt.config import from_section
    from jaxpt.engine.lock import workdir_lock
    from jaxpt.engine.run import run_command

    run_config = from_section(self.config_type, config, "config")
    progress.enable(self.name if run_config.progress else None)  # start-up lines on stderr
    with workdir_lock(workdir):  # before any data work in the workdir
      return run_command(self.name, run_config, workdir)


@dataclasses.dataclass(frozen=True)
class WorkdirSubcommand:
  """`jaxpt <name> --workdir DIR [--step N] [<its flags>]`: `<module>.<run>(workdir, step, **flags) -> exit code`
  on an existing run; no --config (the run's recorded config.json is read) and no workdir lock (the run may still
  be training). `flags`: the names of its own absl flags (a required one has no default); `details`: --help lines."""

  name: str
  help: str
  module: str
  run: str
  flags: tuple[str, ...] = ()
  details: tuple[str, ...] = ()

  @property
  def usage(self) -> str:
    own = " ".join(f"--{f} {f.upper()}" if flags.FLAGS[f].default is None else f"[--{f}]" for f in self.flags)
    return f"jaxpt {self.name} --workdir DIR [--step N]" + (f" {own}" if own else "")

  def missing(self) -> list[str]:
    """Its required flags that were not given."""
    return [f"--{f}" for f in self.flags if flags.FLAGS[f].default is None and flags.FLAGS[f].value is None]

  def __call__(self, workdir: str, step: int | None) -> int:
    from jaxpt import progress

    progress.enable(self.name)
    own = {f: flags.FLAGS[f].value for f in self.flags}
    return getattr(importlib.import_module(self.module), self.run)(workdir, step, **own)


SUBCOMMANDS: dict[str, Subcommand] = {name: Subcommand(**vars(TRAINERS.get(name))) for name in TRAINERS}
WORKDIR_SUBCOMMANDS: dict[str, WorkdirSubcommand] = {c.name: c for c in (
    WorkdirSubcommand("eval", "Evaluate a run's latest (or --step N) checkpoint, without training (one JSON line).",
                      "jaxpt.engine.evaluate", "run_eval", details=(
                          "Rebuilds the run from its recorded config.json with its trainer's own build function and",
                          "evaluator; the result ({step, run, eval metrics}) is one JSON line on stdout and",
                          "DIR/eval/step_<N>.json.", "",
                          f"  --workdir DIR  the workdir of a jaxpt {trainer_list()} run",
                          "  --step N       the checkpoint step to evaluate (default: the latest)")),
    WorkdirSubcommand("export-hf", "Write a run's checkpoint as a Hugging Face checkpoint (config.json + safetensors).",
                      "jaxpt.api", "run_export_hf", flags=("out", "format", "overwrite", "merge", "adapters"), details=(
                          "Pre-Norm RMSNorm SwiGLU models (and every model imported from Hugging Face) are written",
                          "in transformers' Llama / Qwen2 / Qwen3 format; SiameseNorm, Post-Norm and HybridNorm",
                          "models, which transformers has no class for, as a jaxpt-native directory that",
                          "jaxpt.load('hf:OUT') reads back. The run's tokenizer files are copied along. A reward",
                          "model is written as a sequence classifier (transformers' LlamaForSequenceClassification",
                          "and the like, or jaxpt's own) with its number of scores and prompt format; a PPO run",
                          "as its policy (a language model; the critic is not written). A LoRA run needs --merge",
                          "(the full model, W + s A B) or --adapters (the adapters alone in PEFT's format, which",
                          "peft.PeftModel.from_pretrained loads over the transformers base).", "",
                          "  --workdir DIR  the workdir of a jaxpt "
                          f"{trainer_list(lambda t: t.model in ('lm', 'reward') or t.lm_key is not None)} run "
                          "(or hf:DIR)",
                          "  --step N       the checkpoint step to export (default: the latest)",
                          "  --out OUT      the directory to write (new or empty; --overwrite replaces a previous",
                          "                 export, one holding only the files its jaxpt_export.json lists)",
                          "  --format F     auto | transformers | jaxpt (default auto)",
                          "  --merge        a LoRA run: the full model with its adapters merged",
                          "  --adapters     a LoRA run: adapter_config.json + adapter_model.safetensors (PEFT)")),
)}


@dataclasses.dataclass(frozen=True)
class PlanSubcommand:
  """`jaxpt plan <trainer> --config FILE [--config.x=y ...] --devices N --device-gib G [--compile]`: the per-device
  memory of `<trainer>`'s training step (and rollout sampler) from its config alone, as one JSON line on stdout
  (`jaxpt.trainers.plan`); no workdir, nothing written."""

  name: str = "plan"
  help: str = "Plan a run's per-device memory from its config alone (one JSON line: per_device_gib, fits, advice)."
  flags: tuple[str, ...] = PLAN_FLAGS
  usage: str = "jaxpt plan <trainer> --config FILE [--config.<field>=value ...] --devices N --device-gib G [--compile]"
  details: tuple[str, ...] = (
      "The analytic account of the step's memory on one device (params, grads, AdamW state, the reference",
      "policy, activations under model.remat, float32 logits, the sampler's KV cache; each split per the",
      "config.mesh rules over N devices), `fits` against G GiB less 10% headroom, and `advice`: concrete",
      "overrides with the total each plans to. An hf:DIR start is read from DIR/config.json alone.", "",
      "  <trainer>       pretrain, sft, dpo, kto, rm, grpo or ppo",
      "  --devices N     devices of the run (the mesh's sizes are resolved for N)",
      "  --device-gib G  memory of one device, GiB",
      "  --compile       also compile the step from abstract shapes (PPO: the policy + critic update; N <= the local",
      "                  devices, CPU devices are made as needed) and report XLA's memory analysis (compiled_gib)")

  def __call__(self, trainer: str, config: Any) -> int:
    import json

    from jaxpt.trainers.plan import plan_memory

    print(json.dumps(plan_memory(trainer, config, _DEVICES.value, _DEVICE_GIB.value, compile=_COMPILE.value)),
          flush=True)
    return 0


PLAN = PlanSubcommand()
COMMANDS: dict[str, Subcommand | WorkdirSubcommand | PlanSubcommand] = {**SUBCOMMANDS, **WORKDIR_SUBCOMMANDS,
                                                                        PLAN.name: PLAN}
_TRAIN_USAGE = ("--config <file.py> [--config.<field>=value ...] --workdir DIR\n"
                "         [--distributed=auto|on|off --coordinator_address=HOST:PORT --num_processes=N --process_id=I]")


def _usage() -> str:
  lines = [f"usage: jaxpt <subcommand> {_TRAIN_USAGE}",
           *[f"       {c.usage}" for c in WORKDIR_SUBCOMMANDS.values()],
           f"       {PLAN.usage}",
           "       jaxpt <subcommand> --help    (or jaxpt help <subcommand>: its config fields, defaults, meanings)",
           "",
           "subcommands:"]
  lines += [f"  {c.name:<10} {c.help}" for c in COMMANDS.values()]
  return "\n".join(lines)


def _fields_table(config_type: type, width: int) -> list[str]:
  """One row per field of run config `config_type` (nested sections' fields after them): dotted path, type,
  default (or `required`), meaning, the meaning wrapped to `width` columns."""
  from jaxpt.config import describe_fields

  rows = describe_fields(config_type)
  cells = [(r.path, "section" if r.section else r.type, "required" if r.default is None else r.default, r.help)
           for r in rows]
  widths = [max(len(c[i]) for c in cells + [("FIELD", "TYPE", "DEFAULT", "")]) for i in range(3)]
  widths[2] = min(widths[2], 18)
  indent = 2 + sum(w + 2 for w in widths)
  lines = []
  for path, kind, default, meaning in [("FIELD", "TYPE", "DEFAULT", "MEANING")] + cells:
    head = f"  {path:<{widths[0]}}  {kind:<{widths[1]}}  {default:<{widths[2]}}  "
    if len(head) > indent:  # a long default: the meaning starts on the next line
      lines.append(head.rstrip())
      head = " " * indent
    wrapped = textwrap.wrap(meaning, max(30, width - indent)) or [""]
    lines.append((head + wrapped[0]).rstrip())
    lines += [" " * indent + part for part in wrapped[1:]]
  return lines


def _subcommand_help(name: str) -> str:
  """`jaxpt <name> --help`: usage, what it does, and (training subcommands) every config field."""
  command = COMMANDS[name]
  if isinstance(command, (WorkdirSubcommand, PlanSubcommand)):
    return "\n".join([f"usage: {command.usage}", "", command.help, *command.details])
  width = min(max(shutil.get_terminal_size((120, 24)).columns, 80), 160)
  return "\n".join([
      f"usage: jaxpt {name} {_TRAIN_USAGE}", "", command.help, "",
      f"config fields ({command.module}.{command.config_class}; the config file sets them, --config.<field>=value "
      "overrides one):", *_fields_table(command.config_type, width)])


def _flag_error(name: str, argv: list[str], error: Exception) -> None:
  """Reports a flag error not raised by the config file in one line (exit 2): an unknown `--config.<field>`
  override, or absl's own message with the usage; re-raises anything else."""
  if isinstance(error, flags.Error):
    print(f"jaxpt {name}: {error}\n\n{_usage()}", file=sys.stderr)
  elif isinstance(error, (AttributeError, KeyError)):
    command = SUBCOMMANDS.get(name)
    print(f"jaxpt {name}: config error: {unknown_override(command and command.config_type, argv, error)}",
          file=sys.stderr)
  else:
    raise error
  sys.exit(2)


def _parse_flags(name: str, argv: list[str]) -> list[str]:
  """absl flag parsing, with each failure in one line (exit 2): a config file that cannot be run (the file, and the
  line where it raised), a `--config.<field>` override without --config, an unknown override (the field)."""
  path = config_path(argv)
  override = next((arg.split("=", 1)[0] for arg in argv[1:] if OVERRIDE.match(arg)), None)
  if name in WORKDIR_SUBCOMMANDS and (path is not None or override is not None):
    print(f"jaxpt {name}: {'--config' if path is not None else override}: jaxpt {name} takes no --config and no "
          "--config.<field> overrides (it reads the run's recorded config.json)", file=sys.stderr)
    sys.exit(2)
  if override is not None and path is None:
    print(f"jaxpt {name}: {override}: --config.<field> overrides need --config FILE (the file they override)",
          file=sys.stderr)
    sys.exit(2)
  problem = config_file_problem(path) if path is not None else None
  if problem is None:
    try:
      rest = flags.FLAGS(argv)
      if type(_CONFIG.value).__name__ == "_ErrorConfig":
        raise vars(_CONFIG.value)["_error"]  # ml_collections defers an OSError of get_config to the config's use
      return rest
    except Exception as e:  # pylint: disable=broad-except
      problem = raised_in_config_file(path, e) if path is not None else None
      if problem is None:
        _flag_error(name, argv, e)
  line, why = problem
  print(f"jaxpt {name}: config file {path}{'' if line is None else f':{line}'}: {why}", file=sys.stderr)
  sys.exit(2)


class Stopped(BaseException):
  """SIGTERM or SIGINT (Ctrl-C) stopped a training subcommand outside its training loop (data preparation,
  compiling, restoring, the final report); a BaseException, as KeyboardInterrupt, so that no `except Exception`
  swallows it."""

  def __init__(self, signum: int):
    from jaxpt.engine.loop import signal_name

    self.signum = signum
    self.name = signal_name(signum)
    super().__init__(self.name)


@contextlib.contextmanager
def _signals_stop_the_command():
  """SIGTERM and SIGINT raise `Stopped` while the subcommand runs outside the training loop (a second one while it
  unwinds exits at once: `stop_now`); the loop installs its own handlers (checkpoint, then stop) and restores these
  after. An ignored signal (a background job's SIGINT) stays ignored."""
  from jaxpt.engine.loop import install_handlers, stop_now

  if threading.current_thread() is not threading.main_thread():  # Python handlers belong to the main thread
    yield
    return
  stopped: list[int] = []
  in_hook = threading.Event()  # set while `swallowed` runs: a handler there must not raise (that would be dropped too)
  unsent: set[int] = set()  # signals dropped where exceptions are ignored, whose timer has not sent them again yet
  lock = threading.Lock()
  main_thread = threading.get_ident()

  def send(signum: int) -> None:
    with lock:
      if signum in unsent:
        unsent.discard(signum)
        signal.pthread_kill(main_thread, signum)

  def send_again(signum: int) -> None:
    """The signal again, to the main thread, from a timer thread: its handler runs at a later bytecode."""
    with lock:
      unsent.add(signum)
    threading.Timer(0.01, send, (signum,)).start()

  def handle(signum, frame):
    del frame
    if in_hook.is_set():
      return send_again(signum)
    if stopped:
      stop_now(signum)
    stopped.append(signum)
    raise Stopped(signum)

  def swallowed(unraisable):
    """The handler ran where exceptions are ignored (a gc callback such as jax's, a `__del__`): send it again."""
    in_hook.set()
    try:
      if isinstance(unraisable.exc_value, Stopped):
        stopped.clear()  # the same signal again, not a second one
        send_again(unraisable.exc_value.signum)
      else:
        previous_hook(unraisable)
    finally:
      in_hook.clear()

  previous = install_handlers(handle, (signal.SIGTERM, signal.SIGINT))
  previous_hook, sys.unraisablehook = sys.unraisablehook, swallowed
  completed = False
  try:
    yield
    completed = True
  finally:
    try:
      with lock:  # a timer that has not fired sends nothing after this
        left = sorted(unsent)
        unsent.clear()
    finally:
      sys.unraisablehook = previous_hook
      for signum, handler in previous.items():
        signal.signal(signum, handler)
  if left and completed:  # a dropped signal not yet sent again when the command ended: it still stops it
    raise Stopped(left[0])


def _run(name: str, trainer: str | None = None) -> Callable[[list[str]], int]:
  def run(argv: list[str]) -> int:
    quiet = not flags.FLAGS["verbosity"].present
    if quiet:  # before the imports below: orbax logs INFO lines when jaxpt.engine.checkpoint is first imported
      logging.set_verbosity(logging.WARNING)  # orbax/tfds INFO lines drown the progress bar; -v 0 brings them back
    from jaxpt.config import ConfigError, DataError
    from jaxpt.engine.checkpoint import CheckpointError
    from jaxpt.engine.lock import WorkdirLocked
    from jaxpt.engine.loop import EXIT_NONFINITE, NonFiniteError

    command = COMMANDS[name]
    if len(argv) > 1:
      print(f"jaxpt {name}: unexpected arguments {argv[1:]}\n\n{_usage()}", file=sys.stderr)
      return 2
    own = {"step", *command.flags} if isinstance(command, WorkdirSubcommand) else set(getattr(command, "flags", ()))
    foreign = [f"--{f}" for f in WORKDIR_FLAGS + PLAN_FLAGS if flags.FLAGS[f].present and f not in own]
    if isinstance(command, PlanSubcommand):
      if foreign or _WORKDIR.value:
        print(f"jaxpt plan: {(foreign or ['--workdir'])[0]} is not a flag of jaxpt plan (it writes nothing)\n\n"
              f"usage: {command.usage}", file=sys.stderr)
        return 2
      missing = [f for f, value in (("--config", _CONFIG.value), ("--devices", _DEVICES.value),
                                    ("--device-gib", _DEVICE_GIB.value)) if value is None]
      if missing:
        print(f"jaxpt plan: {missing[0]}: required ({command.usage})", file=sys.stderr)
        return 2
      if _COMPILE.value:
        _cpu_devices(_DEVICES.value)
      try:
        _check_overrides()
        return command(trainer, _CONFIG.value)
      except ConfigError as e:
        print(f"jaxpt plan: config error: {e}", file=sys.stderr)
        return 2
    if isinstance(command, WorkdirSubcommand):
      if _CONFIG.value is not None or not _WORKDIR.value or command.missing():
        print(f"jaxpt {name}: takes --workdir (the run's recorded config.json is read), no --config"
              f"{''.join(f', and {f}' for f in command.missing())}\n\n{_usage()}", file=sys.stderr)
        return 2
    elif _CONFIG.value is None or not _WORKDIR.value:
      print(f"jaxpt {name}: --config and --workdir are required\n\n{_usage()}", file=sys.stderr)
      return 2
    if foreign:
      print(f"jaxpt {name}: {', '.join(foreign)} is not a flag of jaxpt {name}\n\n{_usage()}", file=sys.stderr)
      return 2
    if quiet:
      from jaxpt.engine.checkpoint import quiet_orbax_noise

      quiet_orbax_noise()  # a failed save is one CheckpointError line, not hundreds of orbax / asyncio lines
    from jaxpt.parallel.distributed import initialize

    multi_process = initialize(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                               _PROCESS_ID.value)  # before any jax work
    workdir_command = isinstance(command, WorkdirSubcommand)
    try:
      # jax's preemption service handles SIGTERM in a multi-process run (a Python handler would replace its own)
      with contextlib.nullcontext() if multi_process else _signals_stop_the_command():
        if workdir_command:
          return command(_WORKDIR.value, _STEP.value)
        _check_overrides()
        return command(_CONFIG.value, _WORKDIR.value)
    except Stopped as e:  # outside the training loop, whose own handlers save a checkpoint and stop
      from jaxpt import progress

      outcome = ("the run is untouched and nothing half-written is kept" if workdir_command else
                 "nothing was trained or saved since the last checkpoint")
      print(f"jaxpt {name}: {e.name} while {progress.doing()}; {outcome}; rerun the same command to continue",
            file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(128 + e.signum)  # not sys.exit: data preparation's or orbax's threads must not hold the exit up
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
    except (CheckpointError, OSError) as e:  # a full disk, a read-only workdir or one that is a file, ...
      from jaxpt.oserrors import describe, errno_of

      kind = "checkpoint" if isinstance(e, CheckpointError) else "filesystem"
      cause = describe(e) if kind == "filesystem" and errno_of(e) is not None else e  # the OS cause leads
      print(f"jaxpt {name}: {kind} error: {cause}", file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(EXIT_IO)  # not sys.exit: a failed async save's writer threads print pages of noise at shutdown

  return run


def _check_overrides() -> None:
  """ConfigError for a `--config.<field>` override wrong even at the field's default (which the run config, filled
  from a file holding every field, cannot tell from a field left unset: `jaxpt.engine.config.check_overrides`)."""
  from jaxpt.engine.config import check_overrides

  check_overrides(_CONFIG.value, config_flags.get_override_values(flags.FLAGS["config"]))


def _cpu_devices(count: int) -> None:
  """At least `count` CPU devices for `jaxpt plan --compile`'s mesh, when jax's backend has not started yet (else
  the plan says how many devices it found)."""
  import jax

  try:
    if count > 1:
      jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # the backend already started
    pass


def _print_help(text: str, code: int) -> None:
  """Prints `text` on stdout and exits with `code`; a reader that stops early (`jaxpt --help | head -3`) closes the
  pipe, which ends it quietly (same code, no BrokenPipeError traceback): the rest is written to /dev/null."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush of stdout must not fail again
  sys.exit(code)


def main(argv: list[str] | None = None) -> None:
  from jaxpt.host_allocator import reuse_freed_host_memory

  reuse_freed_host_memory()  # before JAX allocates: XLA:CPU step buffers are reused, not page-faulted anew
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help") or argv[1:] == ["help"]:
    _print_help(_usage(), 0 if len(argv) >= 2 else 2)
  asks_help = argv[1] == "help" or any(a in ("-h", "--help") for a in argv[2:])
  name = argv[2] if argv[1] == "help" else argv[1]
  if name not in COMMANDS:
    print(f"jaxpt: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
    sys.exit(2)
  if asks_help:
    _print_help(_subcommand_help(name), 0)
  if name == PLAN.name:  # jaxpt plan <trainer> ...: writes nothing (not even the config file's bytecode)
    sys.dont_write_bytecode = True
    trainer = argv[2] if len(argv) > 2 and not argv[2].startswith("-") else None
    planned = lambda t: t.model in PLANNED_MODELS
    if trainer is None or trainer not in SUBCOMMANDS or not planned(TRAINERS.get(trainer)):
      print(f"jaxpt plan: <trainer>: {'missing' if trainer is None else repr(trainer) + ' is not planned'} (one of "
            f"{trainer_list(planned)}; {PLAN.usage})", file=sys.stderr)
      sys.exit(2)
    rest = [a.replace("--device-gib", "--device_gib", 1) if a.startswith("--device-gib") else a for a in argv[3:]]
    app.run(_run(name, trainer), argv=[f"{argv[0]} {name}"] + rest, flags_parser=lambda args: _parse_flags(name, args))
    return
  app.run(_run(name), argv=[f"{argv[0]} {name}"] + argv[2:], flags_parser=lambda args: _parse_flags(name, args))


if __name__ == "__main__":
  main()
