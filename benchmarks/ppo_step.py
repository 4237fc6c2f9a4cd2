"""Seconds per PPO step split into its parts, beside a GRPO step on the same rollouts' shape, their compiled peak
memory per device, and the RM-reward variant's scoring cost. One JSON object.

    python -m benchmarks.ppo_step [--rounds 2] [--scheme pre] [--small] [--minibatches 2]
                                  [--peer-python /tmp/peers-venv/bin/python]

The d512 model of `benchmarks/grpo_step.py` (8 layers, SwiGLU 2048, vocab 8192; random init), 8 prompts x 8
rollouts (64 rows) of 64 prompt + 128 new tokens at temperature 1, two minibatches, one epoch, float32 rollouts,
in each trainer's own build (`jaxpt.build("grpo" | "ppo", ...)`). PPO: `experiments/configs/ppo_tiny.py` at these
sizes, group 8, the critic a `RewardModel` of the policy's size started from the policy's init (no
`ppo.critic_init`: the cost does not depend on the weights), rewarded by a reward model of the policy's size (the
`reward.model` source, `grpo_step.random_reward_model`) plus the verifier, KL to the reference (kl_coef 0.05); the
step after the value warm-up (policy and critic updated). One step is `train_step` from the same initial state each
time; the parts are:
- rollout: the sampler call (blocked on);
- reward: the rest of the rollouts' collection and the reward: decoding, verifier, the RM's scoring (PPO), the
  assembly; (GRPO: its `scoring`, which also holds its reference log-probs and advantages);
- reference: the reference policy's teacher-forced log-probs (PPO; GRPO's are in its `scoring`);
- values_gae: PPO's compiled experience (the critic's per-token values, the KL-shaped rewards, GAE, whitening);
- update: the minibatch updates (PPO: policy + critic in one shared step).
GRPO and PPO steps alternate, one each per round. `memory_mib`: the compiled per-device memory of each trainer's
update step (PPO's also its critic-only warm-up step) and rollout sampler (XLA's memory analysis). `rm_scoring`:
`grpo_step.rm_scoring_vs_reference` on the GRPO run's rollouts. `uptime`: the load average when the run ended (the
machine is shared: every figure here is a ratio of peers timed in alternation, or a wall time under that load).
--small: the d256 / 4-layer model, 4 prompts x 4 rollouts, 64 + 32 tokens (a labelled smaller point).
--minibatches N: updates of 64 / N rows (both trainers). `peak_rss_mib`: the process's peak resident memory (both
builds). --memory-only: both builds' `memory_mib` alone, nothing run (`results_ppo_step_memory_cpu.json`). Before
PPO's update computed its two models' gradients one after the other (`ppo.sequenced_grad_fn`), its compiled peak at
the d512 point held both models' activations at once (read from the compiled memory analysis at e20806b, not kept
in a results file; now 5986 MiB against GRPO's 5242 MiB, `results_ppo_step_memory_cpu.json`) and
the process was killed by the kernel's OOM killer on the shared 23 GB machine (10.7 GB resident with 32-row updates,
11.8 GB with 16-row ones). With it, the full d512 run (`--rounds 2`, at 70d3393) was still killed, at 13.9 GB
resident: its resident memory, polled every 5 s, grew through the run (3.4, 7.7, 8.2, 9.8, 11.6, 13.5 GB), far
above the compiled peaks. The cause was the host allocator's reuse settings (`jaxpt/host_allocator.py`: no mmap,
no trimming, so the heap only grows and fragments between programs of different buffer sizes): with
`JAXPT_KEEP_MALLOC=1` the same run peaked at 9.7 GB resident and finished (`results_ppo_step_cpu.json`), and the
allocator now has a pressure valve that trims the heap when the machine runs short. `results_ppo_step_small_cpu.json`
holds the --small point.

--peer-python (a venv with google-tunix 0.1.7): `benchmarks/tunix_ppo_update.py` times tunix's PPO update of one
minibatch (64 / N rows at the point's sizes) in a persistent process, one call per round after that round's GRPO
and PPO steps. What each side's update holds:
- jaxpt (`ppo_step.update_s`): `PPOHooks._updates`, the N minibatch updates of one step, each the rows' gather
  (`take_rows`) and one compiled train step: the critic's clipped value loss and gradient, then the policy's
  ppo_clip loss and gradient (`sequenced_grad_fn`), each model's global-norm clip and AdamW; then the metrics'
  fetch to the host;
- tunix (per call): one minibatch of `PPOLearner`'s two trainers, its actor's jitted train step (`ppo` policy loss,
  clipped ratio, per-token advantages, gradient, global norm, clip + AdamW) then its critic's (`ppo` clipped value
  loss on `create_critic_model`'s value head, same), blocked on; without its trainers' host loop (batching,
  metrics logging), which jaxpt's side includes in its small gather and metrics fetch.
Both: per-token advantages / returns / old values as inputs (GAE is in jaxpt's `values_gae`, outside its update),
the KL in the rewards (none in either loss), no entropy term, fp32, tied policy embeddings, a critic of the
policy's size. `update_vs_tunix` is the median over rounds of N x tunix's seconds / jaxpt's update seconds in the
same round (> 1: jaxpt faster); `tunix_update_s_per_minibatch` the median of tunix's calls. The --small point with
it is `results_ppo_step_small_tunix_cpu.json`; the d512 point is the same command without --small (on CPU it needs
the ~10 GB of the d512 run plus tunix's, so not run beside other jobs on the shared machine).
"""

