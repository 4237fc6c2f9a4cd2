"""The run config of `jaxpt ppo`: the `ppo` section (rollouts per prompt, the critic's start and optimizer, value
warm-up, GAE, clip ranges, KL in the reward, update schedule) and `PPORunConfig`, which holds it beside the task,
prompts, sampling, DAPO and reward sections GRPO has. The trainer is `jaxpt.trainers.ppo`.
"""

from __future__ import annotations

import dataclasses

from jaxpt.config import ConfigError, Section, at_least, fail, in_range, one_of
from jaxpt.data.math_task import PromptDataConfig, TaskConfig
from jaxpt.engine.config import RunConfig, check_init_from
from jaxpt.losses.grpo import AGG_MODES, KL_KINDS
from jaxpt.rl import dapo
from jaxpt.rl.collect import check_config
from jaxpt.rl.engine import EngineConfig
from jaxpt.rl.reward_sources import RewardConfig
from jaxpt.rl.sampler import SamplingConfig

__all__ = ["PPOConfig", "PPORunConfig"]


@dataclasses.dataclass(frozen=True)
class PPOConfig(Section):
  """The `ppo` section.

  Attributes:
    group_size: rollouts sampled per prompt (1: classic PPO; a critic needs no group baseline).
    critic_init: '' = the critic starts from the policy's own start (init_from's params, or the seeded init) with
      a fresh value head; else a jaxpt reward-model run's workdir (`jaxpt rm`) whose backbone starts the critic and
      whose scalar score head (ODIN: the quality head) becomes the per-token value head (InstructGPT, ms-swift).
      The RM must use the policy's tokenizer and prompt format: per-token GAE needs a value at each of the
      policy's response tokens (an RM of other tokens may still be `reward.model`, scored on re-tokenized text,
      beside a critic started from the policy).
    critic_learning_rate: the critic optimizer's peak learning rate (its other settings are `optim`'s: AdamW,
      warm-up and cosine decay over the critic's own updates, clipping of its own gradient).
    value_warmup_steps: the first loop steps update the critic only (the policy neither moves nor advances its
      optimizer); not CLIPO's `critic_warmup`.
    epochs: passes of updates over each step's rollouts.
    minibatches: updates per pass, each of whole groups (must divide config.data.prompts_per_step).
    eps_lo: the policy ratio is clipped below at 1 - eps_lo.
    eps_hi: ... and above at 1 + eps_hi.
    dual_clip_c: dual-clip bound c (> 1) for negative advantages; 0 = off (classic PPO).
    value_clip: the value loss's clip range around the rollout-time values (0 = no clipping).
    gamma: GAE's discount.
    lam: GAE's lambda.
    kl_coef: the per-token KL-to-the-reference penalty in the reward (0 = no reference policy).
    kl_kind: its estimator: k1 (trl's and OpenRLHF's default) | k2 | k3.
    whiten_advantages: advantages whitened over the step's response tokens (trl's masked_whiten).
    agg: token aggregation of both losses: token-mean | seq-mean-token-sum | seq-mean-token-mean |
      seq-mean-token-sum-norm.
  """

  group_size: int = 1
  critic_init: str = ""
  critic_learning_rate: float = 1e-4
  value_warmup_steps: int = 0
  epochs: int = 1
  minibatches: int = 1
  eps_lo: float = 0.2
  eps_hi: float = 0.2
  dual_clip_c: float = 0.0
  value_clip: float = 0.2
  gamma: float = 1.0
  lam: float = 0.95
  kl_coef: float = 0.05
  kl_kind: str = "k1"
  whiten_advantages: bool = True
  agg: str = "token-mean"

  def check(self) -> None:
    for name in ("group_size", "epochs", "minibatches"):
      at_least(self, name, 1)
    at_least(self, "value_warmup_steps", 0)
    in_range(self, "critic_learning_rate", 0.0, low_open=True)
    for name in ("eps_lo", "eps_hi", "dual_clip_c", "value_clip", "kl_coef"):
      in_range(self, name, 0.0)
    for name in ("gamma", "lam"):
      in_range(self, name, 0.0, 1.0)
    if 0 < self.dual_clip_c <= 1:
      raise fail(self, "dual_clip_c", "must be > 1 (or 0 = off)")
    one_of(self, "kl_kind", KL_KINDS)
    one_of(self, "agg", AGG_MODES)
    if self.critic_init:
      check_init_from(self.critic_init, "critic_init", critic=True)  # the section prefixes config.ppo.

  def loss_kwargs(self) -> dict:
    """The `ppo_clip` policy loss's keyword arguments."""
    return dict(eps_lo=self.eps_lo, eps_hi=self.eps_hi, dual_clip_c=self.dual_clip_c or None, agg=self.agg)

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPORunConfig(RunConfig):
  """A PPO run: `RunConfig` plus these sections. `optim` is the policy's optimizer (steps x epochs x minibatches
  updates after the value warm-up); the critic's is `optim` at `ppo.critic_learning_rate`. grad_accum_steps splits
  each minibatch. With `lora.rank > 0` both models train LoRA adapters, the critic's value head whole (as `jaxpt rm`
  trains a LoRA reward model's score head); the reference is the policy's base, adapters off (`jaxpt.trainers.ppo`).

  Attributes:
    task: the math task whose problems are the prompts and whose answers the verifier checks.
    data: prompts per step, their padded length, eval problems.
    sampling: how rollouts are sampled.
    ppo: rollouts per prompt, the critic, GAE, clip ranges, KL in the reward and the update schedule.
    dapo: DAPO's overlong filtering and soft overlong punishment (off by default).
    reward: the reward's sources (verifier, a reward model) and their weights, clipping, normalisation and the
      EOS-missing penalty; the per-token KL penalty is `ppo.kl_coef`'s.
    engine: the rollout engine (training rollouts through continuous batching over a paged KV cache,
      `jaxpt.rl.engine`; by default on CPU, and the static sampler on GPU and TPU: `EngineConfig.enabled`) and its
      slots and page pool.
  """

  task: TaskConfig = TaskConfig()
  data: PromptDataConfig = PromptDataConfig()
  sampling: SamplingConfig = SamplingConfig(max_new_tokens=40)
  ppo: PPOConfig = PPOConfig()
  dapo: dapo.DAPOConfig = dapo.DAPOConfig()
  reward: RewardConfig = RewardConfig()
  engine: EngineConfig = EngineConfig()

  def check(self) -> None:
    super().check()
    check_config(self)  # prompt + response length, DAPO's overlong settings
    if self.dapo.dynamic_sampling:
      raise ConfigError("dapo.dynamic_sampling", "is GRPO's (it drops groups of equal rewards, which a critic's "
                        "advantages do not need)", True)
    if self.data.prompts_per_step % self.ppo.minibatches:  # a minibatch holds whole groups (`split_groups`)
      raise ConfigError("ppo.minibatches", f"must divide config.data.prompts_per_step={self.data.prompts_per_step} "
                        "(each minibatch holds whole groups of config.ppo.group_size rollouts)", self.ppo.minibatches)
    self.check_batch_split(self.minibatch_rows, "the rollouts per minibatch (config.data.prompts_per_step x "
                           "config.ppo.group_size / config.ppo.minibatches)")
    if self.ppo.value_warmup_steps >= self.steps > 0:
      raise ConfigError("ppo.value_warmup_steps", f"must be < config.steps={self.steps} (the policy would never "
                        "move)", self.ppo.value_warmup_steps)

  @property
  def group_size(self) -> int:
    """Rollouts per prompt (the collector's G): ppo.group_size."""
    return self.ppo.group_size

  @property
  def rollout_rows(self) -> int:
    return self.data.prompts_per_step * self.ppo.group_size

  @property
  def minibatch_rows(self) -> int:
    """Rollouts per update: prompts_per_step x group_size / minibatches."""
    return self.rollout_rows // self.ppo.minibatches

  @property
  def updates_per_step(self) -> int:
    return self.ppo.epochs * self.ppo.minibatches
