"""Tiny SFT with LoRA: `sft_tiny`'s model and task, with rank-8 adapters (alpha 16) on every attention and MLP
projection; only the adapters train and have optimizer state (`jaxpt.nn.lora`). Started from random init it shows
the mechanics; pass `--config.init_from=WORKDIR` (a `jaxpt sft` or `jaxpt pretrain` run) to adapt a trained model.

  jaxpt sft --config experiments/configs/sft_lora_tiny.py --workdir /tmp/sft_lora [--config.lora.rank=4 ...]
"""

from experiments.configs import sft_tiny


def get_config():
  config = sft_tiny.get_config()
  config.lora.rank = 8
  config.lora.alpha = 16.0
  config.lora.targets = "q,k,v,o,mlp_in,mlp_out"
  config.optim.learning_rate = 1e-2
  return config
