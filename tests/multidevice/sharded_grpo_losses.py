"""Every registered policy loss (and the bnpo advantage, and KDRL's teacher term) in the GRPO trainer on 8 simulated
CPU devices equals the single-device run: 2 steps of `tests.micro_grpo`'s run with each of `POLICY_LOSS_VARIANTS`
(run by tests/test_parallel_sharded.py in its own process; directly:
python -m pytest tests/multidevice/sharded_grpo_losses.py).

The 8 devices are the fsdp_tp mesh (data 2 x fsdp 2 x tensor 2: rollouts, params and the loss's reductions all
split); the single-device reference is the same trainer on a mesh of the first device. No eval: the sharded eval is
tests/multidevice/sharded_grpo.py's.
"""

import os

from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxpt  # noqa: E402
from jaxpt import parallel  # noqa: E402
from jaxpt.losses import known_losses  # noqa: E402
from jaxpt.trainers.grpo import replace_hooks  # noqa: E402
from jaxpt.engine.metrics import read_metrics  # noqa: E402
from tests.micro_grpo import POLICY_LOSS_VARIANTS, even_length, micro_config, scratch_workdir  # noqa: E402

# KL-Cov's penalty kl_cov_coef |logp - old_logp| has the gradient sign(d), which on an on-policy update (d = 0 in
# exact arithmetic) float rounding decides: the rollouts' log-probs and the update's forward pass are different
# programs on 8 devices, and the two runs' first updates already differ by kl_cov_coef on the selected tokens. That
# discontinuity is the loss's, not the sharding's: here kl_cov runs with the penalty's weight 0 (the selection, its
# covariances and the unclipped surrogate are still compared).
SHARDING_INDEPENDENT = {"kl_cov": {"grpo.kl_cov_coef": 0.0}}
MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "mesh.rules": "fsdp_tp"}
KEYS = ("reward_mean", "accuracy", "loss", "pg_loss", "ratio_mean", "grad_norm")


@functools.cache
def teacher():
  """KDRL's teacher: a 1-step micro GRPO run of another size (d_model 64), trained on one device."""
  workdir = scratch_workdir("teacher-")
  run("ppo_clip", True, {"model.d_model": 64, "model.mlp_dim": 128, "steps": 1, "checkpoint_every": 1}, workdir)
  return workdir


def run(variant, one_device, overrides=None, workdir=None):
  """Two GRPO steps of the variant (and `overrides`): (metrics rows, final params as numpy, final params)."""
  workdir = workdir or scratch_workdir(f"{variant}-{'one' if one_device else 'eight'}-")
  config = micro_config(**{"data.eval_prompts": 0, "eval_every": 0, **POLICY_LOSS_VARIANTS[variant],
                           **SHARDING_INDEPENDENT.get(variant, {}), **(overrides or {}),
                           **({"mesh.data": 1} if one_device else MESH)})
  if one_device:
    real = parallel.make_mesh
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(parallel, "make_mesh", lambda mesh_config: real(mesh_config, jax.devices()[:1]))
      trainer = jaxpt.build("grpo", config, workdir)
  else:
    trainer = jaxpt.build("grpo", config, workdir)
  trainer = replace_hooks(trainer, reward_fn=even_length)
  result = jaxpt.train("grpo", trainer.config, workdir, built=trainer)
  return read_metrics(workdir), jax.tree.map(np.asarray, result.state.params), result.state.params


def test_every_registered_policy_loss_is_checked():
  assert set(known_losses("policy")) <= set(POLICY_LOSS_VARIANTS)


@pytest.mark.parametrize("variant", sorted(POLICY_LOSS_VARIANTS) + ["kdrl"])
def test_two_steps_on_8_devices_equal_one_device(variant):
  """kdrl: ppo_clip with the KD term to `teacher()`, scored on each mesh, and reward-guided masking."""
  extra = {}
  if variant == "kdrl":
    variant, extra = "ppo_clip", {"grpo.teacher": teacher(), "grpo.kd_coef": 0.1, "grpo.kd_skip_correct": True}
  want_rows, want, _ = run(variant, True, extra)
  rows, got, params = run(variant, False, extra)
  assert [r["step"] for r in rows] == [1, 2] and 0 < want_rows[0]["accuracy"] < 1  # mixed groups
  for key in KEYS + (("cov_frac",) if variant in ("clip_cov", "kl_cov") else ()) + (("kd", "teacher_kl", "kd_rows")
                                                                                      if extra else ()):
    np.testing.assert_allclose([r[key] for r in rows], [r[key] for r in want_rows], rtol=2e-5, atol=1e-6,
                               err_msg=f"{variant}: {key}")
  # the tolerances of tests/multidevice/sharded_grpo.py, but for at most 0.1% of a leaf's entries: AdamW normalises
  # each gradient entry, so one at rounding level (an embedding row or hidden unit barely used) can step by a sizeable
  # part of lr = 1e-3 in either run (bnpo: one of 4096 entries 6e-5 apart); those stay within 10% of lr
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    name = f"{variant}: {jax.tree_util.keystr(path[0])}"
    off = ~np.isclose(g, w, rtol=1e-4, atol=1e-5)
    assert off.sum() <= max(1, off.size // 1000), (name, off.sum(), np.abs(g - w).max())
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-4, err_msg=name)
  kernel = params["decoder"]["layers"]["attn"]["query"]["kernel"]  # [layers, embed, heads, kv]: really sharded
  assert {s.data.shape for s in kernel.addressable_shards} == {(2, 16, 1, 16)}
