"""GRPO on GSM8K, starting from a `jaxpt sft` run of `sft_gsm8k.py` (same model and task, read from that file).

Sized as a smoke run (a few minutes on 2 CPU cores): it checks rollouts, rewards and updates end to end; the tiny
policy earns next to no reward on GSM8K. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.grpo.GRPORunConfig`).

  jaxpt sft  --config experiments/configs/sft_gsm8k.py  --workdir /tmp/sft_gsm8k
  jaxpt grpo --config experiments/configs/grpo_gsm8k.py --workdir /tmp/grpo_gsm8k --config.init_from=/tmp/sft_gsm8k
  # GRPO + CLIPO: --config.clipo.enabled=True

Every training prompt must fit data.max_prompt_len (the longest GSM8K train prompt has 276 tokens of sft_gsm8k's
tokenizer), and data.max_prompt_len + sampling.max_new_tokens must fit model.max_seq_len (640). For a real run
change: the model in sft_gsm8k.py, steps (hundreds), data.prompts_per_step (32+), grpo.group_size (8+),
sampling.max_new_tokens (up to 640 - 288 = 352, or raise model.max_seq_len in sft_gsm8k.py), data.eval_prompts.
"""

import os

from jaxpt.config import load_config_file


def get_config():
  here = os.path.dirname(__file__)
  config = load_config_file(os.path.join(here, "grpo_tiny.py"))  # the tiny GRPO recipe, on sft_gsm8k's model and task
  sft = load_config_file(os.path.join(here, "sft_gsm8k.py"))
  config.model, config.task = sft.model, sft.task
  config.update_from_flattened_dict({
      "steps": 10, "log_every": 2, "eval_every": 10, "checkpoint_every": 10,
      "data.prompts_per_step": 4, "data.max_prompt_len": 288, "data.eval_prompts": 16,
      "sampling.max_new_tokens": 160, "grpo.group_size": 4, "grpo.minibatches": 1, "optim.warmup_steps": 2})
  return config
