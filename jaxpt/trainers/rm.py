"""Reward-model training (Bradley-Terry, DIR, ODIN) on the shared loop: config -> preference data -> RewardModel.

One step on a batch of B pairs (spec: /work/shared/specs/dir.md):

    tokens = [chosen; rejected] [2B, S] -> ONE backbone forward: h = features(tokens) [2B, d]; h_c, h_r = h[:B], h[B:]
    DIR only:  X = club_input(h_c, h_r);  K AdamW steps of the estimator psi on -mean log q_psi(a | sg(X))
    loss = L(head(h), h)  with  L = L_BT | L_BT + lambda I_club(X, a) (psi held constant) | ODIN
    grads: d loss / d head directly, d loss / d backbone = vjp(features)(d loss / d h)  (the forward is not redone)

The estimator params and optimizer state live in `TrainState.aux` ({"q_params", "q_opt_state"}), so they are
checkpointed and a resumed run continues bit for bit. With `optim.grad_accum_steps = M` the batch is split into M
micro-batches, each with its own estimator update (as in the reference), gradients pair-weighted over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from absl import logging

from jaxpt import parallel
from jaxpt.config import Section, from_section, in_range, inline, one_of
from jaxpt.data import preference_batches
from jaxpt.data.preference_batches import PreferenceDataConfig
from jaxpt.losses import club as club_lib
from jaxpt.losses import get_loss
from jaxpt.models.reward import RewardModel
from jaxpt.progress import say
from jaxpt.registry import Registry
from jaxpt.trainers import dir_estimator
from jaxpt.engine.builder import Training, batch_shapes, build_training, training_mesh
from jaxpt.trainers.dir_estimator import DIRSettings
from jaxpt.engine.config import RunConfig, check_vocab
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.trainers.pairs import (BIAS_PREFIX, PairEvaluator, check_bias_label, eval_splits, flatten_batch, pair_tokens,
                               PairReport)
from jaxpt.engine.record import check_launch, resumes, run_inputs
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.step import make_train_step

__all__ = ["BIAS_PREFIX", "RMConfig", "RMEvaluator", "RMRunConfig", "build", "flatten_batch", "init_estimator",
           "make_rm_grad_fn", "make_rm_train_step", "pair_tokens", "rm_objective", "rm_training"]


class RMInputs(NamedTuple):
  """What a reward-model loss sees of one batch of B pairs (chosen rows first, then rejected): scores [2B]
  ([2B, 2] with two heads), final hidden states [2B, d], the head kernel [d, heads], the flat batch, and the DIR
  estimator's params (None for the other losses)."""

  scores: jax.Array
  hidden: jax.Array
  head_kernel: jax.Array
  batch: dict
  q_params: Optional[club_lib.Params]

  @property
  def pairs(self) -> int:
    return self.batch["chosen_tokens"].shape[0]


@dataclasses.dataclass(frozen=True)
class RMObjective:
  """How the RM trainer calls a registered `preference` loss: call(settings, inputs, bt_options) -> (loss,
  metrics); num_scores: score heads; uses_club: the DIR estimator is trained in the step (state in aux)."""

  call: Callable[["RMConfig", RMInputs, dict], tuple[jax.Array, dict]]
  num_scores: int = 1
  uses_club: bool = False


def _bt(settings: "RMConfig", x: RMInputs, options: dict) -> tuple[jax.Array, dict]:
  b = x.pairs
  return get_loss("preference", "bt")(x.scores[:b], x.scores[b:], **options)


def _dir(settings: "RMConfig", x: RMInputs, options: dict) -> tuple[jax.Array, dict]:
  b = x.pairs
  return get_loss("preference", "dir")(x.scores[:b], x.scores[b:], x.hidden[:b], x.hidden[b:],
                                       x.batch[BIAS_PREFIX + settings.bias], x.q_params, settings.mi_weight,
                                       settings.club_mode, **options)


