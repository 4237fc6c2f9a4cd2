"""Tiny GRPO run on the embedded arithmetic task, starting from a `jaxpt sft` run of `sft_tiny.py` (same model and
task, read from that file); a few minutes on 2 CPU cores. Every field not set here keeps the default of its
dataclass (`jaxpt.trainers.grpo.GRPORunConfig`).

  jaxpt sft  --config experiments/configs/sft_tiny.py  --workdir /tmp/sft
  jaxpt grpo --config experiments/configs/grpo_tiny.py --workdir /tmp/grpo --config.init_from=/tmp/sft
  # GRPO + CLIPO: --config.clipo.enabled=True
"""

import os

from jaxpt.config import config_dict, load_config_file
from jaxpt.trainers.grpo import GRPORunConfig


def get_config():
  sft = load_config_file(os.path.join(os.path.dirname(__file__), "sft_tiny.py"))
  return config_dict(
      GRPORunConfig, steps=60, log_every=5, eval_every=20, checkpoint_every=20, keep_checkpoints=2,
      model=sft.model.to_dict(), task=sft.task.to_dict(),
      data=dict(prompts_per_step=8, max_prompt_len=64, eval_prompts=128),
      sampling=dict(max_new_tokens=40, temperature=1.0, top_k=0, top_p=1.0),
      grpo=dict(group_size=8, eps_hi=0.28, kl_coef=0.001, minibatches=2),
      clipo=dict(out_dim=128),
      optim=dict(learning_rate=1e-4, warmup_steps=5, end_lr_fraction=1.0, weight_decay=0.0, grad_clip=1.0))
