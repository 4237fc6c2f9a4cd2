"""The GRPO trainer with each policy loss of jaxpt.losses.policy (cispo, gppo, topr) and jaxpt.losses.entropy_control
(clip_cov, kl_cov) and the bnpo advantage, picked by name as `--config.grpo.policy_loss=...` /
`--config.grpo.advantage=...` pick them: 2 steps of the micro run (tests/micro_grpo.py: a from-scratch policy, the
even-length verifier, so groups mix rewards), 2 epochs x 2 minibatches a step so the later updates are off-policy
and the clipping / tapering acts. clip_cov and kl_cov select 5% of the tokens (the papers' 2e-4 / 2e-3 would select
one token of a micro batch), clip_cov from the band (0, 5) so that the micro run's small covariances reach it."""


import numpy as np
import pytest

import jaxpt
from jaxpt.trainers.grpo import replace_hooks
from jaxpt.engine.metrics import read_metrics
from tests.micro_grpo import POLICY_LOSS_VARIANTS, even_length, micro_config

VARIANTS = {k: v for k, v in POLICY_LOSS_VARIANTS.items() if k not in ("ppo_clip", "gspo")}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def run(request, tmp_path_factory):
  config = micro_config(**{"data.eval_prompts": 0, "eval_every": 0, **VARIANTS[request.param]})
  workdir = str(tmp_path_factory.mktemp(request.param))
  trainer = replace_hooks(jaxpt.build("grpo", config, workdir), reward_fn=even_length)
  return request.param, trainer, workdir, jaxpt.train("grpo", config, workdir, built=trainer)


def test_two_steps_train_the_policy(run):
  name, trainer, workdir, result = run
  assert int(result.state.step) == 2
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    for key in ("loss", "pg_loss", "clip_frac", "ratio_mean", "approx_kl", "adv_std", "grad_norm"):
      assert np.isfinite(row[key]), (name, key, row)
    assert 0.0 <= row["clip_frac"] <= 1.0
    assert row["grad_norm"] > 0.0, (name, row)  # the policy moves: the groups mix rewards
  if name in ("clip_cov", "kl_cov"):   # tokens were selected (kl_cov: always at least one per update)
    assert all(0.0 < row["cov_frac"] <= 0.05 + 1e-6 for row in rows), (name, rows)
  if name != "bnpo":
    assert trainer.config.grpo.policy_loss == name
  else:
    assert trainer.config.grpo.advantage == "bnpo"
