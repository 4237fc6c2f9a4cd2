"""Tiny SFT run: a 2-layer, d_model 128 SiameseNorm (post_pre) LM fine-tuned from scratch on the embedded
arithmetic word problems (no download); a few minutes on 2 CPU cores. The task's difficulty is set so the model
ends clearly better than chance but far from perfect, which leaves GRPO a learning signal. Every field not set here
keeps the default of its dataclass (`jaxpt.trainers.sft.SFTRunConfig`).

  jaxpt sft --config experiments/configs/sft_tiny.py --workdir /tmp/sft [--config.task.num_steps=3 ...]
"""

from jaxpt.config import config_dict
from jaxpt.trainers.sft import SFTRunConfig

MODEL = dict(vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=512, max_seq_len=128,
             norm_scheme="siamese_post_pre")
TASK = dict(name="arithmetic", num_steps=2, max_value=10, ops="+-", train_size=20000, test_size=512)


def get_config():
  return config_dict(
      SFTRunConfig, steps=300, log_every=20, eval_every=100, checkpoint_every=100, model=MODEL, task=TASK,
      data=dict(seq_len=96, batch_size=32, eval_batches=4), optim=dict(learning_rate=3e-3, warmup_steps=40),
      decode=dict(prompt_len=64, max_new_tokens=40, eval_problems=256, batch_size=64, temperature=1.0))
