"""GRPO (and CLIPO) post-training on the shared loop.

One loop step (`GRPOHooks.train_step`), for a batch of B prompts:

    prompts [B, P] --repeat G--> [N = B*G, P] --sampler (KV cache)--> responses [N, T], old log-probs, hidden
      --decode + verifier--> rewards R [N]   (+ DAPO: R += soft overlong punishment; dynamic sampling drops
                                              all-equal groups and samples more prompts, `jaxpt.rl.dapo`)
      (+ CLIPO: R += r_con from the contrastive head, which then steps)
      (+ KL in the reward: R -= beta * sum_t kl_t)
      --group advantages--> A [N]
      --`epochs` passes x `minibatches` (whole groups) of policy updates:
        loss = policy_loss(logp, old_logp, A, mask; clip, KL-to-reference term, entropy bonus)
               (+ in_loss_coef * CLIPO contrastive loss on the policy's own hidden states)
               (DAPO overlong filtering: truncated responses masked out of the loss)

Each policy update is the shared train step (`jaxpt.engine.step`), compiled by the shared builder for one minibatch
of `experience_shapes`; `optim.grad_accum_steps` splits a minibatch into micro-batches. Everything runs on the
run's mesh (`config.mesh`): the sampler and the log-probs are compiled for it too, each process samples and
verifies its own prompts, and the per-rollout host arrays are all-gathered (`GRPOHooks`). `state.step` counts loop
steps (the data position); the optimizer's own count runs epochs * minibatches per step.
The reference policy is the initial policy (the `init_from` run's params, or the seeded init), rebuilt on resume
rather than checkpointed; the CLIPO head lives in `state.aux["clipo"]`. Randomness of step t comes from
fold_in(state.rng, t), so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt import parallel
from jaxpt.config import ConfigError, Section, at_least, fail, from_section, in_range, one_of
from jaxpt.data import order
from jaxpt.data.sft import PromptData, TaskConfig, task_tokenizer
from jaxpt.losses import get_loss
from jaxpt.losses.grpo import (ADVANTAGES, AGG_MODES, KL_KINDS, entropy_from_logits, group_advantages,
                               kl_penalized_rewards)
from jaxpt.models.transformer import TransformerLM
from jaxpt.progress import say
from jaxpt.rl import clipo, dapo
from jaxpt.rl.logprobs import response_logits, response_logprobs, token_logprobs
from jaxpt.rl.rewards import math_reward
from jaxpt.rl.rollouts import RewardFn, repeat_prompts, response_texts, verifier_rewards
from jaxpt.rl.sampler import SamplingConfig, make_sampler
from jaxpt.engine.builder import Training, build_training, training_mesh
from jaxpt.engine.config import RunConfig, check_vocab
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.engine.record import check_launch, digest, resumes, run_inputs
from jaxpt.engine.run import BuiltRun, Hooks
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import grad_fn_of


@dataclasses.dataclass(frozen=True)
class GRPOConfig(Section):
  """The `grpo` section: rollouts per prompt, advantage estimator, policy loss and its options, update schedule.

  Attributes:
    group_size: G, rollouts sampled per prompt (one group).
    advantage: a registered advantage estimator: grpo | drgrpo | rloo | reinforce_pp_baseline | bnpo.
    policy_loss: a registered `policy` loss: ppo_clip | gspo | cispo | gppo | topr. The fields below reach a loss
      as the keyword arguments it declares: topr takes neither eps nor dual_clip_c (its [0, 1] taper is fixed).
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
  epochs: int = 1
  minibatches: int = 1

  def check(self) -> None:
    for name in ("group_size", "epochs", "minibatches"):
      at_least(self, name, 1)
    for name in ("eps_lo", "eps_hi", "kl_coef", "entropy_coef", "dual_clip_c"):
      in_range(self, name, 0.0)
    one_of(self, "advantage", ADVANTAGES)
    one_of(self, "agg", AGG_MODES)
    one_of(self, "kl_kind", KL_KINDS)
    try:
      get_loss("policy", self.policy_loss)
    except KeyError as e:
      raise fail(self, "policy_loss", e.args[0]) from None
    if 0 < self.dual_clip_c <= 1:
      raise fail(self, "dual_clip_c", "must be > 1 (or 0 = off)")

  def loss_kwargs(self) -> dict:
    kwargs = dict(eps_lo=self.eps_lo, eps_hi=self.eps_hi, dual_clip_c=self.dual_clip_c or None, agg=self.agg,
                  kl_kind=self.kl_kind, kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
                  entropy_coef=self.entropy_coef)
    declared = inspect.signature(get_loss("policy", self.policy_loss)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in declared.values()):
      return kwargs
    return {k: v for k, v in kwargs.items() if k in declared}

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0


