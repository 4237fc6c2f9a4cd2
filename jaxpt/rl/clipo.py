"""CLIPO pieces the GRPO trainer calls: config, rollout representation, head state, head step, in-loss term.

Spec: /work/shared/specs/grpo_clipo.md, section CLIPO; official code github Qwen-Applications/CLIPO @ 13c5fd6
(`verl/trainer/ppo/ray_trainer.py` cited as rt:LINE, `modified/scheduler_output_processor_mixin.py` as mx:LINE).
One training step with CLIPO on:
  reps = rollout_representation(hidden, response_mask)                   # [N, d], pooled final-norm hidden states
  state, r_con, m = head_step(config, state, reps, rewards, group_ids, rng)  # r_con from the head BEFORE its update
  rewards = rewards + r_con                                              # then the group advantage
and, with `in_loss_coef > 0`, the policy loss gets `in_loss_coef * in_loss_term(...)[0]` (gradient into the policy's
hidden states through a fixed head). The policy is updated at training step s (1-based) only when
`critic_warmup <= s` (rt:1516, global_steps starting at 1, rt:1267); the head trains every step. The official runs
set critic_warmup = 14 on GSM8K (scripts/train_gsm8k.sh:43), freezing the policy for its first 13 steps.

Batch keys (all `[N]` or `[N, ...]`, N rollouts): `hidden` `[N, T, d]` column t the final-norm hidden state (the
LM-head input; any float dtype) response token t was sampled from, so column 0 is the last prompt token's; `mask`
`[N, T]` 1 on real response tokens; `labels` `[N]` the verifier rewards or 0/1 correctness (y = 1[label > 0]);
`group_ids` `[N]` int prompt id of each rollout.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxpt.losses import clipo as clipo_loss
from jaxpt.losses import get_loss
from jaxpt.config import ConfigError, Section, at_least, fail, in_range, one_of
from jaxpt.models.heads import HEAD_KINDS, ProjectionHead

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class CLIPOConfig(Section):
  """The `clipo` section (all fields optional; absent section = CLIPO off). Frozen, so hashable: a static jit
  argument.

  Attributes:
    enabled: CLIPO on: a contrastive head on the rollouts' hidden states adds r_con to the rewards.
    head: projection head kind: linear | mlp.
    out_dim: D, the head's output width.
    temperature: tau of the contrastive loss.
    objective: the contrastive loss: infonce | supcon_out | supcon_in | soft_nn (official loss_type infonce_loss |
      supcon_loss_out | supcon_loss_in | soft_nn_loss).
    level: which rollouts are positives and candidates, official names: group_level | batch_level | cross_level
      (`jaxpt.losses.clipo`).
    distance: similarity of head outputs: cosine | l2 (official cosine_distance | l2_distance).
    masked_label: rollouts with this label never anchor: 0 incorrect (official default), 1 correct, -1 none.
    reward_coef: lambda in r_con = max(-lambda * L_i * y_i, reward_floor).
    reward_floor: the lowest r_con (<= 0).
    learning_rate: the head's AdamW learning rate.
    weight_decay: the head's AdamW weight decay.
    in_loss_coef: weight of the in-loss variant, the contrastive loss added to the policy loss through a fixed head
      (0 = off).
    critic_warmup: the official `trainer.critic_warmup`: the policy is first updated at training step
      critic_warmup (1-based), so max(critic_warmup - 1, 0) first steps train only the head.
  """

  enabled: bool = False
  head: str = "linear"
  out_dim: int = 512
  temperature: float = clipo_loss.TEMPERATURE
  objective: str = "infonce"
  level: str = "group_level"
  distance: str = "cosine"
  masked_label: int = 0
  reward_coef: float = clipo_loss.REWARD_COEF
  reward_floor: float = clipo_loss.REWARD_FLOOR
  learning_rate: float = 1e-3
  weight_decay: float = 0.01
  in_loss_coef: float = 0.0
  critic_warmup: int = 0

  @classmethod
  def prepare_values(cls, values: dict[str, Any], path: str) -> dict[str, Any]:
    if "freeze_policy_steps" in values:
      raise ConfigError(f"{path}.freeze_policy_steps", "renamed: use critic_warmup = freeze_policy_steps + 1 "
                        "(the official trainer.critic_warmup: the policy is first updated at step critic_warmup)",
                        values["freeze_policy_steps"])
    return values

  def check(self) -> None:
    if self.level in clipo_loss.RENAMED_LEVELS:
      raise fail(self, "level", "renamed to the official names: group -> group_level, batch -> cross_level, "
                 "cross -> batch_level")
    choices = {"head": HEAD_KINDS, "objective": clipo_loss.OBJECTIVES, "level": clipo_loss.LEVELS,
               "distance": clipo_loss.DISTANCES, "masked_label": clipo_loss.MASKED_LABELS}
    for field, allowed in choices.items():
      one_of(self, field, allowed)
    at_least(self, "out_dim", 1)
    at_least(self, "critic_warmup", 0)
    for field in ("temperature", "learning_rate"):
      in_range(self, field, 0.0, low_open=True)
    for field in ("reward_coef", "weight_decay", "in_loss_coef"):
      in_range(self, field, 0.0)
    if not -float("inf") < self.reward_floor <= 0:
      raise fail(self, "reward_floor", "must be finite and <= 0")

  def head_module(self) -> ProjectionHead:
    return ProjectionHead(out_dim=self.out_dim, kind=self.head)

  def optimizer(self) -> optax.GradientTransformation:
    """The head's own AdamW (lr 1e-3, weight decay 0.01 by default)."""
    return optax.adamw(self.learning_rate, weight_decay=self.weight_decay)

  def loss_kwargs(self) -> dict[str, Any]:
    return {"objective": self.objective, "level": self.level, "distance": self.distance,
            "temperature": self.temperature, "masked_label": self.masked_label}

  @property
  def frozen_steps(self) -> int:
    """Training steps (counted from 0) before the first policy update: step s is frozen iff s < frozen_steps,
    i.e. iff critic_warmup > s + 1 (rt:1516 with the 1-based global_steps of rt:1267)."""
    return max(self.critic_warmup - 1, 0)