from __future__ import annotations

import jaxpt
from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import jax

from benchmarks import grpo_step
from benchmarks.common import Peer
from benchmarks.grpo_step import clocked, fresh, random_reward_model, rm_scoring_vs_reference, timed_trainer
from experiments.configs import ppo_tiny
from jaxpt.engine.run import BuiltRun
from jaxpt.parallel import compiled_memory
from jaxpt.rl.reward_sources import assemble_rewards

SMALL = dict(vocab_size=8192, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=1024, max_seq_len=512,
             tie_embeddings=True)
PPO_KL = 0.05
TUNIX_SCRIPT = pathlib.Path(__file__).resolve().parent / "tunix_ppo_update.py"


def sizes(small: bool) -> dict:
  """The benchmark's model and rollout sizes (the default d512 point, or --small)."""
  if small:
    return dict(model=SMALL, prompts=4, group=4, prompt_len=64, new_tokens=32)
  return dict(model=grpo_step.MODEL, prompts=grpo_step.PROMPTS, group=grpo_step.GROUP,
              prompt_len=grpo_step.PROMPT_LEN, new_tokens=grpo_step.NEW_TOKENS)


def shared_fields(size: dict, scheme: str) -> dict:
  return {**{f"model.{k}": v for k, v in dict(size["model"], norm_scheme=scheme).items()},
          "init_from": "", "steps": 4, "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False,
          "task.train_size": 512, "data.prompts_per_step": size["prompts"], "data.max_prompt_len": size["prompt_len"],
          "data.eval_prompts": 0, "sampling.max_new_tokens": size["new_tokens"]}


def grpo_config(size: dict, scheme: str, minibatches: int):
  config = grpo_step.grpo_tiny.get_config()
  config.update_from_flattened_dict({**shared_fields(size, scheme), "grpo.group_size": size["group"],
                                     "grpo.minibatches": minibatches, "grpo.epochs": 1,
                                     "grpo.kl_coef": 0.001})
  return config


def ppo_config(size: dict, scheme: str, minibatches: int):
  config = ppo_tiny.get_config()
  config.update_from_flattened_dict({**shared_fields(size, scheme), "ppo.group_size": size["group"],
                                     "ppo.minibatches": minibatches, "ppo.epochs": 1,
                                     "ppo.value_warmup_steps": 1, "ppo.kl_coef": PPO_KL})
  return config


def with_reward_model(trainer: BuiltRun) -> BuiltRun:
  """`trainer` (PPO) rewarded by `random_reward_model` and its verifier: reward.model set in its config (a label:
  the source is given here, not loaded), the assembly compiled for that section."""
  config = trainer.config
  reward = dataclasses.replace(config.reward, model="(random, the policy's size)")
  config = dataclasses.replace(config, reward=reward)
  layout = trainer.training.layout
  assemble = layout.jit(lambda *arrays: assemble_rewards(reward, *arrays), layout.replicated)
  hooks = dataclasses.replace(trainer.hooks, config=config, assemble=assemble,
                              reward_model=random_reward_model(trainer))
  return dataclasses.replace(trainer, config=config, hooks=hooks)


