"""Registries by kind: losses (lm / preference / policy / contrastive), advantages, biases, norms, sharding rules."""

import re

import numpy as np
import pytest

from jaxpt.data import bias
from jaxpt.losses import LOSS_KINDS, get_loss, known_losses, loss_kind, register_loss
from jaxpt.losses import advantages, clipo, grpo, lm, policy, preference
from jaxpt.models import blocks
from jaxpt.models.config import NORM_SCHEMES
from jaxpt.nn import norms
from jaxpt.parallel import rules
from jaxpt.registry import Registry

EXPECTED = {
    "lm": {"lm_cross_entropy": lm.lm_cross_entropy},
    "preference": {"bt": preference.bradley_terry, "dir": preference.dir_loss, "dpo": preference.dpo,
                   "odin": preference.odin},
    "policy": {"ppo_clip": grpo.ppo_clip_loss, "gspo": grpo.gspo_loss, "cispo": policy.cispo_loss,
               "gppo": policy.gppo_loss, "topr": policy.topr_loss},
    "contrastive": {f"clipo_{o}": None for o in clipo.OBJECTIVES},
}


def test_every_loss_is_registered_under_exactly_one_kind():
  assert LOSS_KINDS == ("lm", "preference", "policy", "contrastive", "value")
  for kind, losses in EXPECTED.items():
    assert set(losses) <= set(known_losses(kind))
    for name, fn in losses.items():
      assert loss_kind(name) == kind
      assert fn is None or get_loss(kind, name) is fn
  names = [name for kind in LOSS_KINDS for name in known_losses(kind)]
  assert len(names) == len(set(names)), "a loss name is registered under two kinds"
  assert all(loss_kind(name) in LOSS_KINDS for name in names)


def test_wrong_kind_names_both_kinds():
  with pytest.raises(KeyError) as e:
    get_loss("lm", "bt")
  assert e.value.args[0] == f"'bt' is a preference loss, not a lm loss (lm losses: {', '.join(known_losses('lm'))})"
  for kind in LOSS_KINDS:
    for name in known_losses(kind):
      for other in set(LOSS_KINDS) - {kind}:
        with pytest.raises(KeyError, match=f"'{name}' is a {kind} loss, not a {other} loss"):
          get_loss(other, name)


def test_unknown_names_and_kinds():
  with pytest.raises(KeyError) as e:
    get_loss("lm", "mse")
  assert e.value.args[0] == f"unknown lm loss 'mse' (known: {', '.join(known_losses('lm'))})"
  known = r"\(known: lm, preference, policy, contrastive, value\)"
  with pytest.raises(KeyError, match=rf"unknown loss kind 'reward' {known}"):
    get_loss("reward", "bt")
  with pytest.raises(KeyError, match="unknown loss kind 'reward'"):
    known_losses("reward")
  with pytest.raises(KeyError, match=r"unknown loss 'mse' \(known: lm: lm_cross_entropy; preference: bt"):
    loss_kind("mse")


def test_duplicate_names_are_refused():
  with pytest.raises(ValueError, match="lm loss 'lm_cross_entropy' is already registered"):
    register_loss("lm", "lm_cross_entropy")(lambda *a: None)
  with pytest.raises(ValueError, match="'bt' is already registered as a preference loss; it cannot also be a lm"):
    register_loss("lm", "bt")(preference.bradley_terry)
  with pytest.raises(KeyError, match="unknown loss kind 'reward'"):
    register_loss("reward", "test_never_registered")
  assert register_loss("policy", "gspo")(grpo.gspo_loss) is grpo.gspo_loss   # the same function again: a no-op
  assert "bt" not in known_losses("lm") and loss_kind("bt") == "preference"


def test_advantage_estimators():
  assert isinstance(grpo.ADVANTAGES, Registry)
  assert grpo.ADVANTAGES.names() == ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline", "bnpo")
  assert grpo.ADVANTAGES.get("bnpo") is advantages.bnpo_advantages
  r = np.array([1.0, 0.0, 2.0, 2.0], np.float32)
  np.testing.assert_allclose(grpo.group_advantages(r, 2, "rloo"), grpo.rloo_advantages(r, 2))
  with pytest.raises(KeyError, match=re.escape("unknown advantage estimator 'ppo' (known: grpo, drgrpo, rloo")):
    grpo.group_advantages(r, 2, "ppo")
  with pytest.raises(ValueError, match="already registered"):
    grpo.ADVANTAGES.add("grpo", grpo.rloo_advantages)


def test_biases_norms_and_sharding_rules():
  assert {"length", "sycophancy", "format"} <= set(bias.BIASES)
  assert bias.BIASES.get("length").fn is bias.length_bias
  assert norms.NORMS.names() == ("rmsnorm", "layernorm")
  assert norms.NORMS.get("layernorm") is norms.LayerNorm
  assert isinstance(norms.make_norm("rmsnorm", 1e-5, np.float32, np.float32, "n"), norms.RMSNorm)
  with pytest.raises(KeyError, match=r"unknown norm 'batchnorm' \(known: rmsnorm, layernorm\)"):
    norms.make_norm("batchnorm", 1e-5, np.float32, np.float32, "n")
  assert rules.RULES.names() == ("dp", "fsdp", "tp", "fsdp_tp", "ep", "fsdp_ep")
  assert rules.get_rules("fsdp") is rules.RULES.get("fsdp")
  assert blocks.BLOCKS.names() == NORM_SCHEMES  # ModelConfig checks norm_scheme against the block registry's names
  assert blocks.BLOCKS.get("siamese_post_pre") is blocks.SiamesePostPreBlock
  with pytest.raises(KeyError, match=r"unknown sharding rules 'zero3' \(known: dp, fsdp, tp, fsdp_tp, ep, fsdp_ep\)"):
    rules.get_rules("zero3")
