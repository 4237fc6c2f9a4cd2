"""Seconds per GRPO step, split into rollout / scoring / update, beside tunix's `grpo_loss_fn` update. One JSON
object.

    python -m benchmarks.grpo_step [--peer-python /tmp/peers-venv/bin/python] [--rounds 3] [--scheme pre]
                                   [--rm-reward]
    python -m benchmarks.grpo_step --point realistic [--model small] [--minibatches 8] [--rounds 2]
                                   [realistic point flags: --prompts 32 --group 8 ... as benchmarks/engine.py]

The d512 model of the other benchmarks (8 layers, 8 heads with 4 KV heads, SwiGLU 2048, vocab 8192, tied;
random init) in `jaxpt grpo`'s own trainer (`jaxpt.build("grpo", ...)` on `experiments/configs/grpo_tiny.py` with
these sizes):
8 prompts x 8 rollouts (64 rows), prompts left-padded to 64 tokens, 128 new tokens at temperature 1, two
minibatches (two updates of 32 rows, as grpo_tiny; one update of all 64 rows took > 9 GB here and was killed),
KL to the reference policy (kl_coef 0.001). One step is
`GRPOHooks.train_step` from the same initial state every time (so every round does the same work):
- rollout: the sampler call (`trainer.hooks.collector.sample`, blocked on);
- update: the policy update(s) (`_policy_updates`: the shared, jitted train step);
- scoring: the rest: decoding texts, verifier rewards, reference log-probs (teacher forcing), advantages, and with
  bf16 rollouts the fp32 old log-probs (teacher forcing).
Both rollout dtypes (`sampling.rollout_dtype` float32 and bfloat16) are timed. With --peer-python (a venv with
google-tunix 0.1.7), `benchmarks/tunix_grpo_update.py` times tunix's update of one such minibatch (32 rows of
64 + 128 tokens) in a persistent process, one call per round in alternation with jaxpt's steps;
`update_vs_tunix` is the median over rounds of 2 x tunix's update seconds / jaxpt's update seconds per step.

With --rm-reward the report gains `rm_scoring` (`rm_scoring_vs_reference`): the RM-reward variant's extra cost,
scoring one step's rollouts (64 rows) with a reward model of the policy's size (`RewardModelSource`, the rollouts'
own tokens, compiled on the run's mesh as `reward.model` is) against the reference policy's teacher-forced forward
(`collector.logprobs`) on the same rows, in alternation (goal: rm / reference <= 1.3).

`--point realistic` (issue 29): the step at the realistic point of `benchmarks/realistic.py` (B = --prompts prompts
of --min-prompt .. --max-prompt tokens x G = --group rollouts, answers of pre-drawn long-tailed lengths up to
--max-new tokens, each row ended at its length: a token budget both samplers honour; the model `--model`) with its
rollouts from the static sampler and from the rollout engine (--slots slots, pages of --page-size), the two steps
alternated; fp32; --minibatches updates a step. Per system the step split as above and its shares, and
`step_speedup_vs_static` (median over rounds of static step / engine step): the rollout's share of the step
before (static) and after (engine). The verifier scores the random policy's text (all 0 here): the update's work
does not depend on the rewards.
"""

from __future__ import annotations

import jaxpt
from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import collections
import dataclasses
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable

import jax
import numpy as np
import jax.numpy as jnp

from benchmarks import realistic
from benchmarks.common import Peer, alternating_seconds, machine_info, median_ratio
from benchmarks.train_step import MODEL
from experiments.configs import grpo_tiny
from jaxpt.models.reward import RewardModel
from jaxpt.parallel import get_rules, param_shardings
from jaxpt.rl.reward_sources import RewardModelSource
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.sampler import make_sampler
from jaxpt.engine.run import BuiltRun
from jaxpt.trainers.grpo import replace_hooks

PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS, MINIBATCHES = 8, 8, 64, 128, 2
TUNIX_SCRIPT = pathlib.Path(__file__).resolve().parent / "tunix_grpo_update.py"


def grpo_config(scheme: str, model: dict = MODEL, prompts: int = PROMPTS, group: int = GROUP,
                prompt_len: int = PROMPT_LEN, new_tokens: int = NEW_TOKENS, minibatches: int = MINIBATCHES):
  config = grpo_tiny.get_config()
  config.update_from_flattened_dict({
      **{f"model.{k}": v for k, v in dict(model, norm_scheme=scheme).items()},
      "init_from": "", "steps": 1, "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False,
      "task.train_size": 512, "data.prompts_per_step": prompts, "data.max_prompt_len": prompt_len,
      "data.eval_prompts": 0, "sampling.max_new_tokens": new_tokens, "grpo.group_size": group,
      "grpo.minibatches": minibatches, "grpo.epochs": 1, "grpo.kl_coef": 0.001})
  return config


def clocked(clock: collections.Counter, name: str, fn):
  """`fn` whose calls add their seconds (outputs blocked on) to `clock[name]`."""

  def call(*args, **kwargs):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    clock[name] += time.perf_counter() - start
    return out

  return call


