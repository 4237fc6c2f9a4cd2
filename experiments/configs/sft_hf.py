"""SFT of a Hugging Face checkpoint (Llama, Mistral, Qwen2 / Qwen2.5, Qwen3) on GSM8K, prompts in its chat template.

The model section holds only how the model runs (bfloat16 compute, float32 params, remat): `init_from=hf:DIR`
fills every architecture field from DIR/config.json and the run uses DIR's tokenizer (copied into the workdir).
Every field not set here keeps the default of its dataclass (`jaxpt.trainers.sft.SFTRunConfig`).

  jaxpt sft --config experiments/configs/sft_hf.py --workdir /tmp/sft_qwen \
      --config.init_from=hf:/models/Qwen2.5-0.5B-Instruct [--config.task.path=/elsewhere/gsm8k]

Sized for one accelerator and a 0.5B-1.5B model; on a pod add --config.mesh.* (fsdp / tp) as for pretraining.
The arithmetic task needs no files; its generator has no 'all' (task.train_size / test_size 0, GSM8K's), so give
its sizes with it (the task section's defaults):

  jaxpt sft --config experiments/configs/sft_hf.py --workdir /tmp/sft_qwen_arithmetic \
      --config.init_from=hf:/models/Qwen2.5-0.5B-Instruct \
      --config.task.name=arithmetic --config.task.train_size=20000 --config.task.test_size=512
"""

import os

from jaxpt.config import config_dict
from jaxpt.trainers.sft import SFTRunConfig

GSM8K = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data",
                                      "gsm8k"))


def get_config():
  return config_dict(
      SFTRunConfig, steps=500, log_every=10, eval_every=100, checkpoint_every=100,
      model=dict(dtype="bfloat16", param_dtype="float32", remat="full", max_seq_len=1024),
      task=dict(name="gsm8k", path=GSM8K, train_size=0, test_size=0, prompt_format="chat"),
      data=dict(seq_len=1024, batch_size=16, eval_batches=4),
      optim=dict(learning_rate=1e-5, warmup_steps=20, weight_decay=0.0),
      decode=dict(prompt_len=512, max_new_tokens=512, eval_problems=128, batch_size=32))