def timed_ppo(trainer: BuiltRun, clock: collections.Counter) -> BuiltRun:
  """`trainer` (PPO) whose sampler, reference log-probs, experience and updates add their seconds to `clock`."""
  hooks, collector = trainer.hooks, trainer.hooks.collector
  collector = dataclasses.replace(collector, sample=clocked(clock, "rollout", collector.sample),
                                  logprobs=clocked(clock, "reference", collector.logprobs))
  hooks = dataclasses.replace(hooks, collector=collector, experience=clocked(clock, "values_gae", hooks.experience))
  object.__setattr__(hooks, "_updates", clocked(clock, "update", hooks._updates))
  return dataclasses.replace(trainer, hooks=hooks)


def step_parts(trainer: BuiltRun, clock: collections.Counter, state, batch, parts: tuple[str, ...]) -> dict:
  """Seconds of one `trainer.train_step` from a copy of `state`: the step, the clocked `parts`, and 'reward' the
  rest (GRPO: 'scoring', as grpo_step names it)."""
  state = fresh(state)
  clock.clear()
  start = time.perf_counter()
  _, metrics = trainer.train_step(state, batch)
  total = time.perf_counter() - start
  out = {"step": total, **{p: clock[p] for p in parts}}
  rest = "scoring" if trainer.trainer == "grpo" else "reward"
  out[rest] = total - sum(clock[p] for p in parts)
  out["response_length"] = float(metrics["response_length"])
  return out


def summary(rs: list[dict]) -> dict:
  med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
  entry = {f"{k}_s": round(v, 2) for k, v in med.items() if k != "response_length"}
  entry["share"] = {k: round(v / med["step"], 3) for k, v in med.items() if k not in ("step", "response_length")}
  entry["response_length"] = med["response_length"]
  return entry


def memory(trainer: BuiltRun) -> dict:
  """Compiled peak memory per device (MiB) of the update step(s) and the rollout sampler."""
  out = {"update_step_peak_mib": round(trainer.training.memory.get("peak_mib", float("nan")), 1),
         "sampler_peak_mib": round(trainer.hooks.collector.sampler_memory.get("peak_mib", float("nan")), 1)}
  warmup = getattr(trainer.hooks, "warmup_step", None)
  if warmup is not None and hasattr(warmup, "memory_analysis"):
    out["critic_warmup_step_peak_mib"] = round(compiled_memory(warmup).get("peak_mib", float("nan")), 1)
  return out


