"""GRPO (and CLIPO) post-training on the shared loop: the run config, the policy loss and the minibatch updates.

One loop step (`GRPOHooks.train_step`), for a batch of B prompts:

    prompts [B, P] --`RolloutCollector.step_rollouts` (jaxpt.rl.collect: G samples each, verifier, DAPO)-->
      rollouts [N = B*G]: tokens, mask, old_logp [N, T], rewards R [N]
      (the `reward` section: R = weighted verifier + reward-model scores, EOS-missing penalty, normalisation, clip:
         `jaxpt.rl.reward_sources`; by default the verifier's score as it is, no reward model)
      (+ CLIPO: R += r_con from the contrastive head, which then steps: `RolloutCollector.contrastive_rewards`)
      (+ KL in the reward: R -= beta * sum_t kl_t)
      --group advantages--> A [N]
      --`epochs` passes x `minibatches` (whole groups) of policy updates:
        loss = policy_loss(logp, old_logp, A, mask; clip, KL-to-reference term, entropy bonus,
                           KDRL: reverse KL to a teacher's log-probs of the rollouts, `grpo.teacher`)
               (+ in_loss_coef * CLIPO contrastive loss on the policy's own hidden states)
               (DAPO overlong filtering: truncated responses masked out of the loss)

Each policy update is the shared train step (`jaxpt.engine.step`), compiled by the shared builder for one minibatch
of `experience_shapes`; `optim.grad_accum_steps` splits a minibatch into micro-batches. Everything runs on the
run's mesh (`config.mesh`): the collector's sampler and log-probs are compiled for it too. `state.step` counts loop
steps (the data position); the optimizer's own count runs epochs * minibatches per step.
The reference policy is the initial policy (the `init_from` run's params, or the seeded init), rebuilt on resume
rather than checkpointed; the CLIPO head lives in `state.aux["clipo"]`, the running reward normalisation's
statistics in `state.aux["reward_stats"]`; a reward model (`reward.model`) is loaded from its run, never checkpointed
here. Randomness of step t comes from fold_in(state.rng, t), so a resumed run draws exactly what an uninterrupted one
would.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import from_section
from jaxpt.data.math_task import task_tokenizer
from jaxpt.losses import get_loss
from jaxpt.losses.grpo import (aggregate_weight, entropy_from_logits, group_advantages,
                               kl_penalized_rewards)
from jaxpt.models.transformer import TransformerLM
from jaxpt.progress import say
from jaxpt.rl import clipo, dapo
from jaxpt.rl.reward_sources import (RewardConfig, RewardModelSource, assemble_rewards, check_model_fits,
                                     init_running_stats, raw_rewards)
from jaxpt.rl.collect import TRAIN_REWARDS, RolloutCollector, run_stop_ids
from jaxpt.rl.logprobs import response_logits, token_logprobs
from jaxpt.trainers.grpo_config import GRPOConfig, GRPORunConfig
from jaxpt.trainers.teacher import load_teacher
from jaxpt.engine.builder import Training, build_training, training_mesh
from jaxpt.engine.config import check_vocab
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.engine.record import check_launch, digest, resumes, run_inputs
from jaxpt.engine.loop import LoopResult
from jaxpt.engine.metrics import read_metrics
from jaxpt.engine.run import BuiltRun, Hooks
from jaxpt.engine.saved_model import load_reward_run
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import grad_fn_of


def split_groups(num_rows: int, group_size: int, minibatches: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Row indices of `minibatches` minibatches of whole groups, groups shuffled by `rng`."""
  groups = rng.permutation(num_rows // group_size)
  return [np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in part])
          for part in np.array_split(groups, minibatches)]


