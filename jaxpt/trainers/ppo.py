"""PPO with a learned critic (InstructGPT-style RLHF) on the shared loop: the policy and critic, their losses and the
minibatch updates. The run config is `jaxpt.trainers.ppo_config`.

One loop step (`PPOHooks.train_step`), for a batch of B prompts:

    prompts [B, P] --`RolloutCollector.step_rollouts` (jaxpt.rl.collect, reused as GRPO's: G = ppo.group_size)-->
      rollouts [N = B*G]: tokens, mask, old_logp [N, T]; scores [N]: the `reward` section's assembled reward
      (verifier and/or reward model, `jaxpt.trainers.grpo.assembled_rewards`)
      --critic--> old_values V [N, T]  (V_t read at the column whose logits predict response token t)
      --`jaxpt.losses.value`--> r_t = [t = last] score - ppo.kl_coef kl_t   (kl to the reference = initial policy)
                                A, R = GAE(r, V; gamma, lam); A whitened over the step's tokens
      --`epochs` x `minibatches` updates of policy and critic together (one shared train step):
        loss = ppo_clip(logp, old_logp, A [N, T], mask) + clipped_value(V_new, V, R, mask)
        (its gradient `sequenced_grad_fn`'s: the critic's backward ends before the policy's forward starts)
        (the first `ppo.value_warmup_steps` loop steps: the critic's term only, the policy frozen)

Policy and critic are one params tree {"policy": TransformerLM params, "critic": RewardModel params (backbone +
a [d, 1] head, read per token: the value head)}, sharded on the run's mesh by their logical axes, and each has its
own optimizer (`jaxpt.engine.optim.partitioned`: `optim` for the policy, `optim` at `ppo.critic_learning_rate` for
the critic, each clipping its own gradient, each with its own update count and schedule). Their params are
disjoint, so the summed loss's gradient is each loss's gradient for its own params (no `vf_coef`: with separate
Adam optimizers a coefficient would only rescale the critic's gradient); the step computes them one model after
the other, so that only one model's activations are live at a time (`sequenced_grad_fn`). The value warm-up is a
second compiled step on the same state whose optimizer freezes the policy part (no move, no state change).
Checkpoints hold both params and both optimizer states (the TrainState), and the running reward statistics
(`aux`); the reference policy is the initial policy, rebuilt on resume; randomness of step t comes from
fold_in(state.rng, t), so a resumed run is bitwise the uninterrupted one.

LoRA (`config.lora.rank > 0`, as GRPO takes it; the DIR paper's RLHF recipe: PPO with rank 8, alpha 32): the policy
trains adapters on its frozen base, and the critic is a LoRA reward model as `jaxpt rm` trains one with LoRA:
adapters on its backbone beside the frozen base, its [d, 1] value head trained whole (a head new to the run, read
per token: it has no base to adapt). Only those train and have optimizer state (`CRITIC_HEAD`,
`jaxpt.engine.builder.lora_trainable`; the policy's and critic's optimizers each see their trainable part). The
critic's frozen base is a copy of the policy's base (its own fresh adapters: the policy's `lora.init_adapter` ones
are not the critic's), or the `ppo.critic_init` RM's backbone (merged, if that RM trained with LoRA) cast to
`lora.base_dtype` and, with QLoRA, quantized: a copy, as the full-parameter critic is, since the donated state
cannot hold one buffer twice. The reference policy is the initial policy: the policy's base with the adapters off
(no copy), with `lora.init_adapter` beside its adapters (`jaxpt.trainers.grpo.lora_reference`), the rollouts
read the merged or unmerged params as `lora.rollouts` says (`jaxpt.trainers.grpo.rollout_params`), the frozen base's
weight gradients are never computed (the step reads only the trainable part of both gradients: `sequenced_grad_fn`),
and checkpoints hold the whole params with the trainable part's optimizer states, as GRPO's LoRA runs do.

Why the critic starts from a reward model (`ppo.critic_init`): the RM's backbone already reads the prompt and
response as the reward does, so its score head, applied per token, starts the value head near the return of the
final token (InstructGPT; ms-swift's and OpenRLHF's default); without one, the critic starts from the policy's own
start with a fresh head. An RM of another tokenizer (or prompt format) may reward (`reward.model`, scored on the
re-tokenized text) but cannot start the critic: GAE needs V_t at each of the policy's response tokens t, and a
critic reading other tokens has no value at those positions (a mapping of its token boundaries onto the policy's
would be a guess); such a `ppo.critic_init` is refused in one line naming it (leave it empty, and the critic
starts from the policy, with that RM kept as `reward.model`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpt.config import ConfigError, from_section
from jaxpt.losses import get_loss
from jaxpt.losses.grpo import aggregate_weight, masked_mean, reward_kl
from jaxpt.losses.value import gae, kl_shaped_rewards, whiten
from jaxpt.models.config import ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.progress import say
from jaxpt.rl import dapo
from jaxpt.rl.collect import RolloutCollector
from jaxpt.rl.logprobs import response_logits, token_logprobs
from jaxpt.rl.reward_sources import QUALITY_HEAD, RewardModelSource, init_running_stats, same_tokens
from jaxpt.trainers.grpo import (AGG_WEIGHT, RolloutHooks, assembled_rewards, load_reward_model, lora_reference,
                                  reward_functions, rl_start, reward_score_hook, rollout_params, rollout_reader,
                                  split_groups, update_means)
from jaxpt.trainers.ppo_config import PPOConfig, PPORunConfig
from jaxpt.engine.builder import Training, build_training, frozen_dtype, lora_trainable
from jaxpt.engine.optim import make_optimizer, partitioned
from jaxpt.engine.record import run_inputs
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.saved_model import SavedModel, load_reward_run
from jaxpt.engine.state import TrainState, trainable_part, with_part
from jaxpt.engine.step import GradFn, grad_fn_of, make_train_step

__all__ = ["CRITIC_HEAD", "PPOHooks", "PolicyAndCritic", "build", "critic_values", "experience_shapes", "loss_parts",
           "sequenced_grad_fn", "update_training"]

CRITIC_HEAD = "critic/head"  # with LoRA: the params subtree that trains whole beside the adapters (the value head)


class PolicyAndCritic(nn.Module):
  """The params tree of a PPO run: {"policy": TransformerLM(policy_config), "critic": RewardModel(critic_config)},
  both with LoRA's adapters when `lora` (a `jaxpt.nn.lora.LoRA`) is given. Only `init` calls it; the trainer applies
  each part on its own (`response_logits`, `critic_values`)."""

  policy_config: ModelConfig
  critic_config: ModelConfig
  lora: Any = None

  def setup(self):
    self.policy = TransformerLM(self.policy_config, lora=self.lora)
    self.critic = RewardModel(self.critic_config, num_scores=1, lora=self.lora)

  def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    return self.policy(tokens), self.critic(tokens, jnp.zeros(tokens.shape[:1], jnp.int32))[0]


def critic_values(critic_config: ModelConfig, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                  tokens: jax.Array, mask: jax.Array, lora: Any = None) -> jax.Array:
  """The critic's per-token values V [B, T] (float32, 0 where mask is 0): its backbone's final-norm hidden state at
  column P - 1 + t, the one whose logits predict response token t (the rollouts' layout, `response_logits`),
  through its [d, 1] head (a reward model's score head, applied at every response position); `lora`: the LoRA of
  its backbone (params with adapters, read unmerged)."""
  _, hidden = response_logits(TransformerLM(critic_config, lora=lora), params["backbone"], prompt_tokens, prompt_mask,
                              tokens, mask)
  b, t, d = hidden.shape
  values = RewardModel(critic_config, num_scores=1, lora=lora).apply({"params": params}, hidden.reshape(b * t, d),
                                                                     method=RewardModel.score)
  return values.reshape(b, t) * jnp.asarray(mask, jnp.float32)


def experience_shapes(config: PPORunConfig) -> dict[str, jax.ShapeDtypeStruct]:
  """Global shapes of one update's minibatch (n = config.minibatch_rows rollouts; P prompt, T response)."""
  n, p, t = config.minibatch_rows, config.data.max_prompt_len, config.sampling.max_new_tokens
  i32, f32 = jnp.int32, jnp.float32
  shapes = {"prompt_tokens": ((n, p), i32), "prompt_mask": ((n, p), i32), "tokens": ((n, t), i32),
            "mask": ((n, t), f32), "old_logp": ((n, t), f32), "old_values": ((n, t), f32),
            "advantages": ((n, t), f32), "returns": ((n, t), f32)}
  return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


def loss_parts(policy_config: ModelConfig, critic_config: ModelConfig, settings: PPOConfig,
               temperature: float, lora: Any = None) -> tuple[Callable, Callable]:
  """(policy_part(policy params, minibatch), value_part(critic params, minibatch)), each -> (loss, metrics): the
  ppo_clip loss of the policy's teacher-forced log-probs on the per-token advantages; the clipped value loss of the
  critic's per-token values against the returns (metrics gain the minibatch's AGG_WEIGHT, the weight of both losses'
  aggregation); `lora`: both models' LoRA (`PolicyAndCritic`)."""
  policy_model = TransformerLM(policy_config, lora=lora)
  policy_loss, value_loss = get_loss("policy", "ppo_clip"), get_loss("value", "clipped_value")

  def policy_part(policy: Any, mb: dict) -> tuple[jax.Array, dict]:
    logits, _ = response_logits(policy_model, policy, mb["prompt_tokens"], mb["prompt_mask"], mb["tokens"],
                                mb["mask"], temperature)
    logp = token_logprobs(logits, mb["tokens"], mb["mask"])
    pg, metrics = policy_loss(logp, mb["old_logp"], mb["advantages"], mb["mask"], **settings.loss_kwargs())
    return pg, {**metrics, "pg_loss": pg}

  def value_part(critic: Any, mb: dict) -> tuple[jax.Array, dict]:
    values = critic_values(critic_config, critic, mb["prompt_tokens"], mb["prompt_mask"], mb["tokens"], mb["mask"],
                           lora)
    loss, metrics = value_loss(values, mb["old_values"], mb["returns"], mb["mask"], clip=settings.value_clip or None,
                               agg=settings.agg)
    return loss, {**metrics, AGG_WEIGHT: aggregate_weight(mb["mask"], settings.agg)}

  return policy_part, value_part


def sequenced_grad_fn(policy_part: Callable, value_part: Callable, lora: bool = False) -> GradFn:
  """The GradFn of loss = policy_part(params["policy"]) + value_part(params["critic"]) (`loss_parts`), one model
  after the other: the critic's forward and backward, then the policy's inside a `lax.cond` on the critic's
  gradient being finite, so that the policy's buffers (XLA allocates a scan's zero-initialised stacked residuals
  wherever its scheduler likes, on CPU at the program's start) exist only once the critic's are freed. The step's
  peak then holds one model's activations, not both (jax.grad of the summed loss, or an optimization barrier
  between the two: the sum; `tests/test_ppo_update.py` measures the compiled temporaries of both at a tiny size).
  The params are disjoint, so the gradients are those of the sum. A non-finite critic gradient gives NaN policy
  gradients (the step is non-finite either way: `make_train_step` stops or skips it).
  With `lora` (the params hold adapters: `PolicyAndCritic`) the finiteness test and the `lax.cond` carry only the
  trainable part's gradients (`lora_trainable` with `CRITIC_HEAD`), so that the frozen base's weight gradients, never
  read, are removed by XLA as the shared step's are; the frozen leaves' gradients are given as zeros (QLoRA's int
  codes: float0, `allow_int`)."""
  value_grad = jax.value_and_grad(value_part, has_aux=True, allow_int=True)
  policy_grad = jax.value_and_grad(policy_part, has_aux=True, allow_int=True)

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    trainable = lora_trainable(params, (CRITIC_HEAD,)) if lora else {"policy": None, "critic": None}
    (vl, v_metrics), critic_grads = value_grad(params["critic"], batch)

    def trained_policy_grad(policy: Any) -> Any:
      (pg, pg_metrics), grads = policy_grad(policy, batch)
      return (pg, pg_metrics), trainable_part(grads, trainable["policy"])

    def not_finite(policy: Any) -> Any:
      shapes = jax.eval_shape(trained_policy_grad, policy)
      return jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

    finite = jnp.isfinite(optax.global_norm(trainable_part(critic_grads, trainable["critic"])))
    (pg, pg_metrics), policy_grads = jax.lax.cond(finite, trained_policy_grad, not_finite, params["policy"])
    if lora:
      policy_grads = with_part(jax.tree.map(jnp.zeros_like, params["policy"]), policy_grads)
    return {"policy": policy_grads, "critic": critic_grads}, aux, {**pg_metrics, **v_metrics, "loss": pg + vl}

  return grad_fn


def make_experience(config: PPORunConfig, critic_config: ModelConfig) -> Callable:
  """(critic params, scores [N], old_logp, ref_logp, mask, prompt_tokens, prompt_mask, tokens) -> ({old_values,
  advantages, returns} [N, T], scalar metrics): the step's values, KL-shaped rewards, GAE and whitening."""
  settings = config.ppo

  def experience(critic, scores, old_logp, ref_logp, mask, prompt_tokens, prompt_mask, tokens):
    values = critic_values(critic_config, critic, prompt_tokens, prompt_mask, tokens, mask, config.lora.spec())
    rewards = kl_shaped_rewards(scores, old_logp, ref_logp, mask, settings.kl_coef, settings.kl_kind)
    advantages, returns = gae(rewards, values, mask, gamma=settings.gamma, lam=settings.lam)
    if settings.whiten_advantages:
      advantages = whiten(advantages, mask)
    metrics = {"kl_ref": masked_mean(reward_kl(old_logp, ref_logp, mask, settings.kl_kind), mask),
               "value_start_mean": masked_mean(values, mask),
               "token_reward_sum": jnp.mean(jnp.sum(rewards, axis=-1))}
    return {"old_values": values, "advantages": advantages, "returns": returns}, metrics

  return experience


@dataclasses.dataclass
class PPOHooks(RolloutHooks):
  """The PPO run's loop hooks, built once by `build`: `train_step` collects rollouts (`collector`), computes the
  experience, then updates policy and critic (`training.train_step`) or, during the value warm-up, the critic only
  (`warmup_step`, compiled on the same state). `policy` is `training`'s view of params["policy"] (`of_part`): its
  layout and, with LoRA, the merged policy and its base the collector reads."""

  config: PPORunConfig
  training: Training
  policy: Training
  collector: RolloutCollector
  experience: Callable  # make_experience, compiled on the mesh
  warmup_step: Callable  # the critic-only update, compiled
  assemble: Callable | None = None
  reward_model: RewardModelSource | None = None
  critic_start: SavedModel | None = None  # the ppo.critic_init reward model (read by init_state)
  ref_params: Any = None

  def init_state(self, training: Training) -> TrainState:
    """The initial state: the policy from `init_from` (or the seeded init); the critic from the `ppo.critic_init`
    reward model (backbone, and its score head's quality column as the value head) or, without one, the policy's
    start with the critic's fresh seeded head; with LoRA the critic's backbone is that start as its frozen base
    beside the critic's own fresh adapters (module docstring). Without LoRA keeps the initial policy as the
    reference (rebuilt on resume); with LoRA the reference is the base, adapters off, or with `lora.init_adapter` the
    base plus its adapters (`reference_params`)."""
    state = training.init_state()
    params = dict(state.params)
    lora = self.config.lora.enabled
    sharding = training.sharded.state_sharding.params["critic"]
    if self.critic_start is not None:
      start = self.critic_start.params
      kernel = start["head"]["kernel"][:, QUALITY_HEAD:QUALITY_HEAD + 1]
      backbone = start["backbone"]
      if lora:
        backbone = jax.jit(functools.partial(lora_base, self.config), out_shardings=sharding["backbone"])(
            backbone, lora_lib.adapter_params(params["critic"]["backbone"]))
      critic = {"backbone": backbone, "head": {**start["head"], "kernel": kernel}}
    else:
      backbone = params["policy"]
      if lora:
        backbone = lora_lib.replace_adapters(backbone, lora_lib.adapter_params(params["critic"]["backbone"]))
      critic = {**params["critic"], "backbone": backbone}
    params["critic"] = jax.device_put(jax.tree.map(jnp.copy, critic), sharding)
    if self.config.ppo.uses_reference and not lora:
      self.ref_params = jax.tree.map(jnp.copy, params["policy"])
    return state.replace(params=params)

  def reference_params(self, policy: Any) -> Any:
    """The reference policy as the collector's log-probs read it: with LoRA the base of the `policy` params, or with
    `lora.init_adapter` the base plus its adapters (`lora_reference`), else the initial policy's copy."""
    return lora_reference(self.policy, policy) if self.config.lora.enabled else self.ref_params

  def train_step(self, training: Training, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    settings = self.config.ppo
    step = int(state.step)
    sample_rng, update_rng = jax.random.split(state.step_rng())
    score = reward_score_hook(self.config.reward, self.assemble, self.reward_model)
    ro, dapo_metrics = self.collector.step_rollouts(rollout_params(self.policy, state.params["policy"]), batch, step,
                                                    sample_rng, score=score)
    metrics: dict[str, Any] = {"accuracy": float(ro["scores"].mean()), "response_length": float(ro["lengths"].mean()),
                               "num_tokens": float(ro["lengths"].sum()), **dapo_metrics}
    rewards, aux = ro["rewards"], state.aux
    if self.assemble is not None:
      rewards, aux = assembled_rewards(self.config.reward, self.assemble, self.reward_model, ro, aux, metrics)
    experience = {k: ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp")}
    if self.config.dapo.overlong_filtering:
      experience["mask"] = dapo.filter_overlong(experience["mask"], ro["truncated"])
    inputs = [experience[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")]
    ref_logp = (self.collector.logprobs(self.reference_params(state.params["policy"]), *inputs)
                if settings.uses_reference else experience["old_logp"])
    computed, experience_metrics = self.experience(state.params["critic"], np.asarray(rewards, np.float32),
                                                   experience["old_logp"], ref_logp, experience["mask"],
                                                   *inputs[:3])
    experience.update(computed)
    metrics.update({k: float(v) for k, v in experience_metrics.items()}, reward_mean=float(np.mean(rewards)))
    warm = step < settings.value_warmup_steps
    first = (step if warm else step - settings.value_warmup_steps) * self.config.updates_per_step
    new_state, update_metrics = self._updates(state.replace(aux=aux), experience, update_rng,
                                              np.random.default_rng([self.config.seed, step]), first, warm)
    metrics.update(update_metrics, value_warmup=float(warm))
    return new_state.replace(step=state.step + 1, rng=state.rng), metrics

  def _updates(self, state: TrainState, experience: dict, rng: jax.Array, shuffle: np.random.Generator,
               first_update: int, warm: bool) -> tuple[TrainState, dict]:
    """`epochs` passes over `minibatches` shuffled minibatches (whole groups), each one update of the compiled
    step (critic only when `warm`); the state enters with `step = first_update` and update key `rng`. Metrics:
    means over updates."""
    settings = self.config.ppo
    step_fn = self.warmup_step if warm else self.training.train_step
    state = state.replace(step=jnp.asarray(first_update, jnp.int32), rng=rng)
    update_metrics = []
    for _ in range(settings.epochs):
      for rows in split_groups(self.collector.rollout_rows, settings.group_size, settings.minibatches, shuffle):
        state, m = step_fn(state, self.collector.take_rows(experience, rows))
        update_metrics.append(m)
    return state, update_means(update_metrics)

  def evaluate(self, state: TrainState) -> dict:
    """eval_accuracy_<set> (and eval_pass1_<set>) of the state's policy (`RolloutCollector.evaluate`)."""
    return self.collector.evaluate(rollout_params(self.policy, state.params["policy"]))


def load_critic_start(config: PPORunConfig, mesh: Any, tokenizer: Any) -> SavedModel | None:
  """The `ppo.critic_init` reward-model run, params on `mesh`, or None; ConfigError naming ppo.critic_init (before
  any compile) for a run that is not a reward model's, one whose tokenizer or prompt format is not the policy's
  (the critic reads the rollouts' own tokens), whose max_seq_len cannot hold prompt + response, or (LoRA) whose
  projections cannot take the run's `lora` section."""
  source = config.ppo.critic_init
  if not source:
    return None
  say(f"loading the critic's start, the reward model {source} ...")
  prompt_len, new_tokens = config.data.max_prompt_len, config.sampling.max_new_tokens

  def fits(model: ModelConfig, rm_tokenizer: Any) -> None:
    if rm_tokenizer is None or rm_tokenizer.model_proto != tokenizer.model_proto:
      raise ConfigError("ppo.critic_init", "its tokenizer is not the policy's: per-token GAE needs a value at "
                        "each of the policy's response tokens, which a critic of other tokens cannot give (leave "
                        "ppo.critic_init empty: the critic then starts from the policy; reward.model may still be "
                        "this RM, scored on re-tokenized text)", source)
    if prompt_len + new_tokens > model.max_seq_len:
      raise ConfigError("ppo.critic_init", f"its model.max_seq_len={model.max_seq_len} cannot hold "
                        f"data.max_prompt_len ({prompt_len}) + sampling.max_new_tokens ({new_tokens})", source)
    try:  # with LoRA the critic's backbone (the RM's model) takes the run's adapters
      config.lora.check_dims(model.projection_dims(), " (MoE experts have none)" if model.num_experts else "",
                             model.projection_blocked_dims())
    except ConfigError as e:
      raise ConfigError("ppo.critic_init", f"its model cannot take the run's lora section: {e}", source) from None

  run = load_reward_run(source, mesh, config.mesh.rules, field="ppo.critic_init", fits=fits)
  if not same_tokens(run.tokenizer, run.prompt_format, tokenizer, config.task.prompt_format):
    raise ConfigError("ppo.critic_init", f"was trained on {run.prompt_format} prompts, the policy's are "
                      f"{config.task.prompt_format}", source)
  return run


def lora_base(config: PPORunConfig, start: Any, adapters: Any) -> Any:
  """The LoRA critic's backbone params from a float backbone `start` (a reward model's): `start` as the frozen base,
  cast to lora.base_dtype (`frozen_dtype`; QLoRA: then quantized, `lora_lib.quantize_params`), beside `adapters`
  (the critic's fresh ones, an `adapter_params` tree)."""
  floats = frozen_dtype(lora_lib.with_adapters(start, adapters), config)
  return floats if config.lora.quant is None else lora_lib.quantize_params(floats, config.lora.quant)


def update_training(config: PPORunConfig, mesh: Any, critic_config: ModelConfig,
                    donate: bool | None = None) -> tuple[Training, dict, dict, Callable]:
  """(the shared builder's policy + critic update on `mesh`, compiled for one minibatch (`experience_shapes`), its
  per-part optimizers {"policy", "critic"}, their schedules, and the critic's `value_part` loss): what `build` runs
  and `jaxpt plan` compiles. With LoRA each optimizer sees its part's adapters (and the critic's value head,
  `CRITIC_HEAD`) alone."""
  settings = config.ppo
  policy_updates = max(1, (config.steps - settings.value_warmup_steps) * config.updates_per_step)
  critic_updates = max(1, config.steps * config.updates_per_step)
  critic_optim = dataclasses.replace(config.optim, learning_rate=settings.critic_learning_rate)
  parts, schedules = {}, {}

  def optimizer(decay: Any, steps: int) -> tuple[Any, Any]:  # decay: the weight-decay mask of the trainable part
    parts["policy"], schedules["policy"] = make_optimizer(config.optim, steps, mask=decay["policy"])
    parts["critic"], schedules["critic"] = make_optimizer(critic_optim, critic_updates, mask=decay["critic"])
    return partitioned(parts), schedules["policy"]

  def init_aux(rng: jax.Array) -> dict | None:
    return {"reward_stats": init_running_stats()} if config.reward.normalize == "running" else None

  lora = config.lora.spec()
  policy_part, value_part = loss_parts(config.model, critic_config, settings, config.sampling.temperature, lora)
  training = build_training(config, mesh, PolicyAndCritic(config.model, critic_config, lora),
                            (jnp.zeros((1, config.data.max_prompt_len), jnp.int32),), experience_shapes(config),
                            grad_fn=sequenced_grad_fn(policy_part, value_part, lora is not None),
                            weight_key=AGG_WEIGHT, total_steps=policy_updates, init_aux=init_aux,
                            init_from_subtree="policy", new_heads=(CRITIC_HEAD,), optimizer=optimizer, donate=donate)
  return training, parts, schedules, value_part


def build(config: PPORunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), loads the reward model(s) (every refusal before any compile),
  then builds the tokenizer, prompts, samplers and the two compiled updates (policy + critic; critic only)."""
  config = from_section(PPORunConfig, config, "config")
  mesh, tokenizer = rl_start(config, workdir, "config.ppo.group_size / config.ppo.minibatches")
  reward_run = load_reward_model(config, mesh)
  critic_start = load_critic_start(config, mesh, tokenizer)
  critic_config = config.model if critic_start is None else critic_start.config

  say("compiling the policy and critic updates ...")
  training, parts, schedules, value_part = update_training(config, mesh, critic_config)
  value_only = lambda params, mb, rng: value_part(params["critic"], mb)
  warmup_step = training.compile_step(make_train_step(
      None, partitioned(parts, frozen=("policy",)), schedules["critic"], config.optim.grad_accum_steps,
      AGG_WEIGHT,
      grad_fn=grad_fn_of(value_only), skip_nonfinite=config.on_nonfinite == "skip", trainable=training.trainable),
      experience_shapes(config))

  layout, policy = training.layout, training.of_part("policy")
  params = jax.eval_shape(training.sharded.init_state).params["policy"]
  reader, reader_layout, params = rollout_reader(TransformerLM(config.model, lora=config.lora.spec()), policy, params)
  collector = RolloutCollector.create(config, reader, reader_layout, params, tokenizer, config.task.data_dir(workdir))
  experience = layout.jit(make_experience(config, critic_config), (layout.batch, layout.replicated))
  assemble, reward_model = reward_functions(config, policy.layout, tokenizer, reward_run)
  hooks = PPOHooks(config=config, training=training, policy=policy, collector=collector, experience=experience,
                   warmup_step=warmup_step, assemble=assemble, reward_model=reward_model, critic_start=critic_start)
  inputs = run_inputs(f"task|{config.task.train_identity}", tokenizer)
  return BuiltRun("ppo", config, training, collector.batches, inputs=inputs, tokenizer=tokenizer,
                  data=collector.prompts, evaluate=hooks.evaluate if config.data.eval_prompts else None, hooks=hooks)
