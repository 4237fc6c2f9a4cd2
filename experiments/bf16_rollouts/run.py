"""bf16 rollout weights in GRPO: the off-policy gap they cause, on a short tiny run. Writes results.json here.

    PYTHONPATH=. python experiments/bf16_rollouts/run.py [--steps 20] [--seeds 0,1,2,3,4] [--workdir DIR]

One `sft_tiny` policy (seed 0), then, for each seed, `grpo_tiny` runs of --steps steps from it with
`sampling.rollout_dtype` float32 and bfloat16 (the same seed for both; the trainer then takes old_logp from the fp32
policy by teacher forcing). N = 5 seeds is the floor issue 31 sets for every experiment; it was not computed by a
power analysis (this is a measurement of a gap, not a test of a claim). Reported, per seed and as paired
statistics of bfloat16 - float32 over the seeds (`experiments.toolkit.stats`):
- per run: the mean over steps of the policy-loss metrics `ppo_kl` (k1 of old vs current log-probs) and
  `clip_frac`, the reward and accuracy;
- the gap itself, measured on the SFT policy's bf16 rollouts (the trainer's first step, 64 rows): the
  sampler's bf16 log-probs of its tokens against the fp32 policy's teacher-forced ones, as k1 = mean(logp_bf16 -
  logp_fp32) over sampled tokens (an estimate of KL(bf16 sampler || fp32 policy)), mean |difference|, and the
  share of tokens whose ratio exp(logp_fp32 - logp_bf16) lies outside [1 - eps_lo, 1 + eps_hi]: the clip
  fraction the first update would show if the bf16 log-probs served as old_logp. fp32 rollouts give the same
  figures as a control (0 up to float rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import grpo_tiny, sft_tiny
from experiments.toolkit import results, stats
import jaxpt
from jaxpt.engine.metrics import read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))


def gap(trainer, params, batch, rng) -> dict:
  """The sampler-vs-fp32-policy log-prob gap on one batch of the trainer's rollouts."""
  settings = trainer.config.grpo
  tokens, mask = np.repeat(batch["prompt_tokens"], settings.group_size, 0), np.repeat(batch["prompt_mask"],
                                                                                      settings.group_size, 0)
  out = trainer.hooks.collector.sample(params, jnp.asarray(tokens), jnp.asarray(mask), rng)
  fp32 = np.asarray(trainer.hooks.collector.logprobs(params, jnp.asarray(tokens), jnp.asarray(mask), out.tokens,
                                                     out.mask))
  sampled, live = np.asarray(out.logprobs), np.asarray(out.mask) > 0
  diff = (sampled - fp32)[live]
  ratio = np.exp(-diff)
  return {"tokens": int(live.sum()), "k1_sampler_vs_fp32": float(diff.mean()), "mean_abs_logp_diff": float(
      np.abs(diff).mean()), "max_abs_logp_diff": float(np.abs(diff).max()),
          "clip_frac_if_sampler_logp_were_old": float(np.mean((ratio < 1 - settings.eps_lo) |
                                                              (ratio > 1 + settings.eps_hi)))}


def run_pair(sft_dir: str, workdir: str, steps: int, seed: int) -> dict:
  """{dtype: the seed's figures} for GRPO from `sft_dir` with float32 and bfloat16 rollouts."""
  runs = {}
  for dtype in ("float32", "bfloat16"):
    config = grpo_tiny.get_config()
    config.update_from_flattened_dict({"init_from": sft_dir, "steps": steps, "log_every": 1, "eval_every": 0,
                                       "checkpoint_every": 0, "progress": False, "data.eval_prompts": 0,
                                       "sampling.rollout_dtype": dtype, "seed": seed})
    run_dir = os.path.join(workdir, f"grpo_{dtype}_seed{seed}")
    start = time.perf_counter()
    trainer = jaxpt.build("grpo", config, run_dir)
    state = trainer.init_state()
    measured = gap(trainer, state.params, trainer.hooks.collector.prompts.batch(0), jax.random.PRNGKey(seed))
    jaxpt.train("grpo", config, run_dir, built=trainer)
    rows = read_metrics(run_dir)
    mean = lambda key: float(np.mean([r[key] for r in rows if key in r]))
    runs[dtype] = {"gap_at_step_0": measured, "ppo_kl": mean("ppo_kl"), "clip_frac": mean("clip_frac"),
                   "reward_mean": mean("reward_mean"), "accuracy": mean("accuracy"),
                   "accuracy_last5": float(np.mean([r["accuracy"] for r in rows[-5:]])),
                   "seconds": round(time.perf_counter() - start, 1)}
    print(f"seed {seed} {dtype}", json.dumps(runs[dtype]), flush=True)
  return runs


COMPARED = ("ppo_kl", "clip_frac", "reward_mean", "accuracy", "accuracy_last5")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--seeds", default="0,1,2,3,4")
  parser.add_argument("--workdir", default="/tmp/bf16_rollouts")
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  start = time.perf_counter()
  sft_dir = os.path.join(args.workdir, "sft")
  if not os.path.exists(os.path.join(sft_dir, "checkpoints")):
    config = sft_tiny.get_config()
    config.progress = False
    jaxpt.train("sft", config, sft_dir)
  per_seed = {seed: run_pair(sft_dir, args.workdir, args.steps, seed) for seed in seeds}
  comparisons = []
  for key in COMPARED:
    comparison = stats.paired([per_seed[s]["bfloat16"][key] for s in seeds],
                              [per_seed[s]["float32"][key] for s in seeds])
    comparisons.append(dict(comparison, metric=key, difference="bfloat16 - float32"))
  stats.holm_adjust(comparisons)
  gaps = {dtype: {k: stats.summary([per_seed[s][dtype]["gap_at_step_0"][k] for s in seeds])
                  for k in per_seed[seeds[0]][dtype]["gap_at_step_0"]} for dtype in ("float32", "bfloat16")}
  payload = {"steps": args.steps, "seeds": seeds, "sft_seed": 0, "gap_at_step_0": gaps, "comparisons": comparisons,
             "statistics": stats.statistics(comparisons, N_FIXED), "runs": {str(s): r for s, r in per_seed.items()},
             "compute": f"{time.perf_counter() - start:.0f} s wall on {os.cpu_count()} CPUs (SFT included unless "
                        "it was already in --workdir)"}
  results.write_json(os.path.join(HERE, "results.json"), payload)


N_FIXED = ("5 seeds, fixed before the runs: the floor issue 31 sets for every experiment, not a power analysis "
           "(the experiment measures the bf16 gap; it tests no paper claim)")


if __name__ == "__main__":
  main()