def memory_only(args: argparse.Namespace, size: dict) -> None:
  """--memory-only: both builds' compiled memory (`memory`) and the process's peak RSS, nothing run."""
  with tempfile.TemporaryDirectory() as workdir:
    mem = {"grpo": memory(jaxpt.build("grpo", grpo_config(size, args.scheme, args.minibatches),
                                      os.path.join(workdir, "grpo"))),
           "ppo": memory(jaxpt.build("ppo", ppo_config(size, args.scheme, args.minibatches),
                                     os.path.join(workdir, "ppo")))}
  report = {"benchmark": "ppo_step", "point": "small (--small)" if args.small else "default (d512)",
            "config": dict(size["model"], norm_scheme=args.scheme, prompts=size["prompts"], group=size["group"],
                           prompt_len=size["prompt_len"], new_tokens=size["new_tokens"], minibatches=args.minibatches),
            "device": str(jax.devices()[0]), "jax": jax.__version__,
            "command": " ".join(["python -m benchmarks.ppo_step"] + sys.argv[1:]), "memory_mib": mem,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
  json.dump(report, sys.stdout, indent=2)
  print()


def tunix_peer(python: str, size: dict, minibatches: int) -> Peer:
  """`tunix_ppo_update.py` in `python`'s venv on one minibatch at `size` (started now, compiling meanwhile)."""
  model = size["model"]
  rows = size["prompts"] * size["group"] // minibatches
  sizes = (rows, size["prompt_len"], size["new_tokens"], model["d_model"], model["num_layers"], model["num_heads"],
           model["num_kv_heads"])
  return Peer("tunix_ppo_update", [python, str(TUNIX_SCRIPT), *map(str, sizes)])


def update_vs_tunix(tunix_seconds: list[float], ppo_rounds: list[dict], minibatches: int) -> float:
  """Median over rounds of `minibatches` x tunix's seconds for one minibatch / jaxpt's update seconds for the
  step's `minibatches`, paired round by round."""
  return statistics.median(minibatches * t / r["update"] for t, r in zip(tunix_seconds, ppo_rounds, strict=True))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--scheme", default="pre")
  parser.add_argument("--small", action="store_true", help="the smaller labelled point (see the module doc)")
  parser.add_argument("--minibatches", type=int, default=grpo_step.MINIBATCHES, help="updates per step (both)")
  parser.add_argument("--memory-only", action="store_true", help="build both, report memory_mib, run nothing")
  parser.add_argument("--peer-python", default="", help="python of a venv with google-tunix 0.1.7")
  args = parser.parse_args(argv)
  size = sizes(args.small)
  if args.memory_only:
    return memory_only(args, size)
  tunix = tunix_peer(args.peer_python, size, args.minibatches) if args.peer_python else None
  tunix_seconds = []
  with tempfile.TemporaryDirectory() as workdir:
    grpo = jaxpt.build("grpo", grpo_config(size, args.scheme, args.minibatches), os.path.join(workdir, "grpo"))
    ppo = with_reward_model(jaxpt.build("ppo", ppo_config(size, args.scheme, args.minibatches),
                                        os.path.join(workdir, "ppo")))
    grpo_state, batch = grpo.init_state(), grpo.hooks.collector.prompts.batch(0)
    ppo_state = ppo.init_state().replace(step=jax.numpy.asarray(1, jax.numpy.int32))  # after the value warm-up
    clock = collections.Counter()
    grpo_timed = timed_trainer(grpo, clock, "float32")
    ppo_timed = timed_ppo(ppo, clock)
    grpo_timed.train_step(fresh(grpo_state), batch)  # warm-up: compiles what the build left to the first call
    ppo_timed.train_step(fresh(ppo_state), batch)
    if tunix:
      tunix.wait_ready()
    results = {"grpo": [], "ppo": []}
    for r in range(args.rounds):
      results["grpo"].append(step_parts(grpo_timed, clock, grpo_state, batch, ("rollout", "update")))
      results["ppo"].append(step_parts(ppo_timed, clock, ppo_state, batch,
                                       ("rollout", "reference", "values_gae", "update")))
      if tunix:
        tunix_seconds.append(tunix.seconds(r + 1))
    if tunix:
      tunix.close()
    rm_scoring = rm_scoring_vs_reference(grpo, grpo_state, batch, max(3, args.rounds))
    mem = {"grpo": memory(grpo), "ppo": memory(ppo)}

  config = dict(size["model"], norm_scheme=args.scheme, prompts=size["prompts"], group=size["group"],
                prompt_len=size["prompt_len"], new_tokens=size["new_tokens"], minibatches=args.minibatches,
                epochs=1, grpo_kl_coef=0.001, ppo_kl_coef=PPO_KL, rounds=args.rounds, rollout_dtype="float32")
  report = {"benchmark": "ppo_step", "point": "small (--small)" if args.small else "default (d512)",
            "config": config, "device": str(jax.devices()[0]), "jax": jax.__version__, "cpu_count": os.cpu_count(),
            "command": " ".join([f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("JAXPT_")]
                                + ["python -m benchmarks.ppo_step"] + sys.argv[1:]),
            "host_allocator_reuse": allocator_reuse,
            "grpo_step": summary(results["grpo"]), "ppo_step": summary(results["ppo"]),
            "ppo_over_grpo_step": round(statistics.median(p["step"] / g["step"] for p, g in
                                                          zip(results["ppo"], results["grpo"])), 2),
            "memory_mib": mem, "rm_scoring": rm_scoring,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "note": "a machine shared with other agents' jobs: wall times carry their load (see uptime)"}
  if tunix:
    report["ppo_step"]["update_vs_tunix"] = round(update_vs_tunix(tunix_seconds, results["ppo"], args.minibatches), 2)
    report["tunix_update_s_per_minibatch"] = round(statistics.median(tunix_seconds), 3)
    report["tunix_peer"] = {"params": tunix.params, "setting": tunix.setting, "script": TUNIX_SCRIPT.name,
                            "rows_per_minibatch": size["prompts"] * size["group"] // args.minibatches}
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