def rollout_representation(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """x_i = sum_{t >= 1} m_it h_it / L_i, L_i = sum_t m_it: hidden `[N, T, d]`, mask `[N, T]` -> `[N, d]` float32.

  h_it is the final-norm hidden state response token t was sampled from (the sampler's and `response_logits`'
  layout), so column 0 is the last prompt token's and is left out, while L_i counts every response token. That is
  the official pooling: the patched SGLang adds the hidden state of each decode step's input token (response tokens
  0..L-2, the states that sampled tokens 1..L-1; prefill's, which sampled token 0, is not added, mx:113 is
  disabled) and divides by len(output_ids) = L (mx:271-278). A row with L_i <= 1 gives 0. Differentiable (the
  in-loss variant needs that); `head_step` stops its gradient. Masked positions are zeroed before the sum, so
  whatever they hold cannot leak in.
  """
  m = jnp.asarray(mask, jnp.float32)
  count = jnp.sum(m, axis=1, keepdims=True)
  m = m.at[:, 0].set(0.0)
  h = jnp.where(m[..., None] != 0, jnp.asarray(hidden, jnp.float32), 0.0)
  return jnp.sum(h * m[..., None], axis=1) / jnp.where(count > 0, count, 1.0)


@flax.struct.dataclass
class CLIPOHeadState:
  """The head's float32 params (unboxed) and its AdamW state: a pytree, carried in `TrainState.aux`."""

  params: Any
  opt_state: Any


def init_head_state(config: CLIPOConfig, d_model: int, rng: jax.Array) -> CLIPOHeadState:
  """Head params for input width d_model (output config.out_dim) and a fresh optimizer state."""
  params = nn.meta.unbox(config.head_module().init(rng, jnp.zeros((1, d_model), jnp.float32))["params"])
  return CLIPOHeadState(params=params, opt_state=config.optimizer().init(params))


def _head_loss(config: CLIPOConfig, params: Any, reps: jax.Array, labels: jax.Array, group_ids: jax.Array,
               rng: jax.Array) -> tuple[jax.Array, Metrics]:
  z = config.head_module().apply({"params": params}, reps)
  kwargs = config.loss_kwargs()
  loss = get_loss("contrastive", "clipo_" + kwargs.pop("objective"))
  return loss(z, labels, group_ids, rng, **kwargs)


@functools.partial(jax.jit, static_argnums=0)
def head_step(config: CLIPOConfig, state: CLIPOHeadState, reps: jax.Array, labels: jax.Array,
              group_ids: jax.Array, rng: jax.Array) -> tuple[CLIPOHeadState, jax.Array, Metrics]:
  """Contrastive rewards from the current head, then one AdamW step of the head on the same loss.

  reps `[N, d]` (stop-gradient here), labels / group_ids `[N]`, rng (draws the InfoNCE positives) ->
  (new state, r_con `[N]` float32 = max(-reward_coef * L_i * y_i, reward_floor) with L_i from the head BEFORE the
  update, scalar metrics `loss`, `num_anchors`, `pos_sim`, `neg_sim`, `reward_mean`, `reward_min`,
  `head_grad_norm` (unprefixed: the trainer logs them as `clipo_<name>`)). Compiled, `config` static (a frozen,
  hashable dataclass); composes with an outer jit / grad.
  """
  reps = jax.lax.stop_gradient(jnp.asarray(reps, jnp.float32))
  grad_fn = jax.value_and_grad(lambda p: _head_loss(config, p, reps, labels, group_ids, rng), has_aux=True)
  (loss, m), grads = grad_fn(state.params)
  rewards = clipo_loss.contrastive_reward(m["per_rollout_loss"], labels, config.reward_coef, config.reward_floor)
  updates, opt_state = config.optimizer().update(grads, state.opt_state, state.params)
  new_state = CLIPOHeadState(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
  metrics = {
      "loss": loss,
      "num_anchors": m["num_anchors"],
      "pos_sim": m["pos_sim"],
      "neg_sim": m["neg_sim"],
      "reward_mean": jnp.mean(rewards),
      "reward_min": jnp.min(rewards),
      "head_grad_norm": optax.global_norm(grads),
  }
  return new_state, rewards, metrics


def in_loss_term(config: CLIPOConfig, head_params: Any, hidden: jax.Array, mask: jax.Array, labels: jax.Array,
                 group_ids: jax.Array, rng: jax.Array) -> tuple[jax.Array, Metrics]:
  """The in-loss variant: the contrastive loss on the policy's own (NOT stop-gradient) representation
  rollout_representation(hidden, mask), with the head held fixed (stop-gradient on head_params).

  hidden `[N, T, d]`, mask `[N, T]`, labels / group_ids `[N]` -> (loss, {`in_loss`, `in_num_anchors`}). Its
  gradient reaches `hidden` (hence the policy) only; the trainer adds `config.in_loss_coef * loss` to the policy
  loss.
  """
  reps = rollout_representation(hidden, mask)
  loss, m = _head_loss(config, jax.lax.stop_gradient(head_params), reps, labels, group_ids, rng)
  return loss, {"in_loss": loss, "in_num_anchors": m["num_anchors"]}
