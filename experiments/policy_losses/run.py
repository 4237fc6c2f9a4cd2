"""Every registered policy loss (and the BNPO advantage) on the multi-path GRPO set-up of
`grpo_vs_clipo_multipath`: N paired seeds fixed by a pilot's power estimate, lr tuned per loss on validation, each
loss compared with GRPO's PPO-clip paired by seed (t intervals, Holm) (`experiments/toolkit/rl_comparison.py` has
the stages). The losses' knobs are the trainer's defaults except where a method sets them below (GSPO's clip range
is sequence-level, so its paper's 3e-4 / 4e-4; CISPO's IS weight has no lower bound in its paper). TOPR runs
on-policy (the trainer has no off-policy data path): its ratios differ from 1 on every update
after a step's first.

  python experiments/policy_losses/run.py --stage pilot [--workdir /tmp/multipath_rl_v3] [--jobs 2]
  python experiments/policy_losses/run.py [--workdir /tmp/multipath_rl_v3] [--jobs 2] [--out DIR]
  python experiments/policy_losses/run.py --smoke --workdir /tmp/pl_smoke

The default workdir is shared with `grpo_vs_clipo_multipath`: its 'grpo' runs are this experiment's baseline.
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

METHODS = {
    "grpo": {},  # ppo_clip with the GRPO advantage: the baseline (the same runs as grpo_vs_clipo_multipath's)
    "gspo": {"grpo.policy_loss": "gspo", "grpo.eps_lo": 3e-4, "grpo.eps_hi": 4e-4},
    "cispo": {"grpo.policy_loss": "cispo", "grpo.eps_lo": 1.0},
    "gppo": {"grpo.policy_loss": "gppo"},
    "topr": {"grpo.policy_loss": "topr"},
    "clip_cov": {"grpo.policy_loss": "clip_cov"},
    "kl_cov": {"grpo.policy_loss": "kl_cov"},
    "bnpo": {"grpo.advantage": "bnpo"},
}
EXPERIMENT = rl_comparison.Experiment(
    module="experiments.policy_losses.run", doc=__doc__, here=HERE,
    title="Policy losses side by side, multi-path arithmetic", config=config, methods=METHODS,
    lrs=(3e-5, 1e-4, 3e-4, 1e-3), target=0.03,
    target_source="chosen here: 3 points of sampled pass@1 (no paper states a number for this task)",
    max_seeds=20, diagnostics=("clip_frac", "kl_ref", "approx_kl"))

if __name__ == "__main__":
  rl_comparison.main(EXPERIMENT)
