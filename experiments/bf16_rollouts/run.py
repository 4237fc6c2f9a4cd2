"""bf16 rollout weights in GRPO: the off-policy gap they cause, on a short tiny run. Writes results.json here.

    PYTHONPATH=. python experiments/bf16_rollouts/run.py [--steps 20] [--workdir /tmp/bf16_rollouts]

One `sft_tiny` policy, then `grpo_tiny` runs of --steps steps from it with `sampling.rollout_dtype` float32 and
bfloat16 (same seed; the trainer then takes old_logp from the fp32 policy by teacher forcing). Reported:
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

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import grpo_tiny, sft_tiny
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--workdir", default="/tmp/bf16_rollouts")
  args = parser.parse_args()
  sft_dir = os.path.join(args.workdir, "sft")
  if not os.path.exists(os.path.join(sft_dir, "checkpoints")):
    config = sft_tiny.get_config()
    config.progress = False
    jaxpt.train("sft", config, sft_dir)
  results = {"steps": args.steps, "runs": {}}
  for dtype in ("float32", "bfloat16"):
    config = grpo_tiny.get_config()
    config.update_from_flattened_dict({"init_from": sft_dir, "steps": args.steps, "log_every": 1, "eval_every": 0,
                                       "checkpoint_every": 0, "progress": False, "data.eval_prompts": 0,
                                       "sampling.rollout_dtype": dtype})
    workdir = os.path.join(args.workdir, f"grpo_{dtype}")
    trainer = jaxpt.build("grpo", config, workdir)
    state = trainer.init_state()
    measured = gap(trainer, state.params, trainer.hooks.collector.prompts.batch(0), jax.random.PRNGKey(0))
    jaxpt.train("grpo", config, workdir, built=trainer)
    rows = read_metrics(workdir)
    mean = lambda key: float(np.mean([r[key] for r in rows if key in r]))
    results["runs"][dtype] = {"gap_at_step_0": measured, "ppo_kl": mean("ppo_kl"), "clip_frac": mean("clip_frac"),
                              "reward_mean": mean("reward_mean"), "accuracy": mean("accuracy"),
                              "accuracy_last5": float(np.mean([r["accuracy"] for r in rows[-5:]]))}
    print(dtype, json.dumps(results["runs"][dtype]), flush=True)
  with open(os.path.join(HERE, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
    f.write("\n")


if __name__ == "__main__":
  main()
