"""GRPO vs GRPO + CLIPO on the multi-path arithmetic task (several distinct correct solutions per problem, so a
group's correct rollouts differ and CLIPO's contrast has something to act on): N paired seeds fixed by a pilot's
power estimate, lr tuned per method on validation, the SFT calibrated on validation and its seed variance in the
GRPO-vs-SFT comparison (`experiments/toolkit/rl_comparison.py` has the stages).

CLIPO as the official code runs it: a 512-wide head and a head-only warm-up of HEAD_ONLY_STEPS steps.

  python experiments/grpo_vs_clipo_multipath/run.py --stage pilot [--workdir /tmp/multipath_rl_v3] [--jobs 2]
  python experiments/grpo_vs_clipo_multipath/run.py [--workdir /tmp/multipath_rl_v3] [--jobs 2] [--out DIR]
  python experiments/grpo_vs_clipo_multipath/run.py --smoke --workdir /tmp/mp_smoke

The default workdir is shared with `policy_losses` (same set-up): the SFTs and the GRPO runs are the same runs.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.grpo_vs_clipo_multipath import config  # noqa: E402
from experiments.toolkit import rl_comparison  # noqa: E402

HEAD_ONLY_STEPS = 5
METHODS = {"grpo": {}, "clipo": {"clipo.enabled": True, "clipo.critic_warmup": HEAD_ONLY_STEPS + 1}}
EXPERIMENT = rl_comparison.Experiment(
    module="experiments.grpo_vs_clipo_multipath.run", doc=__doc__, here=HERE,
    title="GRPO vs GRPO + CLIPO, multi-path arithmetic", config=config, methods=METHODS,
    lrs=(3e-5, 1e-4, 3e-4, 1e-3), target=0.03,
    target_source="chosen here: 3 points of sampled pass@1 (the CLIPO paper reports no number for this task)",
    max_seeds=20, diagnostics=("clipo_num_anchors", "clipo_pos_sim", "clipo_neg_sim"))

if __name__ == "__main__":
  rl_comparison.main(EXPERIMENT)