def experience_shapes(config: GRPORunConfig) -> dict[str, jax.ShapeDtypeStruct]:
  """Global shapes of one policy-update minibatch (n = config.minibatch_rows rollouts; P prompt, T response)."""
  n, p, t = config.minibatch_rows, config.data.max_prompt_len, config.sampling.max_new_tokens
  i32, f32 = jnp.int32, jnp.float32
  shapes = {"prompt_tokens": ((n, p), i32), "prompt_mask": ((n, p), i32), "tokens": ((n, t), i32),
            "mask": ((n, t), f32), "old_logp": ((n, t), f32), "advantages": ((n,), f32), "labels": ((n,), i32),
            "group_ids": ((n,), i32)}
  if config.grpo.uses_reference:
    shapes["ref_logp"] = ((n, t), f32)
  if config.grpo.teacher:
    shapes["teacher_logp"], shapes["kd_weight"] = ((n, t), f32), ((n,), f32)
  return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


POLICY_LOSS_KEY = 0x5eed   # fold_in(update key, this): the policy loss's own key (the CLIPO term uses the key itself)
# the update's metric that weights a minibatch's gradient under accumulation: `aggregate_weight` of its mask under
# the run's `agg` (tokens for token-mean, non-empty rows for the seq-mean modes), as GRPO's and PPO's losses average
AGG_WEIGHT = "agg_weight"


def make_policy_loss(model: TransformerLM, settings: GRPOConfig, clipo_config: clipo.CLIPOConfig,
                     temperature: float) -> Callable[[Any, dict, jax.Array, Any], tuple[jax.Array, dict]]:
  """loss_fn(params, minibatch, rng, aux) -> (loss, metrics) of one policy update.

  minibatch: prompt_tokens/prompt_mask [n, P], tokens/mask/old_logp (and ref_logp, teacher_logp) [n, T],
  advantages [n] (and kd_weight [n]), labels/group_ids [n] (for the in-loss CLIPO term, through the fixed head
  aux["clipo"]).
  """
  policy_loss = get_loss("policy", settings.policy_loss)
  kwargs = settings.loss_kwargs()
  draws = "rng" in inspect.signature(policy_loss).parameters   # clip_cov: its random tokens, a key per update
  in_loss = clipo_config.enabled and clipo_config.in_loss_coef > 0

  def loss_fn(params: Any, mb: dict, rng: jax.Array, aux: Any) -> tuple[jax.Array, dict]:
    logits, hidden = response_logits(model, params, mb["prompt_tokens"], mb["prompt_mask"], mb["tokens"],
                                     mb["mask"], temperature)
    logp = token_logprobs(logits, mb["tokens"], mb["mask"])
    entropy = entropy_from_logits(logits) if settings.entropy_coef > 0 else None
    loss, metrics = policy_loss(logp, mb["old_logp"], mb["advantages"], mb["mask"], ref_logp=mb.get("ref_logp"),
                                entropy=entropy, **kwargs,
                                **({"teacher_logp": mb["teacher_logp"], "kd_weight": mb["kd_weight"]}
                                   if "teacher_logp" in mb else {}),
                                **({"rng": jax.random.fold_in(rng, POLICY_LOSS_KEY)} if draws else {}))
    if in_loss:
      term, _ = clipo.in_loss_term(clipo_config, aux["clipo"].params, hidden, mb["mask"], mb["labels"],
                                   mb["group_ids"], rng)
      loss = loss + clipo_config.in_loss_coef * term
      metrics = dict(metrics, clipo_in_loss=term, loss=loss)
    return loss, dict(metrics, **{AGG_WEIGHT: aggregate_weight(mb["mask"], settings.agg)})

  return loss_fn


REWARD_HACKING_PNG = "reward_hacking.png"  # written by RolloutHooks.finished when a reward model rewards


class RolloutHooks(Hooks):
  """What the hooks of the trainers that collect rollouts (GRPO, PPO) share; a subclass has `collector` (a
  `RolloutCollector`) and `reward_model` (a `RewardModelSource`, or None)."""

  def describe(self) -> str:
    """The start line's addition: the compiled rollout sampler's memory."""
    return f", rollout sampler {self.collector.sampler_memory.get('peak_mib', float('nan')):.1f} MiB"

  def finished(self, result: LoopResult, workdir: str) -> None:
    """With a reward model: `reward_hacking.png`, its score, the gold (verifier) score and the response length
    over the run's steps (process 0, which writes the metrics)."""
    if self.reward_model is not None and jax.process_index() == 0:
      from jaxpt import reports  # lazily: importing the trainers must not import matplotlib

      reports.plot_reward_hacking(read_metrics(workdir), os.path.join(workdir, REWARD_HACKING_PNG))