@dataclasses.dataclass(frozen=True)
class PromptDataConfig(Section):
  """The `data` section of GRPO runs.

  Attributes:
    prompts_per_step: B, prompts per training step (each sampled group_size times).
    max_prompt_len: P, tokens prompts are left-padded to.
    eval_prompts: held-out problems per eval set, each decoded greedily (0 = no eval).
    eval_samples: k: each of those problems is also sampled k times with the training sampler's settings
      (sampling.temperature, default 1), giving the sampled pass@1 `eval_pass1_<set>` = the mean correctness over
      problems and samples (0 = greedy only). The eval keys are fixed, so every checkpoint and every run is
      scored on the same random draws.
  """

  prompts_per_step: int = 8
  max_prompt_len: int = 64
  eval_prompts: int = 128
  eval_samples: int = 0

  def check(self) -> None:
    at_least(self, "prompts_per_step", 1)
    at_least(self, "max_prompt_len", 1)
    at_least(self, "eval_prompts", 0)
    at_least(self, "eval_samples", 0)


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
  """

  task: TaskConfig = TaskConfig()
  data: PromptDataConfig = PromptDataConfig()
  sampling: SamplingConfig = SamplingConfig(max_new_tokens=40)
  grpo: GRPOConfig = GRPOConfig()
  clipo: clipo.CLIPOConfig = clipo.CLIPOConfig()
  dapo: dapo.DAPOConfig = dapo.DAPOConfig()

  def check(self) -> None:
    super().check()
    prompt_len, new_tokens = self.data.max_prompt_len, self.sampling.max_new_tokens
    if prompt_len + new_tokens > self.model.max_seq_len:
      raise ConfigError("sampling.max_new_tokens", f"prompt ({prompt_len}) + response longer than "
                        f"config.model.max_seq_len={self.model.max_seq_len}", new_tokens)
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
    if self.dapo.overlong_buffer > new_tokens:
      raise ConfigError("dapo.overlong_buffer", f"must be <= config.sampling.max_new_tokens={new_tokens}",
                        self.dapo.overlong_buffer)
    if self.dapo.overlong_filtering and self.clipo.enabled and self.clipo.in_loss_coef > 0:
      raise ConfigError("dapo.overlong_filtering", "cannot be combined with config.clipo.in_loss_coef > 0 (the "
                        "in-loss CLIPO term reads the loss mask it empties)", True)

  @property
  def minibatch_rows(self) -> int:
    """Rollouts per policy update: prompts_per_step x group_size / minibatches."""
    return self.data.prompts_per_step * self.grpo.group_size // self.grpo.minibatches

  @property
  def updates_per_step(self) -> int:
    return self.grpo.epochs * self.grpo.minibatches


def _split_groups(num_rows: int, group_size: int, minibatches: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Row indices of `minibatches` minibatches of whole groups, groups shuffled by `rng`."""
  groups = rng.permutation(num_rows // group_size)
  return [np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in part])
          for part in np.array_split(groups, minibatches)]


_FILTER_KEYS = {"score": "scores", "reward": "rewards"}  # dapo.filter_metric -> the rollouts' key
EXPERIENCE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp", "advantages", "labels",
                   "group_ids")  # + "ref_logp" with a KL term: the minibatch of one policy update


def experience_shapes(config: GRPORunConfig) -> dict[str, jax.ShapeDtypeStruct]:
  """Global shapes of one policy-update minibatch (n = config.minibatch_rows rollouts; P prompt, T response)."""
  n, p, t = config.minibatch_rows, config.data.max_prompt_len, config.sampling.max_new_tokens
  i32, f32 = jnp.int32, jnp.float32
  shapes = {"prompt_tokens": ((n, p), i32), "prompt_mask": ((n, p), i32), "tokens": ((n, t), i32),
            "mask": ((n, t), f32), "old_logp": ((n, t), f32), "advantages": ((n,), f32), "labels": ((n,), i32),
            "group_ids": ((n,), i32)}
  if config.grpo.uses_reference:
    shapes["ref_logp"] = ((n, t), f32)
  return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


