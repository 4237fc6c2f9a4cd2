"""Tiny PPO run with a learned critic on the embedded arithmetic task, starting from a `jaxpt sft` run of
`sft_tiny.py` (same model and task, read from `grpo_tiny.py`), rewarded by the math verifier; the prompt and response
are `rlhf_tiny.py`'s, so that together they fit `rm_tiny.py`'s max_seq_len (64). One rollout per prompt, the first 2
steps train the critic only (`ppo.value_warmup_steps`). Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.ppo_config.PPORunConfig`).

  jaxpt sft --config experiments/configs/sft_tiny.py --workdir /tmp/sft
  jaxpt ppo --config experiments/configs/ppo_tiny.py --workdir /tmp/ppo --config.init_from=/tmp/sft
  # rewarded by a reward model whose backbone and score head also start the critic; the critic reads the rollouts'
  # own tokens, so that RM must share the policy's tokenizer: started from the SFT run, with sft_tiny's model
  jaxpt rm  --config experiments/configs/rm_tiny.py --workdir /tmp/rm_sft --config.init_from=/tmp/sft \\
      --config.model.d_model=128 --config.model.num_kv_heads=4 --config.model.mlp_dim=512 \\
      --config.model.max_seq_len=128 --config.model.norm_scheme=siamese_post_pre
  jaxpt ppo --config experiments/configs/ppo_tiny.py --workdir /tmp/ppo --config.init_from=/tmp/sft \\
      --config.reward.model=/tmp/rm_sft --config.reward.verifier_weight=0 --config.ppo.critic_init=/tmp/rm_sft
  # (the issue's `--config.reward.model=/tmp/rm` with rm_tiny's own tokenizer works too, the critic then starting
  # from the policy: the RM scores re-tokenized text)
"""

import os

from jaxpt.config import config_dict, load_config_file
from jaxpt.trainers.ppo_config import PPORunConfig


def get_config():
  grpo = load_config_file(os.path.join(os.path.dirname(__file__), "rlhf_tiny.py"))
  return config_dict(
      PPORunConfig, steps=60, log_every=5, eval_every=20, checkpoint_every=20, keep_checkpoints=2,
      model=grpo.model.to_dict(), task=grpo.task.to_dict(), data=grpo.data.to_dict(),
      sampling=grpo.sampling.to_dict(),
      ppo=dict(group_size=1, value_warmup_steps=2, epochs=1, minibatches=2, kl_coef=0.05, gamma=1.0, lam=0.95,
               critic_learning_rate=1e-4),
      reward=dict(normalize="none", eos_missing_penalty=0.5),
      optim=dict(learning_rate=1e-5, warmup_steps=5, end_lr_fraction=1.0, weight_decay=0.0, grad_clip=1.0))