def update_means(update_metrics: list[dict]) -> dict:
  """A step's metrics from its policy updates' (one dict of device scalars each): each one's mean over the updates,
  the accumulation weight (AGG_WEIGHT) left out."""
  means = jax.tree.map(lambda *xs: float(np.mean(xs)), *jax.device_get(update_metrics))
  return {k: v for k, v in means.items() if k != AGG_WEIGHT}


@dataclasses.dataclass
class GRPOHooks(RolloutHooks):
  """The GRPO run's loop hooks, built once by `build`: `train_step` collects rollouts (`collector`), then updates.

  `training.train_step` is the shared step compiled for one policy-update minibatch; the loop's state is handed to
  it with `step` set to the optimizer's update count (so `lr` is the schedule's) and `rng` to the step's update key.
  The rollouts' per-rollout host arrays are whole on every process (`jaxpt.rl.collect`), so the advantages and the
  minibatch order are computed identically on every process.
  """

  config: GRPORunConfig
  training: Training
  collector: RolloutCollector  # samplers, tokenizer, prompts, verifier: the rollouts of each step and the eval
  kl_rewards: Callable  # (rewards [N], old_logp, ref_logp, mask [N, T]) -> kl_penalized_rewards [N]
  assemble: Callable | None = None  # reward_sources.assemble_rewards for config.reward, compiled (None: default)
  reward_model: RewardModelSource | None = None  # config.reward.model's scorer
  ref_params: Any = None  # the initial policy, set by `init_state` when the KL term needs it
  teacher: Any = None  # KDRL's frozen teacher (`jaxpt.trainers.teacher.Teacher`) when config.grpo.teacher is set

  def init_state(self, training: Training) -> TrainState:
    """The initial state (params from `init_from`, or the seeded init); keeps a copy of its params as the
    reference policy when the KL term needs one (rebuilt like this on resume, never checkpointed)."""
    state = training.init_state()
    if self.config.grpo.uses_reference and not training.lora:  # with LoRA: the base (+ init_adapter's; no copy)
      self.ref_params = jax.tree.map(jnp.copy, state.params)
    return state

  def policy_params(self, params: Any) -> Any:
    """The policy `params` as the collector's programs read them (`rollout_params`)."""
    return rollout_params(self.training, params)

  def reference_params(self, params: Any) -> Any:
    """The reference policy of the policy `params` as the collector's log-probs read it: with LoRA their base, or
    with `lora.init_adapter` the base plus its adapters (`lora_reference`), else the initial params' copy."""
    return lora_reference(self.training, params) if self.training.lora else self.ref_params

  def train_step(self, training: Training, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    settings, cfg = self.config.grpo, self.config.clipo
    step = int(state.step)
    sample_rng, clipo_rng, update_rng = jax.random.split(state.step_rng(), 3)
    ro, dapo_metrics = self.collector.step_rollouts(self.policy_params(state.params), batch, step, sample_rng,
                                                    score=self.score_hook)
    metrics: dict[str, Any] = {"accuracy": float(ro["scores"].mean()), "response_length": float(ro["lengths"].mean()),
                               "num_tokens": float(ro["lengths"].sum()), **dapo_metrics}
    rewards = ro["rewards"]
    aux = state.aux
    if self.assemble is not None:
      rewards, aux = self._assembled_rewards(ro, aux, metrics)
    if cfg.enabled:
      head, contrastive, head_metrics = self.collector.contrastive_rewards(aux["clipo"], ro, clipo_rng)
      aux = dict(aux, clipo=head)
      rewards = rewards + contrastive
      metrics.update(head_metrics)
    experience = {k: ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp")}  # on the mesh
    if settings.uses_reference:
      experience["ref_logp"] = self.collector.logprobs(self.reference_params(state.params), *(
          experience[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")))
      if settings.kl_in_reward:
        rewards = np.asarray(self.kl_rewards(rewards, experience["old_logp"], experience["ref_logp"],
                                             experience["mask"]))
    advantages = np.asarray(group_advantages(rewards, settings.group_size, settings.advantage))
    host = {"group_ids": ro["group_ids"], "labels": ro["labels"],
            "advantages": np.zeros_like(advantages) if settings.kd_only else advantages}
    if self.teacher is not None:
      experience["teacher_logp"] = self.teacher_logprobs(experience)
      host["kd_weight"] = (np.asarray(ro["scores"]) <= 0 if settings.kd_skip_correct
                           else np.ones_like(advantages)).astype(np.float32)
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

  def teacher_logprobs(self, experience: dict) -> jax.Array:
    """The teacher's log-probs [N, T] of the rollouts in `experience` (on the mesh, as the reference's)."""
    return self.teacher.logprobs(self.teacher.params, *(
        experience[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")))

  @property
  def score_hook(self) -> Callable[[dict], dict] | None:
    """The collector's score hook (`round_rewards`) when the `reward` section is not the default, else None."""
    return reward_score_hook(self.config.reward, self.assemble, self.reward_model)

  def _assembled_rewards(self, ro: dict, aux: Any, metrics: dict) -> tuple[np.ndarray, Any]:
    return assembled_rewards(self.config.reward, self.assemble, self.reward_model, ro, aux, metrics)

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
      for rows in split_groups(self.collector.rollout_rows, settings.group_size, settings.minibatches, shuffle):
        minibatch = dict(self.collector.take_rows(experience, rows),
                         **self.training.put({k: np.asarray(v[rows], shapes[k].dtype) for k, v in host.items()}))
        state, m = self.training.train_step(state, minibatch)
        update_metrics.append(m)
    return state, update_means(update_metrics)

  def evaluate(self, state: TrainState) -> dict:
    """eval_accuracy_<set> (and eval_pass1_<set>) of the state's policy (`RolloutCollector.evaluate`)."""
    return self.collector.evaluate(self.policy_params(state.params))


def rollout_params(training: Training, params: Any) -> Any:
  """The policy `params` (of `training`, or of its `of_part` view) as the rollout collector's programs read them
  (`lora.rollouts`): unmerged, as they train, or with LoRA merged (W + s A B, a float copy made here; `params`
  themselves without LoRA) (GRPO and PPO)."""
  return params if training.config.lora.samples_unmerged else training.merged_params(params)


def lora_reference(training: Training, params: Any) -> Any:
  """The reference policy of LoRA policy `params` as the collector's log-probs read it: the initial policy
  (`Training.initial_policy`: the base, or with `lora.init_adapter` the base plus its adapters). Unmerged rollouts:
  the same params with those adapters, the codes as they are; merged: the base's arrays, QLoRA's dequantized, a
  copy while the log-probs run (with init_adapter: W + s A B of its adapters) (GRPO and PPO)."""
  if training.config.lora.samples_unmerged:
    return training.initial_policy(params)
  if training.config.lora.init_adapter:
    return training.merged_params(training.initial_policy(params))
  return training.dequantized_base(params)


def rollout_reader(model: Any, training: Training, params: Any) -> tuple[Any, Any, Any]:
  """(model, layout, abstract params) the rollout collector's programs are compiled for, of the policy `model`
  (with LoRA's spec) trained by `training` (or its `of_part` view) with abstract params `params`: the model as it
  trains with `lora.rollouts` unmerged, else `config.model` alone reading the merged params (W + s A B)."""
  if training.config.lora.samples_unmerged:
    return model, training.layout, params
  return model.clone(lora=None), training.merged_layout, jax.eval_shape(training.merged_params, params)


def reward_score_hook(settings: RewardConfig, assemble: Callable | None,
               reward_model: RewardModelSource | None) -> Callable[[dict], dict] | None:
  """The collector's score hook (`round_rewards`) of a `reward` section that is not the default (`assemble`, from
  `reward_functions`, not None), else None (GRPO and PPO)."""
  return None if assemble is None else functools.partial(round_rewards, settings, reward_model)


def round_rewards(settings: RewardConfig, reward_model: RewardModelSource | None, ro: dict, prompts: dict) -> dict:
  """A generation round's reward parts on the host, added to its rollouts by the collector's score hook
  (`RolloutCollector.step_rollouts`) before DAPO's filter reads them: rm_scores float32 [N] (the reward model's
  scores of the rollouts, zeros without one) and `TRAIN_REWARDS` [N], the reward trained on before normalisation
  (`reward_sources.raw_rewards`; dapo.filter_metric='reward' filters on it). `prompts`: the round's prompt batch
  (this process's block; its `questions` are what an RM of another tokenizer or format reads as the prompts)."""
  scores = ro["scores"]
  rm_scores = np.zeros_like(scores) if reward_model is None else reward_model.scores(ro, prompts["questions"])
  return {"rm_scores": rm_scores,
          TRAIN_REWARDS: raw_rewards(settings, scores, rm_scores, ro["rewards"] - scores, ro["truncated"], np)}


def assembled_rewards(settings: RewardConfig, assemble: Callable, reward_model: RewardModelSource | None, ro: dict,
                      aux: Any, metrics: dict) -> tuple[np.ndarray, Any]:
  """The `reward` section's rewards [N] of rollouts `ro` (the collector's verifier scores and DAPO punishment, the
  reward model's scores `round_rewards` added: metrics rm_score, their mean, and gold_score, the verifier's mean
  score, which the task knows whatever reward.verifier_weight is), by `assemble` (`reward_functions`), and `aux`
  with the running statistics updated (GRPO and PPO)."""
  scores, rm_scores = ro["scores"], ro["rm_scores"]
  if reward_model is not None:
    metrics["rm_score"], metrics["gold_score"] = float(np.mean(rm_scores)), float(np.mean(scores))
  running = settings.normalize == "running"
  rewards, stats = assemble(scores, rm_scores, ro["rewards"] - scores, ro["truncated"],
                            aux["reward_stats"] if running else None)
  return np.asarray(rewards), dict(aux, reward_stats=stats) if running else aux


def load_reward_model(config: Any, mesh: Any) -> Any:
  """The `reward.model` run (`saved_model.SavedModel`, params on `mesh`) of an RL run config, or None; every
  refusal (ConfigError naming reward.model) before any compile."""
  if not config.reward.uses_model:
    return None
  say(f"loading the reward model {config.reward.model} ...")
  prompt_len, new_tokens = config.data.max_prompt_len, config.sampling.max_new_tokens
  return load_reward_run(config.reward.model, mesh, config.mesh.rules, fits=lambda model, rm_tokenizer: (
      check_model_fits(model, rm_tokenizer, prompt_len, new_tokens, config.reward.model)))


def reward_functions(config: Any, layout: Any, tokenizer: Any,
                     reward_run: Any) -> tuple[Callable | None, RewardModelSource | None]:
  """(the compiled `assemble_rewards` of config.reward, None for the default section; the reward model's scorer,
  None without one) of an RL run config on `layout`."""
  assemble = None if config.reward.is_default else layout.jit(
      lambda *arrays: assemble_rewards(config.reward, *arrays), layout.replicated)
  reward_model = None if reward_run is None else RewardModelSource.create(
      reward_run.config, reward_run.params, reward_run.num_scores, reward_run.tokenizer, reward_run.prompt_format,
      tokenizer, config.task.prompt_format, layout, config.data.max_prompt_len, config.sampling.max_new_tokens,
      source=config.reward.model, stop_ids=run_stop_ids(tokenizer, config.sampling))
  return assemble, reward_model


def rl_start(config: Any, workdir: str, rows_field: str) -> tuple[Any, Any]:
  """(mesh, tokenizer) of an RL run (GRPO, PPO) in `workdir`: the mesh checked against the update's rows
  (`config.minibatch_rows`, named 'config.data.prompts_per_step x ' + `rows_field`), the launch checked against
  the run's record; the init_from run's tokenizer as it is (never retrained: the policy's embedding rows are its
  ids; copied into workdir/tokenizer), else the task's tokenizer trained in (or loaded from) workdir."""
  mesh = training_mesh(config, config.minibatch_rows, f"config.data.prompts_per_step x {rows_field}")
  check_launch(workdir, config, {"corpus": digest(f"task|{config.task.train_identity}")})
  say(f"preparing the task's prompts and tokenizer in {workdir} ...")
  tokenizer = init_tokenizer(config.init_from, workdir, resumes(workdir), config.model)
  if tokenizer is None:
    tokenizer = task_tokenizer(config.task, config.model.vocab_size, workdir, config.task.data_dir(workdir),
                               keep_existing=resumes(workdir))
  check_vocab(config.model, tokenizer.vocab_size)
  return mesh, tokenizer


def build(config: GRPORunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds the tokenizer, prompts, samplers and the shared
  builder's policy update, compiled for one minibatch of rollouts."""
  config = from_section(GRPORunConfig, config, "config")
  mesh, tokenizer = rl_start(config, workdir, "config.grpo.group_size / config.grpo.minibatches")
  model = TransformerLM(config.model, lora=config.lora.spec())
  loss_fn = make_policy_loss(model, config.grpo, config.clipo, config.sampling.temperature)
  def init_aux(rng: jax.Array) -> dict | None:  # always given: the policy's init key is the same with or without CLIPO
    aux = {"clipo": clipo.init_head_state(config.clipo, config.model.d_model, rng)} if config.clipo.enabled else {}
    if config.reward.normalize == "running":
      aux["reward_stats"] = init_running_stats()
    return aux or None

  reward_run = load_reward_model(config, mesh)  # every refusal before any compile

  say("compiling the policy update ...")
  training = build_training(config, mesh, model, (jnp.zeros((1, config.data.max_prompt_len), jnp.int32),),
                            experience_shapes(config), grad_fn=grad_fn_of(loss_fn, reads_aux=True),
                            weight_key=AGG_WEIGHT, total_steps=max(1, config.steps * config.updates_per_step),
                            init_aux=init_aux)

  reader, reader_layout, params = rollout_reader(model, training, jax.eval_shape(training.sharded.init_state).params)
  collector = RolloutCollector.create(config, reader, reader_layout, params, tokenizer, config.task.data_dir(workdir))
  kl_rewards = lambda *arrays: kl_penalized_rewards(*arrays, config.grpo.kl_coef, config.grpo.kl_kind)
  teacher = None
  if config.grpo.teacher:
    say(f"loading the teacher {config.grpo.teacher} ...")
    teacher = load_teacher(config.grpo.teacher, training.layout, tokenizer, config.sampling.temperature,
                           config.data.max_prompt_len + config.sampling.max_new_tokens)
  layout = training.layout
  assemble, reward_model = reward_functions(config, layout, tokenizer, reward_run)
  hooks = GRPOHooks(config=config, training=training, collector=collector,
                    kl_rewards=layout.jit(kl_rewards, layout.replicated), assemble=assemble,
                    reward_model=reward_model, teacher=teacher)
  inputs = run_inputs(f"task|{config.task.train_identity}", tokenizer)
  return BuiltRun("grpo", config, training, collector.batches, inputs=inputs, tokenizer=tokenizer,
                  data=collector.prompts, evaluate=hooks.evaluate if config.data.eval_prompts else None, hooks=hooks)


def replace_hooks(built: BuiltRun, **changes: Any) -> BuiltRun:
  """`built` with fields of its `GRPOHooks` or of their `RolloutCollector` replaced (`config=` goes to both), its
  compiled update kept: `reward_fn=` a verifier for another task than math, `sample=` another sampler (with
  `config=` the config that describes it), ..."""
  mine = {f.name for f in dataclasses.fields(RolloutCollector)}
  collector = dataclasses.replace(built.hooks.collector, **{k: v for k, v in changes.items() if k in mine})
  hooks = dataclasses.replace(built.hooks, collector=collector,
                              **{k: v for k, v in changes.items() if k not in mine or k == "config"})
  return dataclasses.replace(built, config=hooks.config, batches=collector.batches, hooks=hooks,
                             evaluate=hooks.evaluate if built.evaluate is not None else None)