def make_policy_loss(model: TransformerLM, settings: GRPOConfig, clipo_config: clipo.CLIPOConfig,
                     temperature: float) -> Callable[[Any, dict, jax.Array, Any], tuple[jax.Array, dict]]:
  """loss_fn(params, minibatch, rng, aux) -> (loss, metrics) of one policy update.

  minibatch: prompt_tokens/prompt_mask [n, P], tokens/mask/old_logp (and ref_logp) [n, T], advantages [n],
  labels/group_ids [n] (for the in-loss CLIPO term, through the fixed head aux["clipo"]).
  """
  policy_loss = get_loss("policy", settings.policy_loss)
  kwargs = settings.loss_kwargs()
  in_loss = clipo_config.enabled and clipo_config.in_loss_coef > 0

  def loss_fn(params: Any, mb: dict, rng: jax.Array, aux: Any) -> tuple[jax.Array, dict]:
    logits, hidden = response_logits(model, params, mb["prompt_tokens"], mb["prompt_mask"], mb["tokens"],
                                     mb["mask"], temperature)
    logp = token_logprobs(logits, mb["tokens"], mb["mask"])
    entropy = entropy_from_logits(logits) if settings.entropy_coef > 0 else None
    loss, metrics = policy_loss(logp, mb["old_logp"], mb["advantages"], mb["mask"], ref_logp=mb.get("ref_logp"),
                                entropy=entropy, **kwargs)
    if in_loss:
      term, _ = clipo.in_loss_term(clipo_config, aux["clipo"].params, hidden, mb["mask"], mb["labels"],
                                   mb["group_ids"], rng)
      loss = loss + clipo_config.in_loss_coef * term
      metrics = dict(metrics, clipo_in_loss=term, loss=loss)
    return loss, dict(metrics, num_tokens=jnp.sum(mb["mask"]),
                      num_rows=jnp.asarray(mb["mask"].shape[0], jnp.float32))

  return loss_fn


