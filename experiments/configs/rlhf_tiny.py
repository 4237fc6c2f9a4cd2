"""Tiny RLHF run: GRPO rewarded by a jaxpt reward model (`reward.model`, a `jaxpt rm` run of `rm_tiny.py`) instead
of the verifier, starting from a `jaxpt sft` run of `sft_tiny.py`; `grpo_tiny.py` (read from that file) with the
prompt and response lengths fitting rm_tiny's max_seq_len (128). The RM's tokenizer is its own (trained
on the synthetic preferences), so it scores the decoded prompt + response re-tokenized (logged once at start); an
RM started from the SFT run (`jaxpt rm ... --config.init_from=/tmp/sft`, with sft_tiny's model) reads the rollouts'
own tokens. The verifier's score stays in the metrics (`accuracy`) as the gold reward beside `rm_score`.

  jaxpt sft  --config experiments/configs/sft_tiny.py  --workdir /tmp/sft
  jaxpt rm   --config experiments/configs/rm_tiny.py   --workdir /tmp/rm --config.rm.loss=dir
  jaxpt grpo --config experiments/configs/rlhf_tiny.py --workdir /tmp/rlhf --config.init_from=/tmp/sft \\
      --config.reward.model=/tmp/rm
"""

import os

from jaxpt.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(__file__), "grpo_tiny.py"))
  config.data.update(dict(max_prompt_len=44))  # the longest prompt (a distractor eval problem): 43 tokens
  # the SFT policy's responses (solution, \boxed{answer}, EOS): 24 tokens on average, 28 at most
  config.sampling.update(dict(max_new_tokens=32))
  config.reward.update(dict(verifier_weight=0.0, model="", model_weight=1.0, normalize="batch", clip=5.0,
                            eos_missing_penalty=0.5))
  return config
