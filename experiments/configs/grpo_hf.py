"""GRPO (or GRPO + CLIPO) of a Hugging Face instruct checkpoint on GSM8K, prompts in its chat template: the
recipe of the CLIPO paper (Qwen2.5-Instruct), at the sizes one accelerator holds.

`init_from=hf:DIR` fills the model's architecture from DIR/config.json and gives the tokenizer; the model section
holds only how the model runs. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.grpo.GRPORunConfig`).

  jaxpt grpo --config experiments/configs/grpo_hf.py --workdir /tmp/grpo_qwen \
      --config.init_from=hf:/models/Qwen2.5-1.5B-Instruct [--config.clipo.enabled=True]
"""

import os

from jaxpt.config import config_dict, load_config_file
from jaxpt.trainers.grpo import GRPORunConfig


def get_config():
  sft = load_config_file(os.path.join(os.path.dirname(__file__), "sft_hf.py"))
  return config_dict(
      GRPORunConfig, steps=200, log_every=1, eval_every=50, checkpoint_every=25, keep_checkpoints=2,
      model=sft.model.to_dict(), task=sft.task.to_dict(),
      data=dict(prompts_per_step=32, max_prompt_len=512, eval_prompts=256),
      sampling=dict(max_new_tokens=512, temperature=1.0, top_k=0, top_p=1.0),
      grpo=dict(group_size=8, eps_hi=0.28, kl_coef=0.001, minibatches=4),
      optim=dict(learning_rate=1e-6, warmup_steps=10, end_lr_fraction=1.0, weight_decay=0.0, grad_clip=1.0))