@dataclasses.dataclass
class GRPOHooks(Hooks):
  """The GRPO run's loop hooks, built once by `build`: `train_step` samples, scores and updates (one loop step).

  `training.train_step` is the shared step compiled for one policy-update minibatch; the loop's state is handed to
  it with `step` set to the optimizer's update count (so `lr` is the schedule's) and `rng` to the step's update key.

  On a mesh (`training.layout`): the sampler, the teacher-forced log-probs and the update are compiled for it, and
  rollouts live as global device arrays whose rows are split over data x fsdp. Each process reads only its own
  prompts (`batches`) and decodes and verifies only the rows its devices sampled; the per-rollout numbers the step
  needs whole (scores, rewards, lengths: [N] each) are then all-gathered, so the group statistics, DAPO's choices
  and the minibatch order are computed identically on every process.
  """

  config: GRPORunConfig
  training: Training
  tokenizer: Any  # jaxpt's sentencepiece Tokenizer, or an HFTokenizer (init_from='hf:DIR')
  prompts: PromptData
  sample: Callable  # (params, prompt_tokens, prompt_mask, rng) -> SampleOutput, temperature sampling, [N, P]
  sample_greedy: Callable  # the same, greedy, for eval batches of `eval_batch_size` prompts
  sample_eval: Callable  # the same as `sample`, for eval batches (sampled pass@1, data.eval_samples)
  logprobs: Callable  # response_logprobs(params, prompt_tokens, prompt_mask, tokens, mask), compiled on the mesh
  take_rows: Callable  # (pytree of global [M, ...] arrays, rows int [n]) -> the rows, split like a batch
  clipo_step: Callable  # (head state, hidden, mask, labels, group_ids, rng) -> (head state, r_con [N], metrics)
  kl_rewards: Callable  # (rewards [N], old_logp, ref_logp, mask [N, T]) -> kl_penalized_rewards [N]
  eval_sets: dict  # name -> the prompt batches holding its first `data.eval_prompts` problems (encoded once)
  process_slice: tuple[int, int] = (0, 1)  # this process reads prompt block `index` of `count` of each batch
  reward_fn: RewardFn = math_reward  # the verifier: (response text, answer) -> score (replace for another task)
  sampler_memory: dict = dataclasses.field(default_factory=dict)  # compiled per-device memory of `sample` (MiB)
  ref_params: Any = None  # the initial policy, set by `init_state` when the KL term needs it

  @property
  def rollout_rows(self) -> int:
    """N = prompts_per_step x group_size: rollouts sampled per generation round."""
    return self.config.data.prompts_per_step * self.config.grpo.group_size

  @property
  def eval_batch_size(self) -> int:
    """Prompts per eval batch: prompts_per_step rounded up to a multiple of the data-parallel devices."""
    dp = parallel.data_parallel_size(self.training.layout.mesh)
    return -(-self.config.data.prompts_per_step // dp) * dp

  def describe(self) -> str:
    """The start line's addition: the compiled rollout sampler's memory."""
    return f", rollout sampler {self.sampler_memory.get('peak_mib', float('nan')):.1f} MiB"

  def init_state(self, training: Training) -> TrainState:
    """The initial state (params from `init_from`, or the seeded init); keeps a copy of its params as the
    reference policy when the KL term needs one (rebuilt like this on resume, never checkpointed)."""
    state = training.init_state()
    if self.config.grpo.uses_reference:
      self.ref_params = jax.tree.map(jnp.copy, state.params)
    return state

  def batches(self, start: int) -> Iterator[dict]:
    """This process's prompts of steps start, start + 1, ... (host arrays, block `process_slice` of each)."""
    index, count = self.process_slice
    return order.step_batches(self.prompts.batch, self.prompts.batch_size, start, index, count)

  def verify(self, out: Any, answers: list[str], group_size: int) -> dict[str, np.ndarray]:
    """Decodes and verifies this process's rows of a sampler output (global [M, T]; `answers` are its prompts'
    answers, G rows each) -> every process's {scores float32, lengths int32, truncated bool} [M], whole. Every
    process must get here: one whose decode or reward_fn raises leaves the others waiting in the all-gather."""
    tokens, mask = parallel.process_rows(out.tokens), parallel.process_rows(out.mask)
    lengths = parallel.process_rows(out.lengths)
    texts = response_texts(self.tokenizer.decode, tokens, mask, self.tokenizer.eos_id, self.tokenizer.vocab_size)
    local = {"scores": verifier_rewards(texts, answers, group_size, self.reward_fn), "lengths": lengths,
             "truncated": dapo.truncated(lengths, tokens[:, -1], self.config.sampling.max_new_tokens,
                                         self.tokenizer.eos_id)}
    return parallel.all_rows(local, self.training.layout.batch, out.tokens.shape[0])

  def rollouts(self, params: Any, batch: dict, rng: jax.Array) -> dict:
    """Samples G responses per prompt of the global batch whose process block is `batch` and scores them.

    Device arrays (global, rows split like a batch): prompt_tokens, prompt_mask [N, P], tokens, mask, old_logp
    [N, T] (the sampler's log-probs), hidden [N, T, d] (None without CLIPO). Host arrays, whole on every process:
    scores, rewards (+ the overlong punishment), labels, truncated, lengths, group_ids [N].
    """
    g, n = self.config.grpo.group_size, self.rollout_rows
    tokens, mask, _ = repeat_prompts(batch["prompt_tokens"], batch["prompt_mask"], g)
    prompts = parallel.global_batch({"prompt_tokens": tokens, "prompt_mask": mask}, self.training.layout.batch, n)
    out = self.sample(params, prompts["prompt_tokens"], prompts["prompt_mask"], rng)
    host = self.verify(out, batch["answers"], g)
    settings = self.config.dapo
    rewards = host["scores"] + dapo.overlong_penalty(host["lengths"], self.config.sampling.max_new_tokens,
                                                     settings.overlong_buffer, settings.overlong_penalty_factor)
    return {**prompts, "tokens": out.tokens, "mask": out.mask, "old_logp": out.logprobs, "hidden": out.hidden,
            **host, "rewards": rewards, "labels": (host["scores"] > 0).astype(np.int32),
            "group_ids": np.repeat(np.arange(self.config.data.prompts_per_step, dtype=np.int32), g)}

  def step_rollouts(self, params: Any, batch: dict, step: int, rng: jax.Array) -> tuple[dict, dict]:
    """The rollouts trained on at `step` (`rollouts` of `batch`, key `rng`), and their DAPO metrics; with
    `dapo.dynamic_sampling`, round r >= 1 samples `prompts.refill_batch(step * (max_rounds - 1) + r - 1)` with
    key fold_in(rng, r) until the batch holds data.prompts_per_step informative groups (`jaxpt.rl.dapo`).
    With bf16 rollouts (`sampling.rollout_dtype`) the trained rows' old_logp are then recomputed by the fp32 policy
    (teacher forcing), once, after any refills; CLIPO's hidden states stay the sampler's.
    Metrics: truncated_frac, overlong_penalty_mean (the trained batch); with dynamic sampling dapo_rounds,
    dapo_groups_drawn / _informative / _filled and dapo_step_accuracy (the step's own prompts: comparable across
    runs, where the loop's `accuracy` is the trained batch's, which dynamic sampling biases)."""
    settings = self.config.dapo
    first = self.rollouts(params, batch, rng)
    ro, metrics = first, {}
    if settings.dynamic_sampling:
      def draw(r: int) -> dict:
        if r == 0:
          return first
        extra = self.prompts.refill_batch(step * (settings.max_rounds - 1) + r - 1, *self.process_slice)
        return self.rollouts(params, extra, jax.random.fold_in(rng, r))

      ro, metrics = dapo.dynamic_sampling(draw, self.config.data.prompts_per_step, self.config.grpo.group_size,
                                          settings.max_rounds, settings.at_cap, _FILTER_KEYS[settings.filter_metric],
                                          take=self.take_rows)
      metrics["dapo_step_accuracy"] = float(first["scores"].mean())
    if self.config.sampling.rollout_dtype != "float32":  # the bf16 sampler's log-probs -> the fp32 policy's
      ro["old_logp"] = self.logprobs(params, *(ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")))
    metrics["truncated_frac"] = float(ro["truncated"].mean())
    if settings.overlong_buffer:
      metrics["overlong_penalty_mean"] = float(np.mean(ro["rewards"] - ro["scores"]))
    return ro, metrics

  def train_step(self, training: Training, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    settings, cfg = self.config.grpo, self.config.clipo
    step = int(state.step)
    sample_rng, clipo_rng, update_rng = jax.random.split(state.step_rng(), 3)
    ro, dapo_metrics = self.step_rollouts(state.params, batch, step, sample_rng)
    metrics: dict[str, Any] = {"accuracy": float(ro["scores"].mean()), "response_length": float(ro["lengths"].mean()),
                               "num_tokens": float(ro["lengths"].sum()), **dapo_metrics}
    rewards = ro["rewards"]
    aux = state.aux
    if cfg.enabled:
      head, contrastive, head_metrics = self.clipo_step(aux["clipo"], ro["hidden"], ro["mask"], ro["labels"],
                                                        ro["group_ids"], clipo_rng)
      aux = dict(aux, clipo=head)
      rewards = rewards + np.asarray(contrastive)
      metrics.update({f"clipo_{k}": float(v) for k, v in head_metrics.items() if jnp.ndim(v) == 0})
    experience = {k: ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp")}  # on the mesh
    if settings.uses_reference:
      experience["ref_logp"] = self.logprobs(self.ref_params, *(
          experience[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")))
      if settings.kl_in_reward:
        rewards = np.asarray(self.kl_rewards(rewards, experience["old_logp"], experience["ref_logp"],
                                             experience["mask"]))
    host = {"group_ids": ro["group_ids"], "labels": ro["labels"],
            "advantages": np.asarray(group_advantages(rewards, settings.group_size, settings.advantage))}
    if self.config.dapo.overlong_filtering:
      experience["mask"] = dapo.filter_overlong(experience["mask"], ro["truncated"])
    metrics["reward_mean"] = float(np.mean(rewards))

    new_state = state.replace(aux=aux)
    if step >= cfg.frozen_steps:  # the official critic_warmup rule (jaxpt.rl.clipo)
      new_state, update_metrics = self._policy_updates(new_state, experience, host, update_rng,
                                                       np.random.default_rng([self.config.seed, step]),
                                                       (step - cfg.frozen_steps) * self.config.updates_per_step)
      metrics.update(update_metrics)
    return new_state.replace(step=state.step + 1, rng=state.rng), metrics

  def _policy_updates(self, state: TrainState, experience: dict, host: dict, rng: jax.Array,
                      shuffle: np.random.Generator, first_update: int) -> tuple[TrainState, dict]:
    """`epochs` passes over `minibatches` minibatches of whole groups, each one shared-step update; the state
    enters with `step = first_update` (the optimizer's count) and update key `rng`. `experience`: the rollouts'
    global device arrays, `host`: their per-rollout host arrays [N]. Metrics: means over updates."""
    settings = self.config.grpo
    shapes = experience_shapes(self.config)
    state = state.replace(step=jnp.asarray(first_update, jnp.int32), rng=rng)
    update_metrics = []
    for _ in range(settings.epochs):
      for rows in _split_groups(self.rollout_rows, settings.group_size, settings.minibatches, shuffle):
        minibatch = dict(self.take_rows(experience, rows),
                         **self.training.put({k: np.asarray(v[rows], shapes[k].dtype) for k, v in host.items()}))
        state, m = self.training.train_step(state, minibatch)
        update_metrics.append(m)
    means = jax.tree.map(lambda *xs: float(np.mean(xs)), *jax.device_get(update_metrics))
    return state, {k: v for k, v in means.items() if k not in ("num_tokens", "num_rows")}

  def evaluate(self, state: TrainState) -> dict:
    """Greedy accuracy on the first `data.eval_prompts` problems of each held-out set (`eval_accuracy_<name>`),
    and with data.eval_samples = k the sampled pass@1 (`eval_pass1_<name>`, sample j of batch b drawn with the
    fixed key fold_in(fold_in(PRNGKey(1), b), j)). Every process holds each eval batch whole (padded to
    `eval_batch_size` with copies of its last prompt) and verifies the rows its devices decoded."""
    size, samples = self.eval_batch_size, self.config.data.eval_samples
    index, count = parallel.process_batch_slice(self.training.layout.batch, size)
    mine = slice(index * size // count, (index + 1) * size // count)
    results = {}
    for name, batches in self.eval_sets.items():
      greedy, sampled = [], [[] for _ in range(samples)]
      for b, batch in enumerate(batches):
        real = len(batch["answers"])
        pad = lambda x: np.concatenate([x, np.repeat(x[-1:], size - real, axis=0)])
        prompts = self.training.put({k: pad(np.asarray(batch[k])) for k in ("prompt_tokens", "prompt_mask")})
        answers = (list(batch["answers"]) + [batch["answers"][-1]] * (size - real))[mine]
        out = self.sample_greedy(state.params, prompts["prompt_tokens"], prompts["prompt_mask"],
                                 jax.random.PRNGKey(0))
        greedy.extend(self.verify(out, answers, 1)["scores"][:real])
        for j in range(samples):
          key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(1), b), j)
          out = self.sample_eval(state.params, prompts["prompt_tokens"], prompts["prompt_mask"], key)
          sampled[j].extend(self.verify(out, answers, 1)["scores"][:real])
      first = self.config.data.eval_prompts
      results[f"eval_accuracy_{name}"] = float(np.mean(greedy[:first]))
      if samples:
        results[f"eval_pass1_{name}"] = float(np.mean([scores[:first] for scores in sampled]))
    return results


def _first_problems(prompts: PromptData, count: int) -> dict[str, list[dict]]:
  """Each held-out set's prompt batches, cut to the batches that hold its first `count` problems."""
  size = prompts.batch_size
  return {name: batches[:-(-count // size)] for name, batches in prompts.eval_sets().items()} if count else {}


def _tokenizer(config: GRPORunConfig, workdir: str):
  """The `init_from` run's tokenizer as it is (never retrained: the policy's embedding rows are its ids; copied
  into `workdir/tokenizer`), else the task's tokenizer trained in (or loaded from) `workdir`."""
  tokenizer = init_tokenizer(config.init_from, workdir, resumes(workdir), config.model)
  if tokenizer is None:
    tokenizer = task_tokenizer(config.task, config.model.vocab_size, workdir, config.task.data_dir(workdir),
                               keep_existing=resumes(workdir))
  return tokenizer


def build(config: GRPORunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds the tokenizer, prompts, samplers and the shared
  builder's policy update, compiled for one minibatch of rollouts."""
  config = from_section(GRPORunConfig, config, "config")
  mesh = training_mesh(config, config.minibatch_rows, "config.data.prompts_per_step x config.grpo.group_size / "
                       "config.grpo.minibatches")
  check_launch(workdir, config, {"corpus": digest(f"task|{config.task.train_identity}")})
  say(f"preparing the task's prompts and tokenizer in {workdir} ...")
  tokenizer = _tokenizer(config, workdir)
  check_vocab(config.model, tokenizer.vocab_size)
  prompts = PromptData.create(config.task, tokenizer, batch_size=config.data.prompts_per_step,
                              prompt_len=config.data.max_prompt_len, seed=config.seed,
                              data_dir=config.task.data_dir(workdir))
  model = TransformerLM(config.model)
  temperature = config.sampling.temperature
  loss_fn = make_policy_loss(model, config.grpo, config.clipo, temperature)
  weight_key = "num_tokens" if config.grpo.agg == "token-mean" else "num_rows"
  def init_aux(rng: jax.Array) -> dict | None:  # always given: the policy's init key is the same with or without CLIPO
    return {"clipo": clipo.init_head_state(config.clipo, config.model.d_model, rng)} if config.clipo.enabled else None

  say("compiling the policy update ...")
  training = build_training(config, mesh, model, (jnp.zeros((1, config.data.max_prompt_len), jnp.int32),),
                            experience_shapes(config), grad_fn=grad_fn_of(loss_fn, reads_aux=True),
                            weight_key=weight_key, total_steps=max(1, config.steps * config.updates_per_step),
                            init_aux=init_aux)

  layout = training.layout
  replicated = layout.replicated

  def sampler(greedy: bool) -> Callable:
    sampling = dataclasses.replace(config.sampling, greedy=greedy, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                                   return_hidden=config.clipo.enabled)
    return make_sampler(config.model, sampling, config.data.max_prompt_len, layout)

  rows, prompt_shape = config.data.prompts_per_step * config.grpo.group_size, (config.data.max_prompt_len,)
  index, count = parallel.process_batch_slice(layout.batch, rows)
  if config.data.prompts_per_step % count:
    raise ConfigError("data.prompts_per_step", f"must be divisible by the {count} processes that read distinct "
                      "prompts", config.data.prompts_per_step)
  say("compiling the rollout sampler ...")
  params = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                        jax.eval_shape(training.sharded.init_state).params, layout.params)
  prompts_abstract = jax.ShapeDtypeStruct((rows,) + prompt_shape, jnp.int32, sharding=layout.batch)
  sample = sampler(False).lower(params, prompts_abstract, prompts_abstract,
                                jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)).compile()
  logprobs = layout.jit(lambda params, *arrays: response_logprobs(model, params, *arrays, temperature=temperature),
                        layout.batch, in_shardings=(layout.params,) + (layout.batch,) * 4)
  take_rows = layout.jit(lambda tree, rows: jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree), layout.batch)

  def clipo_step(head, hidden, mask, labels, group_ids, rng):
    reps = clipo.rollout_representation(hidden, mask)
    return clipo.head_step(config.clipo, head, reps, labels, group_ids, rng)

  kl_rewards = lambda *arrays: kl_penalized_rewards(*arrays, config.grpo.kl_coef, config.grpo.kl_kind)
  hooks = GRPOHooks(config=config, training=training, tokenizer=tokenizer, prompts=prompts, sample=sample,
                    sample_greedy=sampler(True), sample_eval=sampler(False), logprobs=logprobs, take_rows=take_rows,
                    clipo_step=layout.jit(clipo_step, replicated), kl_rewards=layout.jit(kl_rewards, replicated),
                    eval_sets=_first_problems(prompts, config.data.eval_prompts), process_slice=(index, count),
                    sampler_memory=parallel.compiled_memory(sample))
  inputs = run_inputs(f"task|{config.task.train_identity}", tokenizer)
  return BuiltRun("grpo", config, training, hooks.batches, inputs=inputs, tokenizer=tokenizer, data=prompts,
                  evaluate=hooks.evaluate if config.data.eval_prompts else None, hooks=hooks)


def replace_hooks(built: BuiltRun, **changes: Any) -> BuiltRun:
  """`built` with fields of its `GRPOHooks` replaced, its compiled update kept: `reward_fn=` a verifier for another
  task than math, `sample=` another sampler (with `config=` the config that describes it), ..."""
  hooks = dataclasses.replace(built.hooks, **changes)
  return dataclasses.replace(built, config=hooks.config, batches=hooks.batches, hooks=hooks,
                             evaluate=hooks.evaluate if built.evaluate is not None else None)