def _odin(settings: "RMConfig", x: RMInputs, options: dict) -> tuple[jax.Array, dict]:
  if settings.odin_length_sign not in ODIN_LENGTH_SIGNS:
    raise ValueError("rm.odin_length_sign='auto' is resolved from the training data by build; outside it pass "
                     "'longer' or 'shorter'")
  b, s = x.pairs, x.scores
  return get_loss("preference", "odin")(s[:b, 0], s[b:, 0], s[:b, 1], s[b:, 1], x.batch["chosen_response_len"],
                                        x.batch["rejected_response_len"], x.head_kernel[:, 0], x.head_kernel[:, 1],
                                        settings.odin_corr_coef, settings.odin_ortho_coef, **options,
                                        length_sign=ODIN_LENGTH_SIGNS[settings.odin_length_sign])


ODIN_LENGTH_SIGNS = {"longer": 1.0, "shorter": -1.0}  # rm.odin_length_sign ('auto' is resolved by build)
RM_OBJECTIVES: Registry[RMObjective] = Registry("reward-model loss")  # rm.loss -> how the step calls it
RM_OBJECTIVES.add("bt", RMObjective(_bt))
RM_OBJECTIVES.add("dir", RMObjective(_dir, uses_club=True))
RM_OBJECTIVES.add("odin", RMObjective(_odin, num_scores=2))


@dataclasses.dataclass(frozen=True)
class RMConfig(Section):
  """The `rm` section: the loss and its options.

  Attributes:
    loss: bt (Bradley-Terry) | dir (BT + CLUB mutual-information penalty) | odin (quality and length heads).
    margin: Bradley-Terry option (all losses): m in z = r_chosen - r_rejected - m.
    label_smoothing: Bradley-Terry option (all losses): eps in [0, 0.5] of the smoothed logistic loss.
    center_coef: Bradley-Terry option (all losses): weight of reward centering, c * mean (r_chosen + r_rejected)^2.
    dir_settings: the DIR options (`jaxpt.trainers.dir_estimator.DIRSettings`), held inline: their fields are the
      section's own (`rm.mi_weight`, `rm.bias`, ...).
    odin_corr_coef: ODIN: weight of the length-correlation term |rho(r_Q, len)| - s rho(r_L, len) (s: the sign below).
    odin_ortho_coef: ODIN: weight of the head-orthogonality term |W_Q^T W_L|.
    odin_length_sign: ODIN: which way the length head must track length: longer (longer responses win, ODIN's
      setting) | shorter (shorter responses win, e.g. hh-rlhf harmless) | auto (from the training pairs: longer if
      at least half of the chosen responses have more tokens, else shorter; logged at start).
  """

  loss: str = "bt"
  margin: float = 0.0
  label_smoothing: float = 0.0
  center_coef: float = 0.0
  dir_settings: DIRSettings = inline(DIRSettings())
  odin_corr_coef: float = 1.0
  odin_ortho_coef: float = 1.0
  odin_length_sign: str = "auto"

  def check(self) -> None:
    one_of(self, "loss", RM_OBJECTIVES)
    one_of(self, "odin_length_sign", ("auto", *ODIN_LENGTH_SIGNS))
    for name in ("margin", "center_coef", "odin_corr_coef", "odin_ortho_coef"):
      in_range(self, name, 0.0)
    in_range(self, "label_smoothing", 0.0, 0.5)

  @property
  def objective(self) -> RMObjective:
    return RM_OBJECTIVES.get(self.loss)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RMRunConfig(RunConfig):
  """A reward-model run: `RunConfig` plus these sections; `init_from` fills the backbone.

  Attributes:
    data: the preference pairs and their batching.
    rm: the reward-model loss and its options.
  """

  data: PreferenceDataConfig = PreferenceDataConfig()
  rm: RMConfig = RMConfig()

  def check(self) -> None:
    super().check()
    if self.rm.objective.uses_club:
      check_bias_label("rm", self.rm.dir_settings, self.data)
    self.check_seq_len(self.data.seq_len, "data.seq_len")
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")


