"""The multi-path GRPO set-up shared by `grpo_vs_clipo_multipath` and `policy_losses`: the SFT and GRPO configs.

Task: `task.name=multipath` (`jaxpt.data.multipath`): 3 '+'/'-' changes to a start value (numbers up to
MAX_VALUE); each problem has up to 7 distinct correct worked solutions (orders of the changes, or the gains and
losses grouped), and each SFT example shows one drawn uniformly, so the SFT'd policy samples several and a group's
correct rollouts differ in their reasoning text (what CLIPO's contrast needs). Splits: 'train' (the first
train_size), 'validation' (the next VALIDATION_PROBLEMS training-split problems, distinct in content, seen by no
run) and 'test' (disjoint in content); every calibration and selection reads validation only.
SFT: `experiments/configs/sft_tiny.py` (a 2-layer d_model 128 SiameseNorm LM), eval_split='validation' (its eval
never reads test); SFT_STEPS was chosen on that validation curve (`sft_calibration.json`: 3000 steps, greedy 0.68 and
sampled 0.34 on validation, where the first pilot's 600 steps left ~5%, a floor; 3000 is the longest schedule
tried, its curve still rising slowly: a grid edge).
GRPO: PROMPTS x 8 rollouts a step, EPOCHS passes of MINIBATCHES updates a step (8 updates: every update after
the first sees ratios != 1; the v2 pilot's 2 updates a step at lr 1e-4 clipped <= 0.02% of tokens, so the losses
that differ only on clipped tokens nearly coincided with PPO-clip; with 8, a probe at lr 3e-4 clipped ~1% of tokens
a step, lr 1e-3 collapsed), GRPO_STEPS steps, k3 KL 0.001; eval on EVAL_PROBLEMS problems of 'validation' and
'test', greedy and EVAL_SAMPLES samples at T = 1 (sampled pass@1).

  jaxpt sft  --config experiments/grpo_vs_clipo_multipath/config.py:sft  --workdir /tmp/mp/sft
  jaxpt grpo --config experiments/grpo_vs_clipo_multipath/config.py:grpo --workdir /tmp/mp/grpo \\
      --config.init_from=/tmp/mp/sft
"""

import os

from jaxpt.config import load_config_file

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")

MAX_VALUE = 20
VALIDATION_PROBLEMS = 256
TASK = dict(name="multipath", num_steps=3, max_value=MAX_VALUE, ops="+-", train_size=20000, test_size=256,
            validation_size=VALIDATION_PROBLEMS)
SFT_STEPS = 3000
SFT_EVAL_EVERY = 500
SFT_EVAL_PROBLEMS = 128
GRPO_STEPS = 20
PROMPTS = 16
MINIBATCHES = 4
EPOCHS = 2
EVAL_PROBLEMS = 128
EVAL_SAMPLES = 2
SFT_BATCH = 16
SEQ_LEN = 104  # prompt (<= 64 tokens) + response + EOS
MAX_NEW_TOKENS = 44  # the longest response is 40 tokens + EOS


SFT = {"eval_split": "validation", "steps": SFT_STEPS, "eval_every": SFT_EVAL_EVERY,
       "checkpoint_every": SFT_EVAL_EVERY,  # a killed SFT resumes from its last eval
       "progress": False, "data.seq_len": SEQ_LEN, "data.batch_size": SFT_BATCH,
       "decode.max_new_tokens": MAX_NEW_TOKENS, "decode.eval_problems": SFT_EVAL_PROBLEMS}
GRPO = {"steps": GRPO_STEPS, "log_every": 1, "eval_every": GRPO_STEPS,
        "checkpoint_every": max(1, GRPO_STEPS // 3),  # a killed run resumes
        "progress": False, "data.prompts_per_step": PROMPTS, "sampling.max_new_tokens": MAX_NEW_TOKENS,
        "data.eval_prompts": EVAL_PROBLEMS, "data.eval_samples": EVAL_SAMPLES, "grpo.minibatches": MINIBATCHES,
        "grpo.epochs": EPOCHS,
        "optim.learning_rate": 3e-5, "clipo.out_dim": 512}


def _config(name: str, fields: dict):
  config = load_config_file(os.path.join(CONFIGS, name))
  config.task.update(TASK)
  config.update_from_flattened_dict(fields)
  return config


def sft():
  return _config("sft_tiny.py", SFT)


def grpo():
  return _config("grpo_tiny.py", GRPO)


def get_config(kind: str = "sft"):
  return {"sft": sft, "grpo": grpo}[kind]()
