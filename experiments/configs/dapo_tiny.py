"""Tiny DAPO run: `grpo_tiny.py` (read from that file: same model, task, sampling and schedule) with DAPO's
settings: clip-higher (eps_lo 0.2, eps_hi 0.28), the token-level loss (agg token-mean), no KL term, dynamic
sampling (groups whose rollouts are all right or all wrong are replaced, at most 3 generation rounds per step) and
the soft overlong punishment over the last 20% of the response cap (DAPO: 4096 of 20480 tokens). Overlong filtering
stays off, as in DAPO's best run (verl's recipe README). Starts from a `jaxpt sft` run of `sft_tiny.py`.

  jaxpt sft  --config experiments/configs/sft_tiny.py  --workdir /tmp/sft
  jaxpt grpo --config experiments/configs/dapo_tiny.py --workdir /tmp/dapo --config.init_from=/tmp/sft
"""

import os

from jaxpt.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(__file__), "grpo_tiny.py"))
  config.grpo.update(dict(eps_lo=0.2, eps_hi=0.28, agg="token-mean", kl_coef=0.0))
  config.dapo.update(dict(dynamic_sampling=True, filter_metric="score", max_rounds=3, at_cap="fill",
                          overlong_filtering=False,
                          overlong_buffer=config.sampling.max_new_tokens // 5, overlong_penalty_factor=1.0))
  return config