# ---------------------------------------------------------------------------------------------------------------
# The step


def rm_objective(settings: RMConfig, scores: jax.Array, hidden: jax.Array, head_kernel: jax.Array, batch: dict,
                 q_params: Optional[club_lib.Params]) -> tuple[jax.Array, dict]:
  """The configured loss on one batch: scores [2B] ([2B, 2] for ODIN), hidden [2B, d], head kernel [d, n]."""
  bt_options = dict(margin=settings.margin, label_smoothing=settings.label_smoothing,
                    center_coef=settings.center_coef, weights=batch["weights"])
  inputs = RMInputs(scores, hidden, head_kernel, batch, q_params)
  return RM_OBJECTIVES.get(settings.loss).call(settings, inputs, bt_options)


def init_estimator(settings: RMConfig, d_model: int, rng: jax.Array) -> Optional[dict]:
  """`TrainState.aux` for DIR: {"q_params", "q_opt_state"}; None for the other losses."""
  return dir_estimator.init_estimator(settings.dir_settings, d_model, rng) if settings.objective.uses_club else None


def make_rm_grad_fn(model: RewardModel, settings: RMConfig) -> Callable:
  """grad_fn(params, aux, batch, rng) -> (grads, aux, metrics) for one (micro-)batch of pairs.

  One backbone forward over [2B, S] under `jax.vjp`; the DIR estimator moves K steps on the primal hidden states
  (its update never sees the RM gradient), then the loss gradient w.r.t. (head, hidden) is pulled back through the
  stored vjp. rng: dropout key (unused when model.config.dropout_rate = 0). metrics gain `num_pairs` (sum of pair
  weights) and, for DIR, `estimator_loss_first`/`estimator_loss` (L_q before the first / last inner step) and
  `estimator_accuracy` (before the last step).
  """
  use_dropout = model.config.dropout_rate > 0

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    tokens, last = pair_tokens(batch)

    def features(backbone):
      return model.apply({"params": {"backbone": backbone}}, tokens, last, not use_dropout,
                         rngs={"dropout": rng} if use_dropout else None, method=RewardModel.features)

    hidden, pullback = jax.vjp(features, params["backbone"])
    extra = {}
    q_params = None
    if settings.objective.uses_club:
      b = batch["chosen_tokens"].shape[0]
      aux, extra = dir_estimator.estimator_update(settings.dir_settings, aux, hidden[:b], hidden[b:],
                                                  batch[BIAS_PREFIX + settings.bias], batch["weights"])
      q_params = aux["q_params"]

    def objective(head, h):
      scores = model.apply({"params": {"head": head}}, h, method=RewardModel.score)
      return rm_objective(settings, scores, h, head["kernel"], batch, q_params)

    (_, metrics), (head_grads, hidden_grads) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
        params["head"], hidden)
    (backbone_grads,) = pullback(hidden_grads)
    metrics = dict(metrics, **extra, num_pairs=jnp.sum(batch["weights"].astype(jnp.float32)))
    return {"backbone": backbone_grads, "head": head_grads}, aux, metrics

  return grad_fn


def make_rm_train_step(model: RewardModel, settings: RMConfig, optimizer: optax.GradientTransformation,
                       schedule: optax.Schedule, grad_accum_steps: int = 1) -> Callable:
  """train_step(state, batch) -> (state, metrics) (un-jitted): the shared step (`jaxpt.engine.step`) on
  `make_rm_grad_fn`, batch as from `flatten_batch`. With M = grad_accum_steps > 1 the micro-batches run in order,
  the estimator state carried from one to the next; grads and metrics are pair-weighted means (`num_pairs` the sum).
  """
  return make_train_step(None, optimizer, schedule, grad_accum_steps, "num_pairs",
                         grad_fn=make_rm_grad_fn(model, settings))


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


