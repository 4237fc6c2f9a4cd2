"""Sharded training on 8 simulated CPU devices: runs tests/multidevice/sharded_training.py (the shared step, state
layout, checkpoints across meshes), sharded_grpo.py (GRPO and CLIPO end to end), sharded_vit.py (ViT and DiT
steps), sharded_grpo_losses.py (every registered policy loss, bnpo and KDRL, 2 GRPO steps; `slow`) and
sharded_ppo.py (PPO: policy, critic and its warm-up on three meshes; `slow`) and sharded_lora.py (LoRA on a
data x fsdp x tensor mesh vs one device; `slow`), each in a fresh process.

XLA fixes the number of host devices when its backend starts, so those tests cannot share this process (or the
suite's): the subprocess sets XLA_FLAGS before importing jax and shares compiled work across its own tests.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# file in tests/multidevice -> tests it must collect
SUITES = {"sharded_training.py": 22, "sharded_grpo.py": 10, "sharded_vit.py": 6, "sharded_grpo_losses.py": 10,
          "sharded_ppo.py": 3, "sharded_lora.py": 1}
# every policy loss x 2 GRPO runs: about 3 CPU-minutes; PPO on 3 meshes and one device: about 3 minutes on 2 cores;
# LoRA on 8 devices vs 1: about a minute; so `slow` (deselected by default in .ci/run)
SLOW = {"sharded_grpo_losses.py", "sharded_ppo.py", "sharded_lora.py"}


def run_suite(env, suite, *args):
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args,
                         os.path.join("tests", "multidevice", suite)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)


@pytest.mark.parametrize("suite", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SUITES])
def test_suite_on_8_devices(suite, tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  env.pop("PYTEST_XDIST_WORKER", None)
  collected = re.search(r"(\d+) tests? collected", run_suite(env, suite, "--collect-only").stdout)
  proc = run_suite(env, suite, "--basetemp", str(tmp_path / "basetemp"))
  summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
  passed = re.search(r"(\d+) passed", summary)
  assert collected and int(collected.group(1)) >= SUITES[suite], f"the 8-device {suite} collected too few tests"
  assert passed and passed.group(1) == collected.group(1) and "skipped" not in summary, summary
