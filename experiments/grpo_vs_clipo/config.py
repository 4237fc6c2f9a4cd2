"""GRPO vs GRPO + CLIPO: the SFT and GRPO configs of `run.py`.

SFT: `experiments/configs/sft_tiny.py` (a 2-layer d_model 128 SiameseNorm LM) on 3-step arithmetic word problems
(numbers up to 50, +, - and *), long enough to reach its plateau (its held-out accuracy every SFT_EVAL_EVERY steps is
reported), so GRPO starts from a policy with headroom and not from one still learning the format.
GRPO: 32 prompts x 8 rollouts a step, 4 minibatches, GRPO_STEPS steps; the same task (so task.validation_size
problems after the SFT's training problems are unseen by both); eval on the first EVAL_PROBLEMS problems of each
held-out set, greedy and EVAL_SAMPLES samples at T = 1 (sampled pass@1).
CLIPO as the official code runs it: a 512-wide head (spec: D = 512 or 2048) and a head-only warm-up: the policy is
first updated at step CRITIC_WARMUP (the reference freezes the policy for its first epoch; one epoch of this
20,000-problem pool would be 625 steps, longer than the run, so the warm-up is HEAD_ONLY_STEPS steps instead).

  jaxpt sft  --config experiments/grpo_vs_clipo/config.py:sft  --workdir /tmp/gvc/sft
  jaxpt grpo --config experiments/grpo_vs_clipo/config.py:clipo --workdir /tmp/gvc/clipo --config.init_from=/tmp/gvc/sft
"""

import os

from jaxpt.config import load_config_file

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")

SFT_STEPS = 2500
SFT_EVAL_EVERY = 250
GRPO_STEPS = 60
EVAL_PROBLEMS = 256
EVAL_SAMPLES = 4
VALIDATION_PROBLEMS = 256
HEAD_ONLY_STEPS = 10
# Calibration (greedy held-out accuracy of the SFT): 3 steps of + and - on numbers up to 10 is solved outright (1.0
# from step 1000 on, at b25af52); up to 50, 0.84 at step 1500 and still rising (at 266fd7b); with '*' (factors up
# to 5, totals up to 6250) the plateau is 0.957 greedy at step 2500 (0.945 at 2250), sampled pass@1 0.896: GRPO's
# headroom is in sampling, and on the distractor set (0.461).
TASK = dict(num_steps=3, max_value=50, ops="+-*", train_size=20000, test_size=512,
            validation_size=VALIDATION_PROBLEMS)
SEQ_LEN = 128  # the longest '*' chains are 99+ tokens (prompt + response + EOS)
MAX_NEW_TOKENS = 56


def sft():
  config = load_config_file(os.path.join(CONFIGS, "sft_tiny.py"))
  config.task.update(TASK)
  config.steps = SFT_STEPS
  config.eval_every = SFT_EVAL_EVERY
  config.checkpoint_every = SFT_EVAL_EVERY  # a killed SFT resumes from its last eval
  config.progress = False
  config.data.seq_len = SEQ_LEN
  config.decode.max_new_tokens = MAX_NEW_TOKENS
  return config


def grpo(clipo: bool = False):
  config = load_config_file(os.path.join(CONFIGS, "grpo_tiny.py"))
  config.task.update(TASK)
  config.steps = GRPO_STEPS
  config.log_every = 1
  config.eval_every = GRPO_STEPS
  config.checkpoint_every = GRPO_STEPS // 4  # a killed run resumes
  config.progress = False
  config.data.prompts_per_step = 32
  config.sampling.max_new_tokens = MAX_NEW_TOKENS
  config.data.eval_prompts = EVAL_PROBLEMS
  config.data.eval_samples = EVAL_SAMPLES
  config.grpo.minibatches = 4
  config.optim.learning_rate = 3e-5
  config.clipo.enabled = clipo
  config.clipo.out_dim = 512
  config.clipo.critic_warmup = HEAD_ONLY_STEPS + 1 if clipo else 0
  return config


def get_config(kind: str = "sft"):
  return {"sft": sft, "grpo": grpo, "clipo": lambda: grpo(True)}[kind]()
