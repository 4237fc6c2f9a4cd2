"""Pure loss functions on arrays, registered by kind (lm, preference, policy, contrastive, value; see `registry`)."""

from jaxpt.losses import advantages  # noqa: F401  (advantage estimator: bnpo, in grpo.ADVANTAGES)
from jaxpt.losses import clipo  # noqa: F401  (contrastive: clipo_infonce, _supcon_out, _supcon_in, _soft_nn)
from jaxpt.losses import entropy_control  # noqa: F401  (policy: clip_cov, kl_cov)
from jaxpt.losses import grpo  # noqa: F401  (policy: ppo_clip, gspo)
from jaxpt.losses import lm  # noqa: F401  (lm: lm_cross_entropy)
from jaxpt.losses import policy  # noqa: F401  (policy: cispo, gppo, topr)
from jaxpt.losses import preference  # noqa: F401  (preference: bt, dir, dpo, odin)
from jaxpt.losses import value  # noqa: F401  (value: clipped_value; GAE in value.TOKEN_ADVANTAGES)
from jaxpt.losses.registry import LOSS_KINDS, get_loss, known_losses, loss_kind, register_loss

__all__ = ["LOSS_KINDS", "get_loss", "known_losses", "loss_kind", "register_loss"]
