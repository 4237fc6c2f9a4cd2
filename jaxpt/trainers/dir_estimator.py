"""The DIR term in a trainer: its settings, the CLUB estimator's state in `TrainState.aux`, its inner update.

Shared by the reward-model trainer (`rm.loss = dir`) and DPO+DIR (`dpo.dir = True`); spec: /work/shared/specs/dir.md.
Per (micro-)batch of N pairs with last-token final hidden states h_c, h_r [N, d] and bias labels a [N]:

    X = club_input(sg(h_c), sg(h_r), club_mode)                                  [N, d] or [N, 2d]
    K AdamW steps of psi on  L_q(psi) = -(1/N) sum_i log q_psi(a_i | X_i)          (`club.inner_update`)

then the trainer's loss adds lambda * I_club(X, a) with the updated psi held constant. aux = {"q_params",
"q_opt_state"} is checkpointed with the state, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import optax

from jaxpt.config import Section, at_least, in_range, one_of
from jaxpt.losses import club as club_lib


@dataclasses.dataclass(frozen=True)
class DIRSettings(Section):
  """The DIR settings a loss section (`rm`, `dpo`) holds inline: their fields are the section's own (`rm.mi_weight`).

  Attributes:
    mi_weight: DIR: lambda, the weight of the CLUB mutual-information term, applied to the estimate over the global
      batch (all data-parallel devices) at any device count. The official DIR code under data parallelism applies
      the MI gradient at lambda / world_size: its 8-GPU lambda = 1 runs equal mi_weight = 0.125 here.
    bias: DIR: the data's bias label a used by CLUB (one of data.biases).
    club_mode: DIR: the estimator's input from the pair's hidden states: difference | concat.
    inner_steps: DIR: K, the estimator's AdamW steps per batch.
    estimator_lr: DIR: learning rate of the estimator's AdamW.
    estimator_weight_decay: DIR: weight decay of the estimator's AdamW.
    estimator_hidden: DIR: hidden width of the estimator.
    bias_classes: DIR: classes of the bias label a.
  """

  mi_weight: float = 0.1
  bias: str = "length"
  club_mode: str = "difference"
  inner_steps: int = 5
  estimator_lr: float = 1e-4
  estimator_weight_decay: float = 0.01
  estimator_hidden: int = 1024
  bias_classes: int = 2

  def check(self) -> None:
    in_range(self, "mi_weight", 0.0)
    in_range(self, "estimator_weight_decay", 0.0)
    for name, minimum in (("inner_steps", 1), ("estimator_hidden", 1), ("bias_classes", 2)):
      at_least(self, name, minimum)
    in_range(self, "estimator_lr", 0.0, low_open=True)
    one_of(self, "club_mode", club_lib.CLUB_INPUT_MODES)

  def estimator_optimizer(self) -> optax.GradientTransformation:
    return club_lib.make_estimator_optimizer(self.estimator_lr, self.estimator_weight_decay)


def init_estimator(settings: DIRSettings, d_model: int, rng: jax.Array) -> dict:
  """`TrainState.aux` of the DIR term: {"q_params", "q_opt_state"} for hidden size d_model."""
  q_params = club_lib.init_club_estimator(rng, club_lib.club_input_dim(d_model, settings.club_mode),
                                          settings.bias_classes, settings.estimator_hidden)
  return {"q_params": q_params, "q_opt_state": settings.estimator_optimizer().init(q_params)}


def estimator_update(settings: DIRSettings, aux: dict, hidden_chosen: jax.Array, hidden_rejected: jax.Array,
                     labels: jax.Array, weights: Optional[jax.Array] = None) -> tuple[dict, dict]:
  """K inner steps of the estimator on X = club_input(h_c, h_r) (stop-gradient) and labels a [N].

  Returns (aux, metrics): the updated {"q_params", "q_opt_state"} and `estimator_loss_first` / `estimator_loss`
  (L_q before the first / last inner step), `estimator_accuracy` (before the last step).
  """
  x = club_lib.club_input(hidden_chosen, hidden_rejected, settings.club_mode)
  q_params, q_opt_state, inner = club_lib.inner_update(aux["q_params"], aux["q_opt_state"], x, labels,
                                                       settings.estimator_optimizer(), settings.inner_steps, weights)
  metrics = {"estimator_loss_first": inner["estimator_loss"][0], "estimator_loss": inner["estimator_loss"][-1],
             "estimator_accuracy": inner["estimator_accuracy"][-1]}
  return {"q_params": q_params, "q_opt_state": q_opt_state}, metrics