class RMEvaluator(PairEvaluator):
  """`PairEvaluator` with the reward model's scores (the quality head r_Q for ODIN); out_sharding: of the scores
  (replicated lets every process of a multi-host run read them whole)."""

  def __init__(self, model: RewardModel, splits: dict[str, tuple[list[dict], dict]],
               put: Callable[[dict], dict] = lambda batch: batch, out_sharding: Any = None):
    def score(params: Any, batch: dict) -> jax.Array:
      tokens, last = pair_tokens(batch)
      scores, _ = model.apply({"params": params}, tokens, last)
      return scores if scores.ndim == 1 else scores[:, 0]

    super().__init__(jax.jit(score, out_shardings=out_sharding), splits, put)


# ---------------------------------------------------------------------------------------------------------------
# Build and run


def rm_training(config: RMRunConfig, settings: RMConfig, mesh: Any, shapes: dict[str, jax.ShapeDtypeStruct],
                donate: bool | None = None) -> Training:
  """The shared builder's reward-model step on `mesh` for batches of `shapes` (flattened pairs), `settings` the run's
  `rm` section with odin_length_sign resolved: what `build` runs and `jaxpt plan` compiles. With LoRA the score head
  trains whole beside the backbone's adapters."""
  model = RewardModel(config.model, settings.objective.num_scores, lora=config.lora.spec())
  init_args = (jnp.zeros((1, config.data.seq_len), jnp.int32), jnp.zeros((1,), jnp.int32))
  init_aux = lambda rng: init_estimator(settings, config.model.d_model, rng)
  return build_training(config, mesh, model, init_args, shapes, grad_fn=make_rm_grad_fn(model, settings),
                        weight_key="num_pairs", init_aux=init_aux, init_from_subtree="backbone", new_heads=("head",),
                        donate=donate)


def build(config: RMRunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds preference data, RewardModel, optimizer, the
  compiled step and evaluator. `config.init_from` (a jaxpt pretrain/SFT workdir, or hf:DIR) fills the backbone's
  params and gives the tokenizer."""
  config = from_section(RMRunConfig, config, "config")
  settings = config.rm
  batch_size = config.data.batch_size
  mesh = training_mesh(config, batch_size)  # before any data work
  check_launch(workdir, config)
  say(f"preparing preference data in {workdir} ...")
  data = preference_batches.PreferenceData.create(
      config.data, vocab_size=config.model.vocab_size, workdir=workdir, seed=config.seed,
      tokenizer=init_tokenizer(config.init_from, workdir, resumes(workdir), config.model),
      keep_tokenizer=resumes(workdir))
  check_vocab(config.model, data.tokenizer.vocab_size)
  if settings.loss == "odin" and settings.odin_length_sign == "auto":
    share = data.chosen_longer_share("train")
    settings = dataclasses.replace(settings, odin_length_sign="longer" if share >= 0.5 else "shorter")
    logging.info("rm.odin_length_sign=auto: %.3f of the training pairs' chosen responses are longer -> %s", share,
                 settings.odin_length_sign)

  def train_batch(step: int, index: int, count: int) -> dict:
    return flatten_batch(data.train_batch(step, index, count))

  say("compiling the train step ...")
  training = rm_training(config, settings, mesh, batch_shapes(train_batch(0, 0, 1), batch_size))
  evaluator = RMEvaluator(training.model, eval_splits(data), put=training.put, out_sharding=parallel.replicated(mesh))
  return BuiltRun("rm", config, training, training.batches(train_batch, batch_size),
                  inputs=run_inputs(data.corpus_id, data.tokenizer), tokenizer=data.tokenizer, data=data,
                  evaluate=training.under_rules(evaluator), title=f"rm ({settings.loss})",
                  hooks=PairReport(training, evaluator, f"reward model ({settings.loss})"))