def timed_trainer(trainer: BuiltRun, clock: collections.Counter, rollout_dtype: str,
                  sampler_of: Callable | None = None) -> BuiltRun:
  """`trainer` sampling in `rollout_dtype`, whose sampler calls and policy updates add their seconds to `clock`;
  sampler_of(sampling) -> its sampler (default: the static sampler, `make_sampler`)."""
  sampling = dataclasses.replace(trainer.config.sampling, rollout_dtype=rollout_dtype,
                                 eos_id=trainer.tokenizer.eos_id, pad_id=trainer.tokenizer.pad_id)
  sampler = sampler_of(sampling) if sampler_of else make_sampler(
      trainer.config.model, sampling, trainer.config.data.max_prompt_len, group_size=trainer.config.grpo.group_size)
  timed = replace_hooks(trainer, sample=clocked(clock, "rollout", sampler),
                        config=dataclasses.replace(trainer.config, sampling=sampling))
  object.__setattr__(timed.hooks, "_policy_updates", clocked(clock, "update", timed.hooks._policy_updates))
  return timed


def fresh(state):
  """A copy of `state` for one step: on accelerators the step donates its input state, so each timed step starts
  from its own copy of the same state (the copy is made outside the timed region)."""
  return jax.block_until_ready(jax.tree.map(jnp.copy, state))


def timed_step(trainer: BuiltRun, clock: collections.Counter, state, batch) -> dict:
  """Seconds of one `trainer.train_step` (a `timed_trainer`) from a copy of `state` (left intact): step, rollout,
  update and scoring (the rest), and its mean response length."""
  state = fresh(state)
  clock.clear()
  start = time.perf_counter()
  _, metrics = trainer.train_step(state, batch)
  total = time.perf_counter() - start
  return {"step": total, "rollout": clock["rollout"], "update": clock["update"],
          "scoring": total - clock["rollout"] - clock["update"], "response_length": float(metrics["response_length"])}


def random_reward_model(trainer: BuiltRun, seed: int = 1) -> RewardModelSource:
  """A reward-model source of the policy's size and tokenizer (random init: the cost does not depend on the
  weights), params sharded by the run's rules on its mesh, reading the rollouts' own tokens."""
  config, layout = trainer.config, trainer.training.layout
  module = RewardModel(config.model, num_scores=1)
  args = (jnp.zeros((1, 8), jnp.int32), jnp.zeros((1,), jnp.int32))
  boxed = jax.eval_shape(module.init, jax.random.PRNGKey(seed), *args)["params"]
  shardings = param_shardings(boxed, layout.mesh, get_rules(config.mesh.rules))
  params = jax.jit(lambda rng: module.init(rng, *args)["params"], out_shardings=shardings)(jax.random.PRNGKey(seed))
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, params)
  return RewardModelSource.create(config.model, params, 1, trainer.tokenizer, "plain", trainer.tokenizer, "plain",
                                  layout, config.data.max_prompt_len, config.sampling.max_new_tokens,
                                  source="(random, the policy's size)")


