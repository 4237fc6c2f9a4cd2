"""Fault injection: kill, interrupt, corrupt, starve and refuse tiny `jaxpt pretrain` and `jaxpt grpo` runs, then
check that the final params are bitwise those of an uninterrupted run.

    python tools/fault_injection.py [--kills 24] [--interrupts 4] [--disk-fulls 4] [--refusals 4] [--seed 0]
                                    [--trainers pretrain,grpo] [--root DIR]

For each trainer: one uninterrupted reference run; then, in a second workdir (on a small tmpfs of its own when the
tool runs as root, for the disk-full faults), the same command relaunched until it finishes, each launch (seeded)
  - SIGKILLed at a random moment of start-up (data, tokenizer, run record, compile), at a random moment after it
    logged a new step, or the moment a checkpoint save is under way (an `*.orbax-checkpoint-tmp*` folder exists),
    in turn (`--kills`);
  - interrupted by SIGINT (Ctrl-C) at a random moment after it logged a new step: it must save and exit 130 with
    one line (`--interrupts`);
  - starved: at a random moment of the launch (start-up included) the rest of the tmpfs is filled, as a full disk
    is; it must exit 5 with one line naming "ENOSPC: No space left on device" (or finish, if it needed no more
    space), leaving the good state; the space is freed before the next launch (`--disk-fulls`);
  - once: the newest checkpoint is truncated before the relaunch (restore must fall back to the one before);
  - once: run under a 50 kB file-size limit (RLIMIT_FSIZE: EFBIG, a quota): exit 5 with one line;
and between launches a relaunch that must be refused (a changed seed; a changed model allowed but not fitting the
checkpoint) leaves every file of the workdir byte-identical (`--refusals`). The final checkpoint's arrays are
compared with the reference's. Prints one JSON tally per trainer (faults survived, bitwise-equal finals, refusals
with untouched workdirs, anything unexpected) and exits non-zero on any mismatch or unexpected outcome. `--root`
must be a new or empty folder (default: a new temporary one); the tool deletes nothing it did not make.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import orbax.checkpoint as ocp

if __package__ in (None, ""):  # run as a script (python tools/fault_injection.py): the repository root on the path
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpt.engine.lock import LOCK_FILE  # noqa: E402
from jaxpt.engine.record import checkpoint_steps  # noqa: E402
from jaxpt.engine.trainers import TRAINERS  # noqa: E402
from tools.file_tree import snapshot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUOTA = ("import os, resource, sys; limit = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, "
         "(limit, limit)); os.execv(sys.argv[2], sys.argv[2:])")
EXIT_INTERRUPTED = 130  # jaxpt's exit code after a Ctrl-C (SIGINT): saved, rerun to resume
QUOTA_BYTES = 50_000  # below the micro model's checkpoint files: the next save fails as on a full disk
MICRO_MODEL = {"model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
               "model.num_kv_heads": 2, "model.mlp_dim": 64}
COMMANDS = {  # a tiny run of each registered trainer (jaxpt.engine.trainers.TRAINERS) the tool can drive
    "pretrain": ("experiments/configs/tiny.py", {
        **MICRO_MODEL, "steps": 300, "log_every": 1, "eval_every": 50, "checkpoint_every": 7, "progress": False,
        "model.max_seq_len": 32, "data.seq_len": 32, "data.batch_size": 8, "data.eval_batches": 2,
        "data.max_corpus_bytes": 200_000, "optim.warmup_steps": 5, "optim.learning_rate": 1e-2}),
    "grpo": ("experiments/configs/grpo_tiny.py", {
        **MICRO_MODEL, "model.max_seq_len": 64, "init_from": "", "steps": 60, "log_every": 1, "eval_every": 0,
        "checkpoint_every": 3, "progress": False, "task.num_steps": 1, "task.max_value": 9, "task.ops": "+",
        "task.train_size": 64, "task.test_size": 16, "data.prompts_per_step": 4, "data.max_prompt_len": 32,
        "data.eval_prompts": 0, "sampling.max_new_tokens": 16, "grpo.group_size": 4, "grpo.minibatches": 1,
        "optim.learning_rate": 2e-3, "optim.warmup_steps": 0}),
}


def unsupported_trainers(trainers: list[str]) -> str | None:
  """One line naming the first of `trainers` that is not registered, or has no tiny run here; None when all do."""
  for trainer in trainers:
    if trainer not in TRAINERS:
      return f"--trainers: unknown trainer {trainer!r} (registered: {', '.join(TRAINERS)})"
    if trainer not in COMMANDS:
      return f"--trainers: no tiny {trainer} run in this tool yet (it has: {', '.join(COMMANDS)})"
  return None


def command(trainer: str, workdir: str, **extra) -> list[str]:
  """The `jaxpt <trainer>` command line of the tiny run in `workdir` (`extra`: more `--config.<field>` values)."""
  config, overrides = COMMANDS[trainer]
  return [sys.executable, "-m", "jaxpt.cli", trainer, "--config", config, "--workdir", workdir,
          *(f"--config.{k}={v}" for k, v in {**overrides, **extra}.items())]


def saving(workdir: str, since: float) -> bool:
  """Whether a checkpoint save started at or after `since` is under way (a killed save's folder stays until the
  next launch cleans it up, so older ones do not count)."""
  for path in glob.glob(os.path.join(workdir, "checkpoints", "*orbax-checkpoint-tmp*")):
    try:
      if os.stat(path).st_mtime >= since:
        return True
    except FileNotFoundError:  # committed (renamed) meanwhile
      continue
  return False


def final_arrays(workdir: str) -> tuple[int, dict]:
  steps = checkpoint_steps(workdir)
  with ocp.PyTreeCheckpointer() as reader:
    tree = reader.restore(os.path.join(workdir, "checkpoints", str(steps[-1]), "state"))
  return steps[-1], {k: np.asarray(v) for k, v in _flat(tree).items()}


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    return {k2: v2 for k, v in tree.items() for k2, v2 in _flat(v, f"{prefix}{k}/").items()}
  if isinstance(tree, (list, tuple)):
    return {k2: v2 for i, v in enumerate(tree) for k2, v2 in _flat(v, f"{prefix}{i}/").items()}
  return {prefix: tree} if tree is not None else {}


def _metrics_size(workdir: str) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  return os.path.getsize(path) if os.path.exists(path) else 0


KILL_MODES = ("startup", "training", "save")  # a launch is killed at a random moment of start-up (data, record,
# compile), a random moment after it logged a new step, or while a checkpoint save is under way


def launch_and_kill(argv: list[str], workdir: str, rng: random.Random, mode: str, timeout: float = 300) -> dict:
  """One launch, SIGKILLed at a random moment of `mode` (see KILL_MODES) unless it finishes first."""
  logged = _metrics_size(workdir)
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  launched = time.time()
  delay = rng.uniform(0.0, 10.0 if mode == "startup" else 1.0)
  armed_at = launched if mode == "startup" else None
  while proc.poll() is None and time.time() < launched + timeout:
    if armed_at is None and _metrics_size(workdir) > logged:
      armed_at = time.time()
    if armed_at is not None:
      if mode == "save" and saving(workdir, launched):
        break
      if mode != "save" and time.time() - armed_at >= delay:
        break
    time.sleep(0.002)
  killed = proc.poll() is None
  during_save = killed and saving(workdir, launched)
  if killed:
    proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate()
  return {"killed": killed, "during_save": during_save, "returncode": proc.returncode,
          "stderr_tail": err.strip().splitlines()[-1:] if err else []}


def truncate_newest(workdir: str) -> str:
  steps = checkpoint_steps(workdir)
  files = [f for f in glob.glob(os.path.join(workdir, "checkpoints", str(steps[-1]), "state", "**", "*"),
                                recursive=True) if os.path.isfile(f)]
  victim = max(files, key=os.path.getsize)
  os.truncate(victim, os.path.getsize(victim) // 2)
  return f"step {steps[-1]}: {os.path.relpath(victim, workdir)}"


def interrupt(argv: list[str], workdir: str, rng: random.Random, timeout: float = 300) -> dict:
  """One launch, sent SIGINT (Ctrl-C) at a random moment after it logged a new step, unless it finishes first."""
  logged = _metrics_size(workdir)
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  launched, delay, armed_at = time.time(), rng.uniform(0.0, 1.0), None
  while proc.poll() is None and time.time() < launched + timeout:
    if armed_at is None and _metrics_size(workdir) > logged:
      armed_at = time.time()
    if armed_at is not None and time.time() - armed_at >= delay:
      break
    time.sleep(0.002)
  interrupted = proc.poll() is None
  if interrupted:
    proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=timeout)
  # The loop's summary on stdout ('jaxpt <trainer>: Ctrl-C (SIGINT) at step N; checkpoint saved ...'), or, when the
  # signal came after the loop, the CLI's line on stderr ('... Ctrl-C (SIGINT) while <stage>; ...').
  said = (out.strip().splitlines() or [""])[-1] if out.strip() else (err.strip().splitlines() or [""])[-1]
  return {"interrupted": interrupted, "returncode": proc.returncode, "stderr": [said],
          "one_line": said.startswith("jaxpt ") and "Ctrl-C" in said and "Traceback" not in err}


def fill(path: str) -> int:
  """Writes `path` until the filesystem is full (ENOSPC); the bytes written."""
  written, chunk = 0, b"\0" * 65536
  with open(path, "wb", buffering=0) as f:
    while True:
      try:
        written += f.write(chunk)
      except OSError as e:
        if e.errno != errno.ENOSPC:
          raise
        if len(chunk) == 1:
          return written
        chunk = chunk[:len(chunk) // 2]


def starve(argv: list[str], ballast: str, rng: random.Random, timeout: float = 300) -> dict:
  """One launch whose filesystem fills up (`ballast` takes the rest of it) at a random moment, start-up included;
  the ballast is removed once the launch has ended."""
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    proc.wait(timeout=rng.uniform(0.0, 8.0))
  except subprocess.TimeoutExpired:
    pass
  filled = proc.poll() is None
  if filled:
    fill(ballast)
  try:
    _, err = proc.communicate(timeout=timeout)
  finally:
    if os.path.exists(ballast):
      os.remove(ballast)
  return {"filled_while_running": filled, "returncode": proc.returncode, "stderr": err.strip().splitlines()}


REFUSED = (({"seed": 99}, 2), ({"model.d_model": 64, "allow_changes": "model.d_model"}, 5))  # overrides, exit code


def refuse(trainer: str, workdir: str, which: int) -> dict:
  """A relaunch that must be refused (REFUSED[which]); whether it was, and left every file of `workdir` as it was."""
  extra, expected = REFUSED[which % len(REFUSED)]
  stale = _stale_lock(workdir)  # a SIGKILLed launch's lock: the next launch takes it over, refused or not
  before = snapshot(workdir)
  done = subprocess.run(command(trainer, workdir, **extra), cwd=ROOT, capture_output=True, text=True)
  after = snapshot(workdir)
  changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and
                   not (stale and k == LOCK_FILE))
  return {"overrides": extra, "returncode": done.returncode, "expected": expected, "changed": changed[:5],
          "untouched": not changed, "one_line": _one_line(done.stderr), "stale_lock": stale,
          "stderr_tail": done.stderr.strip().splitlines()[-3:]}


def _stale_lock(workdir: str) -> bool:
  """Whether `workdir` holds the lock of a process that no longer runs (on this host)."""
  try:
    with open(os.path.join(workdir, LOCK_FILE)) as f:
      os.kill(json.load(f)["pid"], 0)
  except (OSError, ValueError, KeyError, TypeError):
    return os.path.exists(os.path.join(workdir, LOCK_FILE))
  return False


def _one_line(stderr: str) -> bool:
  """Whether a failed launch said why in one line: no traceback, and its last line names the command."""
  lines = stderr.strip().splitlines()
  return bool(lines) and "Traceback" not in stderr and lines[-1].startswith("jaxpt ")


@contextlib.contextmanager
def small_disk(path: str, size: str = "64m"):
  """A tmpfs of `size` mounted at `path` (made here) for the block, or None where mounting is not permitted."""
  os.makedirs(path)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                           capture_output=True).returncode == 0
  try:
    yield path if mounted else None
  finally:
    if mounted:
      subprocess.run(["umount", path], check=True)
    os.rmdir(path)


def run_trainer(trainer: str, faults: dict[str, int], seed: int, root: str) -> dict:
  """The reference run, then the faulty one relaunched through `faults` (counts per kind) until it finishes; the
  tally."""
  reference = os.path.join(root, trainer, "reference")
  done = subprocess.run(command(trainer, reference), cwd=ROOT, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"reference {trainer} run failed: {done.stderr[-2000:]}")
  with small_disk(os.path.join(root, trainer, "disk")) as disk:
    faulty = os.path.join(disk or os.path.join(root, trainer), "faulty")
    tally = relaunch_through_faults(trainer, faulty, faults if disk else {**faults, "disk_fulls": 0},
                                    random.Random(seed), ballast=os.path.join(disk or root, "ballast"))
    if disk is None:
      tally["disk_fulls_skipped"] = "mounting a tmpfs is not permitted here (run as root)"
    if tally["unexpected"] and disk is not None:  # keep the evidence: the tmpfs goes with the unmount
      shutil.copytree(faulty, os.path.join(root, trainer, "faulty_kept"), symlinks=True)
    ref_step, ref = final_arrays(reference)
    got_step, got = final_arrays(faulty) if os.path.isdir(os.path.join(faulty, "checkpoints")) else (None, {})
    skipped = os.path.join(faulty, "checkpoints_skipped")
    tally["skipped_checkpoints"] = sorted(os.listdir(skipped)) if os.path.isdir(skipped) else []
  differing = sorted(k for k in ref if k not in got or ref[k].shape != got[k].shape or
                     not np.array_equal(ref[k], got[k]))
  tally.update(final_step=[ref_step, got_step], arrays=len(ref), arrays_differing=differing[:5],
               bitwise_identical=ref_step == got_step and not differing and ref.keys() == got.keys())
  return tally


def relaunch_through_faults(trainer: str, faulty: str, faults: dict[str, int], rng: random.Random,
                            ballast: str) -> dict:
  """Launches `trainer` in `faulty` until it finishes, injecting `faults` ({kills, interrupts, disk_fulls,
  refusals}: how many of each) in a seeded order; the tally of what happened."""
  tally = {"trainer": trainer, "launches": 0, "sigkills": 0, "sigkills_during_save": 0, "interrupts": 0,
           "disk_fulls": 0, "refusals": 0, "refusals_untouched": 0, "corruptions": [],
           "quota_exit": None, "unexpected": []}
  argv = command(trainer, faulty)
  plan = ["kill"] * faults["kills"] + ["interrupt"] * faults["interrupts"] + ["disk_full"] * faults["disk_fulls"]
  rng.shuffle(plan)
  refuse_after = set(rng.sample(range(len(plan)), min(faults["refusals"], len(plan))))
  corrupt_at, quota_at = len(plan) // 3, 2 * len(plan) // 3
  done_faults = 0

  while done_faults < len(plan):
    tally["launches"] += 1
    if done_faults == quota_at and tally["quota_exit"] is None and checkpoint_steps(faulty):
      starved = subprocess.run([sys.executable, "-c", QUOTA, str(QUOTA_BYTES), *argv], cwd=ROOT,
                               capture_output=True, text=True)
      lines = starved.stderr.strip().splitlines()
      tally["quota_exit"] = {"returncode": starved.returncode, "stderr_lines": len(lines),
                             "last_line": lines[-1][:200] if lines else ""}
      if starved.returncode not in (0, 5) or starved.returncode == 5 and not _one_line(starved.stderr):
        tally["unexpected"].append(f"quota launch exited {starved.returncode}: {lines[-1:]}")
      continue
    if done_faults == corrupt_at and not tally["corruptions"] and checkpoint_steps(faulty):
      tally["corruptions"].append(truncate_newest(faulty))
    if done_faults in refuse_after and not checkpoint_steps(faulty):  # nothing to refuse yet: after the next fault
      refuse_after.discard(done_faults)
      refuse_after.add(done_faults + 1)
    if done_faults in refuse_after:
      refuse_after.discard(done_faults)
      refused = refuse(trainer, faulty, tally["refusals"])
      tally["refusals"] += 1
      tally["refusals_untouched"] += refused["untouched"]
      if not refused["untouched"] or refused["returncode"] != refused["expected"] or not refused["one_line"]:
        tally["unexpected"].append(f"refusal {refused}")
      continue
    kind = plan[done_faults]
    if kind == "kill":
      mode = KILL_MODES[tally["sigkills"] % len(KILL_MODES)]
      outcome = launch_and_kill(argv, faulty, rng, mode)
      hit, expected = outcome["killed"], outcome["returncode"] == -signal.SIGKILL
    elif kind == "interrupt":
      outcome = interrupt(argv, faulty, rng)
      hit = outcome["interrupted"]
      expected = outcome["returncode"] == EXIT_INTERRUPTED and outcome["one_line"]
    else:
      outcome = starve(argv, ballast, rng)
      hit = outcome["filled_while_running"]
      said = outcome["stderr"][-1] if outcome["stderr"] else ""
      expected = outcome["returncode"] == 5 and "ENOSPC" in said and _one_line("\n".join(outcome["stderr"]))
    if outcome["returncode"] == 0:  # finished before the fault landed: start over, keep the tally
      tally["finished_before_fault"] = tally.get("finished_before_fault", 0) + 1
      shutil.rmtree(faulty)  # made by this tool
      continue
    if not (hit and expected):
      tally["unexpected"].append(f"{kind}: exit {outcome['returncode']}: {outcome.get('stderr', [])[-1:]}"
                                 f"{outcome.get('stderr_tail', '')}")
      break
    if kind == "kill":
      tally["sigkills"] += 1
      tally["sigkills_during_save"] += outcome["during_save"]
      tally[f"sigkills_{mode}"] = tally.get(f"sigkills_{mode}", 0) + 1
    else:
      tally["interrupts" if kind == "interrupt" else "disk_fulls"] += 1
    done_faults += 1
  finished = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
  if finished.returncode != 0:
    tally["unexpected"].append(f"final launch exited {finished.returncode}: {finished.stderr[-500:]}")
  return tally


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--kills", type=int, default=24, help="SIGKILLs per trainer, in turn at start-up, after a "
                      "logged step and during a checkpoint save")
  parser.add_argument("--interrupts", type=int, default=4, help="SIGINTs (Ctrl-C) per trainer after a logged "
                      "step; each must save and exit 130 with one line")
  parser.add_argument("--disk-fulls", type=int, default=4, help="launches per trainer whose disk fills at a "
                      "random moment (a tmpfs; needs root); each must exit 5 with one ENOSPC line or finish")
  parser.add_argument("--refusals", type=int, default=4, help="refused relaunches per trainer (a changed seed; a "
                      "model change whose checkpoint does not fit); each must leave the workdir byte-identical")
  parser.add_argument("--seed", type=int, default=0, help="seeds the order of the faults and their moments")
  parser.add_argument("--trainers", default="pretrain,grpo", help="comma-separated, of the registered trainers "
                      f"with a tiny run here: {', '.join(t for t in TRAINERS if t in COMMANDS)}")
  parser.add_argument("--root", default=None, help="a new or empty folder for the runs (default: a new temporary "
                      "folder); kept afterwards for inspection")
  args = parser.parse_args()
  if (unsupported := unsupported_trainers(args.trainers.split(","))) is not None:
    parser.error(unsupported)
  root = args.root or tempfile.mkdtemp(prefix="jaxpt_faults-")
  if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
    parser.error(f"--root {root}: not a new or empty folder (the tool writes its runs there and deletes nothing "
                 "it did not make)")
  faults = {"kills": args.kills, "interrupts": args.interrupts, "disk_fulls": args.disk_fulls,
            "refusals": args.refusals}
  ok = True
  for trainer in args.trainers.split(","):
    started = time.time()
    tally = run_trainer(trainer, faults, args.seed, root)
    tally["seconds"] = round(time.time() - started)
    tally["faults_survived"] = tally["sigkills"] + tally["interrupts"] + tally["disk_fulls"] + len(
        tally["corruptions"]) + (tally["quota_exit"] is not None)
    print(json.dumps(tally), flush=True)
    ok = ok and tally["bitwise_identical"] and not tally["unexpected"]
  print(json.dumps({"root": root, "bitwise_identical_finals": ok}), flush=True)
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
