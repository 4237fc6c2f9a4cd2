"""Sharded training on 8 simulated CPU devices: runs tests/multidevice/sharded_training.py (the shared step, state
layout, checkpoints across meshes; SiameseNorm on three of the four meshes `slow`), sharded_grpo.py (GRPO, CLIPO,
DAPO and a reward model end to end; ten of its eleven mesh x variant cases `slow`), sharded_vit.py (ViT and DiT
steps; `slow`), sharded_grpo_losses.py (every registered policy loss, bnpo and KDRL, 2 GRPO steps; `slow`),
sharded_ppo.py (PPO: policy, critic and its warm-up on three meshes; `slow`) and sharded_lora.py (LoRA and QLoRA on
a data x fsdp x tensor mesh vs one device, init_from a QLoRA run; `slow`), each in a fresh process.

XLA fixes the number of host devices when its backend starts, so those tests cannot share this process (or the
suite's): the subprocess sets XLA_FLAGS before importing jax and shares compiled work across its own tests.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# id -> (file in tests/multidevice, the marker expression it runs with ("" = all its tests), tests it must run)
SUITES = {"sharded_training.py": ("sharded_training.py", "not slow", 19),
          "sharded_training.py slow cases": ("sharded_training.py", "slow", 3),
          "sharded_grpo.py": ("sharded_grpo.py", "not slow", 5),
          "sharded_grpo.py slow cases": ("sharded_grpo.py", "slow", 11),
          "sharded_vit.py": ("sharded_vit.py", "", 6), "sharded_grpo_losses.py": ("sharded_grpo_losses.py", "", 10),
          "sharded_ppo.py": ("sharded_ppo.py", "", 3), "sharded_lora.py": ("sharded_lora.py", "", 2)}
# every policy loss x 2 GRPO runs: about 3 CPU-minutes; PPO on 3 meshes and one device: about 3 minutes on 2 cores;
# LoRA on 8 devices vs 1: about a minute; ViT and DiT: about a minute; ten of GRPO's eleven mesh x variant cases (the
# other: CLIPO with a reward model on fsdp_tp): about 4 minutes; SiameseNorm's training step on
# three of its four meshes: about 30 s; so `slow` (deselected by default in .ci/run)
SLOW = {"sharded_grpo_losses.py", "sharded_ppo.py", "sharded_lora.py", "sharded_vit.py", "sharded_grpo.py slow cases",
        "sharded_training.py slow cases"}


def run_suite(env, suite, marker, *args):
  selection = ["-m", marker] if marker else []
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *selection,
                         *args, os.path.join("tests", "multidevice", suite)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)


@pytest.mark.parametrize("suite", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SUITES])
def test_suite_on_8_devices(suite, tmp_path):
  file, marker, count = SUITES[suite]
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  env.pop("PYTEST_XDIST_WORKER", None)
  proc = run_suite(env, file, marker, "--basetemp", str(tmp_path / "basetemp"))
  summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
  # every selected test passed (none skipped or expected to fail), and at least as many as the suite must run
  passed = re.search(r"(\d+) passed", summary)
  assert passed and not re.search(r"skipped|xfail|xpass|error", summary), summary
  assert int(passed.group(1)) >= count, f"the 8-device {suite} ran too few tests: {summary}"