def rm_scoring_vs_reference(trainer: BuiltRun, state, batch, rounds: int) -> dict:
  """Seconds to score one step's rollouts with `random_reward_model` (its compaction into the RM's layout, the
  forward, the scores to the host) vs the reference policy's teacher-forced log-probs of the same rows, medians
  over `rounds` alternated calls after one warm-up each; `rm_over_reference` is the median of the per-round
  ratios."""
  collector = trainer.hooks.collector
  ro = collector.rollouts(state.params, batch, jax.random.PRNGKey(0))
  source = random_reward_model(trainer)
  inputs = [ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")]
  times = alternating_seconds({"rm": lambda: source.scores(ro, batch["questions"]),
                               "reference": lambda: collector.logprobs(state.params, *inputs)}, rounds)
  med = {k: statistics.median(v) for k, v in times.items()}
  return {"rows": int(ro["tokens"].shape[0]), "rm_seq_len": source.seq_len, "rm_s": round(med["rm"], 3),
          "reference_s": round(med["reference"], 3),
          "rm_over_reference": round(median_ratio(times["rm"], times["reference"]), 3), "goal": "<= 1.3"}


def realistic_step(args) -> dict:
  """The GRPO step at issue 29's realistic point (`--point realistic`, see the module doc): the static sampler and
  the rollout engine, each forcing the point's answer lengths, timed in alternation -> the report."""
  model = realistic.MODELS[args.model]
  config = grpo_config(args.scheme, model, args.prompts, args.group, args.max_prompt, args.max_new,
                       args.minibatches)
  tokens, mask, budgets = realistic.realistic_rows(args, model["vocab_size"])
  batch = {"prompt_tokens": tokens[::args.group], "prompt_mask": mask[::args.group],
           "answers": ["0"] * args.prompts, "questions": [""] * args.prompts}
  engine = EngineConfig(num_slots=args.slots, page_size=args.page_size)
  forced = lambda sample: (lambda params, tokens, mask, rng: sample(params, tokens, mask, rng, budgets))
  with tempfile.TemporaryDirectory() as workdir:
    base = jaxpt.build("grpo", config, workdir)
    model_config = base.config.model
    systems = {  # sampling -> a sampler of the trainer's signature that ends row b after budgets[b] tokens
        "static": lambda s: forced(make_sampler(model_config, s, args.max_prompt, group_size=args.group,
                                                row_keys=True)),
        "engine": lambda s: forced(Engine(model_config, s, args.max_prompt, engine, args.group))}
    state, clock = base.init_state(), collections.Counter()
    trainers = {name: timed_trainer(base, clock, "float32", of) for name, of in systems.items()}
    for trainer in trainers.values():  # warm-up: compiles both samplers
      trainer.train_step(fresh(state), batch)
    results = {name: [] for name in trainers}
    for _ in range(args.rounds):
      for name, trainer in trainers.items():
        results[name].append(timed_step(trainer, clock, state, batch))
  report = {"benchmark": "grpo_step", "point": "realistic",
            "config": dict(model, model=args.model, norm_scheme=args.scheme, prompts=args.prompts, group=args.group,
                           prompt_len=[args.min_prompt, args.max_prompt], new_tokens_max=args.max_new,
                           new_tokens_median=float(np.median(budgets)), rollout_tokens=int(budgets.sum()),
                           minibatches=args.minibatches, slots=args.slots, page_size=args.page_size,
                           rounds=args.rounds),
            **{name: step_summary(rs) for name, rs in results.items()}}
  report["engine"]["step_speedup_vs_static"] = round(statistics.median(
      s["step"] / e["step"] for s, e in zip(results["static"], results["engine"])), 3)
  return report


def step_summary(rounds: list[dict]) -> dict:
  """Medians over rounds of `timed_step`'s seconds, each part's share of the step, and every round's seconds."""
  med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
  entry = {f"{k}_s": round(v, 3) for k, v in med.items() if k != "response_length"}
  entry["share"] = {k: round(med[k] / med["step"], 3) for k in ("rollout", "scoring", "update")}
  entry["response_length"] = med["response_length"]
  entry["rounds_s"] = [{k: round(v, 3) for k, v in r.items() if k != "response_length"} for r in rounds]
  return entry


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--scheme", default="pre")
  parser.add_argument("--peer-python", default="", help="python of a venv with google-tunix 0.1.7")
  parser.add_argument("--rm-reward", action="store_true", help="also time RM scoring vs the reference forward")
  parser.add_argument("--point", choices=("fixed", "realistic"), default="fixed")
  parser.add_argument("--minibatches", type=int, default=8, help="the realistic point's updates per step")
  realistic.add_flags(parser)
  args = parser.parse_args(argv)
  if args.point == "realistic":
    report = dict(realistic_step(args), **machine_info(),
                  command=" ".join(["python -m benchmarks.grpo_step"] + sys.argv[1:]))
    json.dump(report, sys.stdout, indent=2)
    print()
    return
  rows = PROMPTS * GROUP // MINIBATCHES
  tunix = (Peer("tunix_update", [args.peer_python, str(TUNIX_SCRIPT), str(rows), str(PROMPT_LEN), str(NEW_TOKENS)])
           if args.peer_python else None)
  with tempfile.TemporaryDirectory() as workdir:
    base = jaxpt.build("grpo", grpo_config(args.scheme), workdir)
    state, batch = base.init_state(), base.hooks.collector.prompts.batch(0)
    clock = collections.Counter()
    trainers = {dtype: timed_trainer(base, clock, dtype) for dtype in ("float32", "bfloat16")}
    for trainer in trainers.values():  # warm-up: compiles what the build left to the first call
      trainer.train_step(fresh(state), batch)
    if tunix:
      tunix.wait_ready()
    results = {dtype: [] for dtype in trainers}
    tunix_seconds = []
    for r in range(args.rounds):
      for dtype, trainer in trainers.items():
        results[dtype].append(timed_step(trainer, clock, state, batch))
      if tunix:
        tunix_seconds.append(tunix.seconds(r + 1))
    if tunix:
      tunix.close()
    rm_scoring = rm_scoring_vs_reference(base, state, batch, max(3, args.rounds)) if args.rm_reward else None

  config = dict(MODEL, norm_scheme=args.scheme, prompts=PROMPTS, group=GROUP, prompt_len=PROMPT_LEN,
                new_tokens=NEW_TOKENS, minibatches=MINIBATCHES, kl_coef=0.001, rounds=args.rounds)
  report = {"benchmark": "grpo_step", "config": config,
            **machine_info(), "command": " ".join(["python -m benchmarks.grpo_step"] + sys.argv[1:])}
  for dtype, rs in results.items():
    entry = step_summary(rs)
    if tunix_seconds:
      entry["update_vs_tunix"] = round(statistics.median(MINIBATCHES * t / r["update"]
                                                         for t, r in zip(tunix_seconds, rs)), 2)
    report[f"rollout_{dtype}"] = entry
  if tunix_seconds:
    report["tunix_update_s_per_minibatch"] = round(statistics.median(tunix_seconds), 2)
  if rm_scoring is not None:
    report["rm_scoring"] = rm_scoring
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
