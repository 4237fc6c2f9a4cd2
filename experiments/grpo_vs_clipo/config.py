"""GRPO vs GRPO + CLIPO: the shared SFT and GRPO configs of `run.py`.

One SFT'd policy (`experiments/configs/sft_tiny.py` as it is: a 2-layer d_model 128 SiameseNorm LM, 300 steps on the
embedded arithmetic task, two operations on numbers up to 10) is post-trained with GRPO, with and without CLIPO, from
the same checkpoint, for 3 seeds each. Held-out accuracy (greedy) is measured on the first EVAL_PROBLEMS test
problems and on their perturbed variants (renamed entities, a distractor sentence, changed numbers).

GRPO learning rate: probed from this SFT checkpoint (seed 0, 25 steps of 32 prompts x 8 rollouts, 4 minibatches;
held-out greedy accuracy of the SFT policy 83.6%): lr 1e-3 collapsed (5.9% after), 2e-4 drifted down (65.2%),
5e-5 kept it (81.6%) while the training-rollout accuracy rose from ~0.57 to ~0.64. With Adam every parameter moves
by ~lr per update whatever the size of its (noisy) policy gradient, which this tiny SFT'd model does not tolerate.

  jaxpt sft  --config experiments/grpo_vs_clipo/config.py:sft  --workdir /tmp/gvc/sft
  jaxpt grpo --config experiments/grpo_vs_clipo/config.py:grpo --workdir /tmp/gvc/grpo --config.init_from=/tmp/gvc/sft
"""

import os

from jaxpt.config import load_config_file

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")

SFT_STEPS = 300
GRPO_STEPS = 100
EVAL_PROBLEMS = 256


def sft():
  config = load_config_file(os.path.join(CONFIGS, "sft_tiny.py"))
  config.steps = SFT_STEPS
  config.eval_every = SFT_STEPS
  config.checkpoint_every = SFT_STEPS
  config.progress = False
  return config


def grpo(clipo: bool = False):
  config = load_config_file(os.path.join(CONFIGS, "grpo_tiny.py"))
  config.steps = GRPO_STEPS
  config.log_every = 1
  config.eval_every = GRPO_STEPS
  config.checkpoint_every = GRPO_STEPS
  config.progress = False
  config.data.prompts_per_step = 32
  config.data.eval_prompts = EVAL_PROBLEMS
  config.grpo.minibatches = 4
  config.optim.learning_rate = 5e-5
  config.clipo.enabled = clipo
  return config


def get_config(kind: str = "sft"):
  return {"sft": sft, "grpo": grpo, "clipo": lambda: grpo(True)}[kind]()
