"""Two local processes under jax.distributed (CPU, gloo collectives) run `jaxpt pretrain`, and GRPO, on a 2 x 2
device mesh (data over processes, fsdp within) and end where a single-process run does.

Each process reads only its half of every global batch; both write one shared (sharded) checkpoint. A SIGTERM to
one process stops both at the same step (jax's preemption service), with that step checkpointed.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jaxpt
from jaxpt.trainers.grpo import replace_hooks
from jaxpt.engine.checkpoint import Checkpointer
from jaxpt.engine.metrics import read_metrics
from tests.micro_grpo import MULTI_PROCESS, even_length
from tests.micro_grpo import micro_config as micro_grpo_config
from tests.test_train_pretrain import MICRO, ROOT, TINY, micro_config
from tests.xla_flags import suite_xla_flags

RUN = {"steps": 3, "log_every": 1, "eval_every": 3, "checkpoint_every": 0}
XLA_FLAGS = suite_xla_flags(host_devices=2)  # 2 host devices per process, compiled as the suite compiles


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _command(workdir, port, process_id, **extra):
  overrides = [f"--config.{k}={v}" for k, v in {**MICRO, **RUN, "mesh.fsdp": 2, **extra}.items()]
  return [sys.executable, "-m", "jaxpt.cli", "pretrain", "--config", TINY, *overrides, "--workdir", workdir,
          f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={process_id}"]


def test_two_processes_match_one(tmp_path):
  config = micro_config(**RUN)
  single_dir = str(tmp_path / "single")
  want = jaxpt.train("pretrain", config, single_dir).state
  multi_dir = str(tmp_path / "multi")
  for cached in ("tokenizer", "data", "tfds"):  # prepared data, so the two processes only read it
    shutil.copytree(os.path.join(single_dir, cached), os.path.join(multi_dir, cached))

  port = _free_port()
  env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, PYTHONPATH=ROOT)
  procs = [subprocess.Popen(_command(multi_dir, port, i), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  outputs = []
  for proc in procs:
    try:
      outputs.append(proc.communicate(timeout=420))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0, err[-4000:]
    assert f"process {i} of 2, 4 devices, mesh data=2 fsdp=2 tensor=1" in out, out
    assert "finished step 3" in out, out

  rows = read_metrics(multi_dir)
  single_rows = read_metrics(single_dir)
  assert [r["step"] for r in rows] == [1, 2, 3]  # process 0 alone writes metrics
  for key in ("loss", "grad_norm", "eval_loss"):
    np.testing.assert_allclose([r[key] for r in rows if key in r], [r[key] for r in single_rows if key in r],
                               rtol=2e-5, err_msg=key)
  checkpointer = Checkpointer(multi_dir)
  assert checkpointer.latest_step() == 3
  got = checkpointer.restore_latest(want)  # onto this process's single device
  checkpointer.close()
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path[0]))


def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path):
  """jax's preemption service spreads one host's SIGTERM: both processes checkpoint the same step and exit."""
  config = micro_config(**RUN)
  single_dir = str(tmp_path / "single")
  jaxpt.build("pretrain", config, single_dir)  # prepares the data cache only
  multi_dir = str(tmp_path / "multi")
  for cached in ("tokenizer", "data", "tfds"):
    shutil.copytree(os.path.join(single_dir, cached), os.path.join(multi_dir, cached))
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, PYTHONPATH=ROOT)
  long_run = {"steps": 100000, "eval_every": 0}
  procs = [subprocess.Popen(_command(multi_dir, port, i, **long_run), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    metrics = os.path.join(multi_dir, "metrics.jsonl")
    deadline = time.time() + 240
    while not (os.path.exists(metrics) and os.path.getsize(metrics)):
      assert time.time() < deadline and all(p.poll() is None for p in procs), "no metrics row within 240 s"
      time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=240) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  steps = []
  for proc, (out, err) in zip(procs, outputs):
    assert proc.returncode == 75, err[-4000:]  # EXIT_PREEMPTED
    found = re.search(r"SIGTERM at step (\d+)", out)
    assert found, out + err[-2000:]
    steps.append(int(found.group(1)))
  assert steps[0] == steps[1] and steps[0] < long_run["steps"], steps
  checkpointer = Checkpointer(multi_dir)
  assert checkpointer.latest_step() == steps[0]
  checkpointer.close()


GRPO_PROCESS = os.path.join(ROOT, "tests", "multidevice", "grpo_process.py")


def _launch_grpo(workdir):
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  return [subprocess.Popen([sys.executable, GRPO_PROCESS, str(i), str(port), workdir], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]


def _finish(procs, timeout=420):
  outputs = []
  try:
    outputs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return outputs


def _final_params(workdir, template):
  checkpointer = Checkpointer(workdir)
  state = checkpointer.restore_latest(template)  # onto this process's single device
  checkpointer.close()
  return jax.tree.map(np.asarray, state)


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
  """The micro GRPO run on one device and on two processes (data=2 over them x fsdp=2 within).
  -> (trainer, single-device final state, multi-process workdir, single-device workdir)."""
  tmp_path = tmp_path_factory.mktemp("grpo")
  single_dir, multi_dir = str(tmp_path / "single"), str(tmp_path / "multi")
  config = micro_grpo_config(**dict(MULTI_PROCESS, **{"mesh.data": 1, "mesh.fsdp": 1}))  # one device
  trainer = replace_hooks(jaxpt.build("grpo", config, single_dir), reward_fn=even_length)
  want = jax.tree.map(np.asarray, jaxpt.train("grpo", trainer.config, single_dir, built=trainer).state)
  procs = _launch_grpo(multi_dir)
  for i, (proc, (out, err)) in enumerate(zip(procs, _finish(procs))):
    assert proc.returncode == 0, err[-4000:]
    assert f"process {i} of 2, 4 devices, mesh data=2 fsdp=2 tensor=1" in out, out
    assert "finished step 3" in out, out
  return trainer, want, multi_dir, single_dir


def test_two_processes_run_grpo_like_one(grpo_runs):
  """Issue 14: data=2 over the processes x fsdp=2 within; epochs 2 x minibatches 2; each process samples and
  verifies its own prompts."""
  trainer, want, multi_dir, single_dir = grpo_runs
  rows, single_rows = read_metrics(multi_dir), read_metrics(single_dir)
  assert [r["step"] for r in rows] == [1, 2, 3] and 0 < single_rows[0]["accuracy"] < 1
  for key in ("reward_mean", "accuracy", "loss", "pg_loss", "grad_norm", "eval_accuracy_test"):
    np.testing.assert_allclose([r[key] for r in rows if key in r], [r[key] for r in single_rows if key in r],
                               rtol=2e-5, atol=1e-6, err_msg=key)
  got = _final_params(multi_dir, trainer.init_state())
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path[0]))


@pytest.mark.slow  # two more two-process launches (~50 s); every trainer's single-process resume stays default
def test_a_killed_two_process_grpo_run_resumes_bitwise(grpo_runs, tmp_path):
  """A launch SIGKILLed after its first checkpoint and relaunched ends bitwise where the uninterrupted two-process
  run does (data position, sampling keys, minibatch order)."""
  trainer, _, multi_dir, _ = grpo_runs
  killed_dir = str(tmp_path / "killed")
  killed = _launch_grpo(killed_dir)
  first = os.path.join(killed_dir, "checkpoints", "1", "manifest.json")
  deadline = time.time() + 420
  while not os.path.exists(first):
    assert time.time() < deadline and all(p.poll() is None for p in killed), "no checkpoint of step 1"
    time.sleep(0.05)
  for p in killed:
    p.send_signal(signal.SIGKILL)
  _finish(killed)
  resumed = _launch_grpo(killed_dir)
  for proc, (out, err) in zip(resumed, _finish(resumed)):
    assert proc.returncode == 0, err[-4000:]
    assert "finished step 3" in out, out
  got = _final_params(multi_dir, trainer.init_state())
  again = _final_params(killed_dir, trainer.init_state())
  for g, w in zip(jax.tree.leaves(again), jax.tree.leaves(got)):
    np.testing.assert_array_equal(g, w)
  assert [r["pg_loss"] for r in read_metrics(killed_dir)][-1] == read_metrics(multi_dir)[-1]["pg_loss"]
