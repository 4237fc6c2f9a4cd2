"""The run config of `jaxpt grpo`: the `grpo` section (group size, advantage estimator, policy loss and its options,
KL, update schedule, KDRL's teacher) and `GRPORunConfig`, which holds it beside the task, prompts, sampling, DAPO,
CLIPO and reward sections. The trainer is `jaxpt.trainers.grpo`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

from jaxpt.config import ConfigError, Section, at_least, fail, in_range, one_of
from jaxpt.data.math_task import PromptDataConfig, TaskConfig
from jaxpt.engine.config import RunConfig
from jaxpt.losses import get_loss
from jaxpt.losses.grpo import ADVANTAGES, AGG_MODES, KD_KINDS, KL_KINDS
from jaxpt.rl import clipo, dapo
from jaxpt.rl.collect import check_config
from jaxpt.rl.engine import EngineConfig
from jaxpt.rl.reward_sources import RewardConfig
from jaxpt.rl.sampler import SamplingConfig

__all__ = ["GRPOConfig", "GRPORunConfig"]


@dataclasses.dataclass(frozen=True)
class GRPOConfig(Section):
  """The `grpo` section: rollouts per prompt, advantage estimator, policy loss and its options, update schedule.

  Attributes:
    group_size: G, rollouts sampled per prompt (one group).
    advantage: a registered advantage estimator: grpo | drgrpo | rloo | reinforce_pp_baseline | bnpo.
    policy_loss: a registered `policy` loss: ppo_clip | gspo | cispo | gppo | topr | clip_cov | kl_cov. The fields
      below reach a loss as the keyword arguments it declares: topr takes neither eps nor dual_clip_c (its [0, 1]
      taper is fixed), kl_cov no clip at all, clip_cov eps but no dual clip; a loss that declares `rng` (clip_cov)
      gets a key of its own from each update's key.
    eps_lo: lower clip range: the ratio is clipped below at 1 - eps_lo (cispo: the IS weight; its paper sets no
      lower bound, i.e. eps_lo >= 1).
    eps_hi: upper clip range: the ratio is clipped above at 1 + eps_hi (> eps_lo: DAPO clip-higher; cispo: the
      IS weight's cap; gppo: clipped tokens keep the gradient -A (1 + eps_hi)).
    dual_clip_c: dual-clip PPO bound c (> 1) for negative advantages; 0 = off (ppo_clip and gppo).
    agg: token aggregation of the loss: token-mean | seq-mean-token-sum | seq-mean-token-mean |
      seq-mean-token-sum-norm.
    kl_coef: beta, weight of the KL to the reference (initial) policy; 0 = no reference policy.
    kl_kind: the KL estimator: k1 | k2 | k3.
    kl_in_reward: the KL goes into the reward instead of the loss.
    entropy_coef: weight of the entropy bonus (0 = off).
    clip_cov_ratio: clip_cov: the fraction of the valid tokens (at least one) drawn at random, among those of
      covariance in (clip_cov_lb, clip_cov_ub) not clipped by PPO, and taken out of the gradient (paper: 2e-4).
    clip_cov_lb: clip_cov: the covariance band's lower bound (paper: 1).
    clip_cov_ub: clip_cov: the covariance band's upper bound (paper: 5).
    kl_cov_ratio: kl_cov: the fraction of the valid tokens (at least one), those of largest covariance, that get
      the |logp - old_logp| penalty (paper: 2e-3 at 7B, i.e. the official k_percent 0.2).
    kl_cov_coef: kl_cov: the penalty's weight (paper: 1).
    teacher: KDRL (Xu et al. 2025): '' = none; a jaxpt language-model run's workdir (its latest checkpoint) or
      'hf:DIR', a frozen teacher that scores the rollouts on the mesh (`jaxpt.trainers.teacher`: any size, the
      policy's tokenizer); the policy loss gains kd_coef * agg(w k(logp, teacher_logp)), the reverse KL to the
      teacher on the policy's own samples (`jaxpt.losses.grpo.kd_term`).
    kd_coef: the KD term's weight (> 0 with a teacher; the paper: 5e-3 annealed to 1e-3 at 1.5B-7B scale).
    kd_kind: the KD term's estimator: k2 (the paper's: its on-policy gradient is the reverse KL's) | k3.
    kd_only: the RL term off (every advantage 0): plain on-policy distillation from the teacher.
    kd_skip_correct: KDRL's reward-guided masking: no KD term on the rollouts the verifier scores correct (w = 0),
      which keep the RL term only.
    epochs: passes of policy updates over each step's rollouts.
    minibatches: policy updates per pass, each on whole groups (must divide data.prompts_per_step).
  """

  group_size: int = 8
  advantage: str = "grpo"
  policy_loss: str = "ppo_clip"
  eps_lo: float = 0.2
  eps_hi: float = 0.2
  dual_clip_c: float = 3.0
  agg: str = "token-mean"
  kl_coef: float = 0.0
  kl_kind: str = "k3"
  kl_in_reward: bool = False
  entropy_coef: float = 0.0
  clip_cov_ratio: float = 2e-4
  clip_cov_lb: float = 1.0
  clip_cov_ub: float = 5.0
  kl_cov_ratio: float = 2e-3
  kl_cov_coef: float = 1.0
  teacher: str = ""
  kd_coef: float = 0.0
  kd_kind: str = "k2"
  kd_only: bool = False
  kd_skip_correct: bool = False
  epochs: int = 1
  minibatches: int = 1

  def check(self) -> None:
    for name in ("group_size", "epochs", "minibatches"):
      at_least(self, name, 1)
    for name in ("eps_lo", "eps_hi", "kl_coef", "entropy_coef", "dual_clip_c", "kl_cov_coef", "kd_coef"):
      in_range(self, name, 0.0)
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
      in_range(self, name, 0.0, 1.0)
    if not self.clip_cov_lb < self.clip_cov_ub:
      raise fail(self, "clip_cov_ub", f"must be > clip_cov_lb = {self.clip_cov_lb}")
    one_of(self, "advantage", ADVANTAGES)
    one_of(self, "agg", AGG_MODES)
    one_of(self, "kl_kind", KL_KINDS)
    try:
      get_loss("policy", self.policy_loss)
    except KeyError as e:
      raise fail(self, "policy_loss", e.args[0]) from None
    if 0 < self.dual_clip_c <= 1:
      raise fail(self, "dual_clip_c", "must be > 1 (or 0 = off)")
    one_of(self, "kd_kind", KD_KINDS)
    if self.teacher and self.kd_coef <= 0:
      raise fail(self, "kd_coef", f"must be > 0 with a teacher (grpo.teacher={self.teacher!r})")
    for name in ("kd_coef", "kd_only", "kd_skip_correct"):
      if getattr(self, name) and not self.teacher:
        raise fail(self, name, "needs a teacher (grpo.teacher: a jaxpt run's workdir or 'hf:DIR')")

  def loss_kwargs(self) -> dict:
    kwargs = dict(eps_lo=self.eps_lo, eps_hi=self.eps_hi, dual_clip_c=self.dual_clip_c or None, agg=self.agg,
                  kl_kind=self.kl_kind, kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
                  entropy_coef=self.entropy_coef, clip_cov_ratio=self.clip_cov_ratio, clip_cov_lb=self.clip_cov_lb,
                  clip_cov_ub=self.clip_cov_ub, kl_cov_ratio=self.kl_cov_ratio, kl_cov_coef=self.kl_cov_coef,
                  kd_coef=self.kd_coef, kd_kind=self.kd_kind)
    declared = inspect.signature(get_loss("policy", self.policy_loss)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in declared.values()):
      return kwargs
    return {k: v for k, v in kwargs.items() if k in declared}

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPORunConfig(RunConfig):
  """A GRPO run: `RunConfig` plus these sections. `optim` steps once per minibatch update (steps x epochs x
  minibatches in all); grad_accum_steps splits each minibatch.

  Attributes:
    task: the math task whose problems are the prompts and whose answers the verifier checks.
    data: prompts per step, their padded length, eval problems.
    sampling: how rollouts are sampled.
    grpo: group size, advantage, policy loss and the update schedule.
    clipo: the CLIPO contrastive head and reward (off by default).
    dapo: DAPO's dynamic sampling, overlong filtering and soft overlong punishment (off by default).
    reward: the reward's sources (verifier, a reward model) and their weights, clipping, normalisation and the
      EOS-missing penalty (default: the verifier's score as it is).
    engine: the rollout engine (training rollouts through continuous batching over a paged KV cache,
      `jaxpt.rl.engine`; by default on CPU, and the static sampler on GPU and TPU: `EngineConfig.enabled`) and its
      slots and page pool.
  """

  task: TaskConfig = TaskConfig()
  data: PromptDataConfig = PromptDataConfig()
  sampling: SamplingConfig = SamplingConfig(max_new_tokens=40)
  grpo: GRPOConfig = GRPOConfig()
  clipo: clipo.CLIPOConfig = clipo.CLIPOConfig()
  dapo: dapo.DAPOConfig = dapo.DAPOConfig()
  reward: RewardConfig = RewardConfig()
  engine: EngineConfig = EngineConfig()

  def recorded_before(self, recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A LoRA GRPO run recorded before `lora.rollouts` sampled from the merged params: its record reads as
    'merged', or as this launch's own value when that samples the merged params too (auto without a quantized
    base), so that a launch switching it to the unmerged codes is refused unless allow_changes names
    lora.rollouts."""
    lora = recorded.get("lora")
    if not isinstance(lora, Mapping) or "rollouts" in lora:
      return super().recorded_before(recorded)
    return {"lora.rollouts": "merged" if self.lora.samples_unmerged else self.lora.rollouts}

  def check(self) -> None:
    super().check()
    check_config(self)  # prompt + response length, DAPO's overlong settings
    if self.dapo.dynamic_sampling and self.dapo.filter_metric == "score" and self.reward.uses_model:
      raise ConfigError("dapo.filter_metric", f"'score' filters groups on the verifier's score, but the run trains on "
                        f"reward.model's ({self.reward.model}): use 'reward' (and dapo.filter_min_std for its "
                        "continuous scores)", "score")
    if self.data.prompts_per_step % self.grpo.minibatches:
      raise ConfigError("grpo.minibatches", f"must divide config.data.prompts_per_step={self.data.prompts_per_step}",
                        self.grpo.minibatches)
    self.check_batch_split(self.minibatch_rows, "the rollouts per minibatch (config.data.prompts_per_step x "
                           "config.grpo.group_size / config.grpo.minibatches)")
    micro_rows = self.minibatch_rows // self.optim.grad_accum_steps
    if self.clipo.enabled and self.clipo.in_loss_coef > 0 and micro_rows % self.grpo.group_size:
      raise ConfigError("optim.grad_accum_steps", f"leaves {micro_rows} rollouts per micro-batch, not whole groups "
                        f"of config.grpo.group_size={self.grpo.group_size} (the in-loss CLIPO term needs them)",
                        self.optim.grad_accum_steps)

  @property
  def group_size(self) -> int:
    """Rollouts per prompt (the collector's G): grpo.group_size."""
    return self.grpo.group_size

  @property
  def minibatch_rows(self) -> int:
    """Rollouts per policy update: prompts_per_step x group_size / minibatches."""
    return self.data.prompts_per_step * self.grpo.group_size // self.grpo.minibatches

  @property
  def updates_per_step(self) -> int:
    return self.grpo.epochs * self.grpo.minibatches
