"""SFT on GSM8K (the local jsonl files of ../shared/data/gsm8k, read in place through the GSM8K TFDS builder).

Sized as a smoke run: the tiny model of `sft_tiny.py` with the lengths GSM8K needs, a few minutes on 2 CPU cores;
it checks the pipeline end to end and learns the answer format, not the math (answer accuracy stays near 0). Every
field not set here keeps the default of its dataclass (`jaxpt.trainers.sft.SFTRunConfig`).

  jaxpt sft --config experiments/configs/sft_gsm8k.py --workdir /tmp/sft_gsm8k
  [--config.task.path=/elsewhere/gsm8k]   # a folder with train.jsonl and test.jsonl

Lengths (tokens of the 4096-piece tokenizer trained on the train split): the longest train example (prompt +
response + EOS) has 527, the longest prompt 276 (train) / 171 (test), responses up to 370; every example must fit
data.seq_len, every decoded prompt decode.prompt_len. A smaller vocab_size makes texts longer (2048: 593 / 324).
For a real run change: model (d_model, num_layers, num_heads, mlp_dim; the GRPO config reads it from here), steps
(thousands), data.batch_size, optim.learning_rate, decode.eval_problems (1319 = the whole test split, a multiple
of decode.batch_size) and decode.max_new_tokens (~400 for whole reasoning chains).
"""

import os

from jaxpt.config import config_dict
from jaxpt.trainers.sft import SFTRunConfig

GSM8K = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data",
                                      "gsm8k"))
MODEL = dict(vocab_size=4096, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=512, max_seq_len=640,
             norm_scheme="siamese_post_pre")
TASK = dict(name="gsm8k", path=GSM8K, train_size=0, test_size=0)  # 0 = every problem (7473 train, 1319 test)


def get_config():
  return config_dict(
      SFTRunConfig, steps=40, log_every=10, eval_every=40, checkpoint_every=40, model=MODEL, task=TASK,
      data=dict(seq_len=640, batch_size=8, eval_batches=2), optim=dict(learning_rate=3e-3, warmup_steps=10),
      decode=dict(prompt_len=224, max_new_tokens=192, eval_problems=32, batch_size=32, temperature=1.0))
