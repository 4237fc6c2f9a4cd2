"""Fault injection: kill, corrupt and starve tiny `jaxpt pretrain` and `jaxpt grpo` runs, then check that the final
params are bitwise those of an uninterrupted run.

    python tools/fault_injection.py [--kills 24] [--seed 0] [--trainers pretrain,grpo] [--root /tmp/jaxpt_faults]

For each trainer: one uninterrupted reference run; then, in a second workdir, the same command relaunched until it
finishes, each launch (seeded) either
  - SIGKILLed at a random moment of start-up (data, tokenizer, run record, compile), at a random moment after it
    logged a new step, or the moment a checkpoint save is under way (an `*.orbax-checkpoint-tmp*` folder exists),
    in turn;
  - once: the newest checkpoint is truncated before the relaunch (restore must fall back to the one before);
  - once: run under a 50 kB file-size limit (a full disk or quota): it must exit 5 with one line, leaving the good
    state;
and the final checkpoint's arrays are compared with the reference's. Prints one JSON tally per trainer and exits
non-zero on any mismatch or unexpected exit code.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUOTA = ("import os, resource, sys; limit = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, "
         "(limit, limit)); os.execv(sys.argv[2], sys.argv[2:])")
QUOTA_BYTES = 50_000  # below the micro model's checkpoint files: the next save fails as on a full disk
MICRO_MODEL = {"model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
               "model.num_kv_heads": 2, "model.mlp_dim": 64}
COMMANDS = {
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


def command(trainer: str, workdir: str) -> list[str]:
  config, overrides = COMMANDS[trainer]
  return [sys.executable, "-m", "jaxpt.cli", trainer, "--config", config, "--workdir", workdir,
          *(f"--config.{k}={v}" for k, v in overrides.items())]


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
  steps = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
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
  steps = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
  files = [f for f in glob.glob(os.path.join(workdir, "checkpoints", str(steps[-1]), "state", "**", "*"),
                                recursive=True) if os.path.isfile(f)]
  victim = max(files, key=os.path.getsize)
  os.truncate(victim, os.path.getsize(victim) // 2)
  return f"step {steps[-1]}: {os.path.relpath(victim, workdir)}"


def run_trainer(trainer: str, kills: int, seed: int, root: str) -> dict:
  reference, faulty = os.path.join(root, trainer, "reference"), os.path.join(root, trainer, "faulty")
  for d in (reference, faulty):
    shutil.rmtree(d, ignore_errors=True)
  done = subprocess.run(command(trainer, reference), cwd=ROOT, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"reference {trainer} run failed: {done.stderr[-2000:]}")
  rng = random.Random(seed)
  tally = {"trainer": trainer, "launches": 0, "sigkills": 0, "sigkills_during_save": 0, "corruptions": [],
           "quota_exit": None, "unexpected": []}
  argv = command(trainer, faulty)
  corrupt_at, quota_at = kills // 3, 2 * kills // 3
  while True:
    tally["launches"] += 1
    if tally["sigkills"] == quota_at and tally["quota_exit"] is None and glob.glob(os.path.join(faulty, "checkpoints",
                                                                                                 "[0-9]*")):
      starved = subprocess.run([sys.executable, "-c", QUOTA, str(QUOTA_BYTES), *argv], cwd=ROOT,
                               capture_output=True, text=True)
      lines = starved.stderr.strip().splitlines()
      tally["quota_exit"] = {"returncode": starved.returncode, "stderr_lines": len(lines),
                             "last_line": lines[-1][:200] if lines else ""}
      if starved.returncode not in (0, 5):
        tally["unexpected"].append(f"quota launch exited {starved.returncode}")
      continue
    if tally["sigkills"] >= kills:
      finished = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
      if finished.returncode != 0:
        tally["unexpected"].append(f"final launch exited {finished.returncode}: {finished.stderr[-500:]}")
      break
    if tally["sigkills"] == corrupt_at and not tally["corruptions"] and glob.glob(os.path.join(faulty, "checkpoints",
                                                                                                "[0-9]*")):
      tally["corruptions"].append(truncate_newest(faulty))
    mode = KILL_MODES[tally["launches"] % len(KILL_MODES)]
    outcome = launch_and_kill(argv, faulty, rng, mode)
    if outcome["killed"]:
      tally["sigkills"] += 1
      tally["sigkills_during_save"] += outcome["during_save"]
      tally[f"sigkills_{mode}"] = tally.get(f"sigkills_{mode}", 0) + 1
    elif outcome["returncode"] == 0:  # finished before the kill: start over in a fresh workdir, keep the tally
      tally["finished_before_kill"] = tally.get("finished_before_kill", 0) + 1
      shutil.rmtree(faulty)
    else:
      tally["unexpected"].append(f"exit {outcome['returncode']}: {outcome['stderr_tail']}")
      break
  ref_step, ref = final_arrays(reference)
  got_step, got = final_arrays(faulty)
  differing = sorted(k for k in ref if k not in got or ref[k].shape != got[k].shape or
                     not np.array_equal(ref[k], got[k]))
  tally.update(final_step=[ref_step, got_step], arrays=len(ref), arrays_differing=differing[:5],
               bitwise_identical=ref_step == got_step and not differing and ref.keys() == got.keys(),
               skipped_checkpoints=sorted(os.listdir(os.path.join(faulty, "checkpoints_skipped")))
               if os.path.isdir(os.path.join(faulty, "checkpoints_skipped")) else [])
  return tally


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kills", type=int, default=24)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--trainers", default="pretrain,grpo")
  parser.add_argument("--root", default="/tmp/jaxpt_faults")
  args = parser.parse_args()
  ok = True
  for trainer in args.trainers.split(","):
    started = time.time()
    tally = run_trainer(trainer, args.kills, args.seed, args.root)
    tally["seconds"] = round(time.time() - started)
    print(json.dumps(tally), flush=True)
    ok = ok and tally["bitwise_identical"] and not tally["unexpected"]
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
