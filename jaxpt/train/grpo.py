"""GRPO (and CLIPO) post-training on the shared loop.

One loop step (`GRPOTrainer.train_step`), for a batch of B prompts:

    prompts [B, P] --repeat G--> [N = B*G, P] --sampler (KV cache)--> responses [N, T], old log-probs, hidden
      --decode + verifier--> rewards R [N]   (+ CLIPO: R += r_con from the contrastive head, which then steps)
      (+ KL in the reward: R -= beta * sum_t kl_t)
      --group advantages--> A [N]
      --`epochs` passes x `minibatches` (whole groups) of policy updates:
        loss = policy_loss(logp, old_logp, A, mask; clip, KL-to-reference term, entropy bonus)
               (+ in_loss_coef * CLIPO contrastive loss on the policy's own hidden states)

`state.step` counts loop steps (the data position); the optimizer's own count runs epochs * minibatches per step.
The reference policy is the initial policy (the `init_from` run's params, or the seeded init), rebuilt on resume
rather than checkpointed; the CLIPO head lives in `state.aux["clipo"]`. Randomness of step t comes from
fold_in(state.rng, t), so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from jaxpt.data import math_prompts, order
from jaxpt.data.sft import PromptData, task_tokenizer
from jaxpt.data.tokenizer import Tokenizer
from jaxpt.losses import get_loss
from jaxpt.losses.grpo import (ADVANTAGES, AGG_MODES, KL_KINDS, entropy_from_logits, group_advantages,
                               kl_penalized_rewards)
from jaxpt.models.config import ConfigError, ModelConfig, check_known_fields
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.rl import clipo
from jaxpt.rl.logprobs import response_logits, response_logprobs, token_logprobs
from jaxpt.rl.rollouts import repeat_prompts, response_texts, verifier_rewards
from jaxpt.rl.sampler import SamplingConfig, make_sampler
from jaxpt.train.checkpoint import load_run_params
from jaxpt.train.config import ConfigChecker, check_optim, check_run_fields, check_vocab
from jaxpt.train.loop import LoopConfig, LoopResult, print_summary, save_run_config, train_loop
from jaxpt.train.optim import make_optimizer
from jaxpt.train.state import TrainState
from jaxpt.train.step import accumulate_gradients

POLICY_LOSSES = ("ppo_clip", "gspo")


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
  """`config.grpo`: rollouts per prompt, advantage estimator, policy loss and its options, update schedule."""

  group_size: int = 8
  advantage: str = "grpo"          # grpo | drgrpo | rloo | reinforce_pp_baseline
  policy_loss: str = "ppo_clip"    # ppo_clip | gspo (registered losses)
  eps_lo: float = 0.2
  eps_hi: float = 0.2
  dual_clip_c: float = 3.0         # 0 = off (ppo_clip only)
  agg: str = "token-mean"
  kl_coef: float = 0.0             # beta; 0 = no reference policy
  kl_kind: str = "k3"
  kl_in_reward: bool = False       # the KL goes into the reward instead of the loss
  entropy_coef: float = 0.0
  epochs: int = 1
  minibatches: int = 1

  @classmethod
  def from_config(cls, config: Any) -> "GRPOSettings":
    check = ConfigChecker(config)
    check_known_fields(cls, config.grpo, "config.grpo")
    for name in ("group_size", "epochs", "minibatches"):
      check.integer(f"grpo.{name}", 1)
    for name in ("eps_lo", "eps_hi", "kl_coef", "entropy_coef", "dual_clip_c"):
      check.number(f"grpo.{name}", 0.0)
    choices = {"advantage": tuple(ADVANTAGES), "policy_loss": POLICY_LOSSES, "agg": AGG_MODES,
               "kl_kind": KL_KINDS}
    for name, allowed in choices.items():
      if check.get(f"grpo.{name}") not in allowed:
        check.fail(f"grpo.{name}", f"must be one of {', '.join(allowed)}")
    settings = cls(**dict(config.grpo))
    if 0 < settings.dual_clip_c <= 1:
      check.fail("grpo.dual_clip_c", "must be > 1 (or 0 = off)")
    if config.data.prompts_per_step % settings.minibatches:
      check.fail("grpo.minibatches", f"must divide config.data.prompts_per_step={config.data.prompts_per_step}")
    return settings

  def loss_kwargs(self) -> dict:
    kwargs = dict(eps_lo=self.eps_lo, eps_hi=self.eps_hi, agg=self.agg, kl_kind=self.kl_kind,
                  kl_coef=0.0 if self.kl_in_reward else self.kl_coef, entropy_coef=self.entropy_coef)
    if self.policy_loss == "ppo_clip":
      kwargs["dual_clip_c"] = self.dual_clip_c or None
    return kwargs

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0


def validate_grpo_config(config: Any) -> tuple[ModelConfig, GRPOSettings, clipo.CLIPOConfig, SamplingConfig]:
  """Checks every field a GRPO run reads (ConfigError naming the field), before any work."""
  check = ConfigChecker(config)
  for section in ("model", "task", "data", "sampling", "grpo", "clipo", "optim"):
    check.get(section)
  model = check_run_fields(config)
  check.integer("data.prompts_per_step", 1)
  check.integer("data.eval_prompts", 0)
  prompt_len = check.integer("data.max_prompt_len", 1)
  new_tokens = check.integer("sampling.max_new_tokens", 1)
  if prompt_len + new_tokens > model.max_seq_len:
    check.fail("sampling.max_new_tokens", f"prompt ({prompt_len}) + response longer than "
               f"config.model.max_seq_len={model.max_seq_len}")
  check_optim(config, "data.prompts_per_step")
  init_from = check.get("init_from")
  if not isinstance(init_from, str):
    check.fail("init_from", "must be a string ('' = random init)")
  if init_from and not os.path.isdir(os.path.join(init_from, "checkpoints")):
    check.fail("init_from", "no checkpoints/ folder there (expected the workdir of a jaxpt sft or pretrain run)")
  settings = GRPOSettings.from_config(config)
  try:
    clipo_config = clipo.CLIPOConfig.from_config(config.clipo)
    sampling = sampling_config(config, eos_id=0, pad_id=0, return_hidden=False)
  except ValueError as e:
    raise ConfigError(f"config.{e}" if not str(e).startswith("config.") else str(e)) from None
  return model, settings, clipo_config, sampling


def sampling_config(config: Any, eos_id: int | None, pad_id: int, return_hidden: bool,
                    greedy: bool = False) -> SamplingConfig:
  s = config.sampling
  sampling = SamplingConfig(max_new_tokens=int(s.max_new_tokens), temperature=float(s.temperature),
                            top_k=int(s.top_k), top_p=float(s.top_p), greedy=greedy, eos_id=eos_id, pad_id=pad_id,
                            return_hidden=return_hidden)
  sampling.validate()
  return sampling


def _split_groups(num_rows: int, group_size: int, minibatches: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Row indices of `minibatches` minibatches of whole groups, groups shuffled by `rng`."""
  groups = rng.permutation(num_rows // group_size)
  return [np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in part])
          for part in np.array_split(groups, minibatches)]


@dataclasses.dataclass
class GRPOTrainer:
  """Everything a GRPO run needs, built once by `build_grpo`; `train_step` is the loop's step function."""

  settings: GRPOSettings
  clipo_config: clipo.CLIPOConfig
  tokenizer: Any
  prompts: PromptData
  init_state: Callable[[], TrainState]
  ref_params: Any
  sample: Callable  # (params, prompt_tokens, prompt_mask, rng) -> SampleOutput, temperature sampling
  sample_greedy: Callable
  logprobs: Callable  # jitted response_logprobs(params, prompt_tokens, prompt_mask, tokens, mask)
  update: Callable  # jitted policy update on one minibatch
  loop_config: LoopConfig
  seed: int
  eval_prompts: int  # problems per held-out set in `evaluate`
  eval_sets: dict  # name -> the prompt batches holding its first `eval_prompts` problems (encoded once)
  meta: dict

  def batches(self, start: int) -> Iterator[dict]:
    return order.step_batches(lambda step, *_: self.prompts.batch(step), self.prompts.batch_size, start)

  def rollouts(self, params: Any, batch: dict, rng: jax.Array) -> dict:
    """Samples G responses per prompt and scores them: host numpy arrays `[N, ...]` plus texts."""
    g = self.settings.group_size
    tokens, mask, group_ids = repeat_prompts(batch["prompt_tokens"], batch["prompt_mask"], g)
    out = self.sample(params, jnp.asarray(tokens), jnp.asarray(mask), rng)
    response, response_mask = np.asarray(out.tokens), np.asarray(out.mask)
    texts = response_texts(self.tokenizer.decode, response, response_mask, self.tokenizer.eos_id)
    scores = verifier_rewards(texts, batch["answers"], g, math_prompts.reward)
    return {"prompt_tokens": tokens, "prompt_mask": mask, "tokens": response, "mask": response_mask,
            "old_logp": np.asarray(out.logprobs), "group_ids": group_ids, "scores": scores,
            "labels": (scores > 0).astype(np.int32), "hidden": out.hidden, "texts": texts}

  def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    settings, cfg = self.settings, self.clipo_config
    step = int(state.step)
    sample_rng, clipo_rng, update_rng = jax.random.split(state.step_rng(), 3)
    ro = self.rollouts(state.params, batch, sample_rng)
    metrics: dict[str, Any] = {"accuracy": float(ro["scores"].mean()),
                               "response_length": float(ro["mask"].sum(-1).mean()),
                               "num_tokens": float(ro["mask"].sum())}
    rewards = jnp.asarray(ro["scores"])
    aux = state.aux
    if cfg.enabled:
      reps = clipo.rollout_representation(ro["hidden"], jnp.asarray(ro["mask"]))
      head, contrastive, head_metrics = clipo.head_step(cfg, aux["clipo"], reps, jnp.asarray(ro["labels"]),
                                                        jnp.asarray(ro["group_ids"]), clipo_rng)
      aux = dict(aux, clipo=head)
      rewards = rewards + contrastive
      metrics.update({f"clipo_{k}": float(v) for k, v in head_metrics.items() if jnp.ndim(v) == 0})
    experience = {k: jnp.asarray(ro[k]) for k in ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp",
                                                  "group_ids", "labels")}
    if settings.uses_reference:
      experience["ref_logp"] = self.logprobs(self.ref_params, *(experience[k] for k in
                                                                 ("prompt_tokens", "prompt_mask", "tokens", "mask")))
      if settings.kl_in_reward:
        rewards = kl_penalized_rewards(rewards, experience["old_logp"], experience["ref_logp"], experience["mask"],
                                       settings.kl_coef, settings.kl_kind)
    experience["advantages"] = group_advantages(rewards, settings.group_size, settings.advantage)
    metrics["reward_mean"] = float(jnp.mean(rewards))

    params, opt_state = state.params, state.opt_state
    if step >= cfg.freeze_policy_steps:
      head_params = aux["clipo"].params if cfg.enabled else None
      order = np.random.default_rng([self.seed, step])
      update_metrics = []
      for epoch in range(settings.epochs):
        parts = _split_groups(len(ro["scores"]), settings.group_size, settings.minibatches, order)
        for i, rows in enumerate(parts):
          minibatch = jax.tree.map(lambda x: x[rows], experience)
          rng = jax.random.fold_in(update_rng, epoch * settings.minibatches + i)
          params, opt_state, m = self.update(params, opt_state, minibatch, head_params, rng)
          update_metrics.append(m)
      means = jax.tree.map(lambda *xs: float(np.mean(xs)), *jax.device_get(update_metrics))
      metrics.update({k: v for k, v in means.items() if k != "num_tokens"})
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, aux=aux)
    return new_state, metrics

  def evaluate(self, state: TrainState) -> dict:
    """Greedy accuracy on the first `eval_prompts` problems of each held-out set (`eval_accuracy_<name>`)."""
    results = {}
    for name, batches in self.eval_sets.items():
      scores = []
      for batch in batches:
        out = self.sample_greedy(state.params, jnp.asarray(batch["prompt_tokens"]),
                                 jnp.asarray(batch["prompt_mask"]), jax.random.PRNGKey(0))
        texts = response_texts(self.tokenizer.decode, np.asarray(out.tokens), np.asarray(out.mask),
                               self.tokenizer.eos_id)
        scores.extend(verifier_rewards(texts, batch["answers"], 1, math_prompts.reward))
      results[f"eval_accuracy_{name}"] = float(np.mean(scores[:self.eval_prompts]))
    return results


def make_policy_update(model: TransformerLM, optimizer: optax.GradientTransformation, settings: GRPOSettings,
                       clipo_config: clipo.CLIPOConfig, temperature: float) -> Callable:
  """Jitted `update(params, opt_state, minibatch, head_params, rng) -> (params, opt_state, metrics)`.

  minibatch: prompt_tokens/prompt_mask [n, P], tokens/mask/old_logp (and ref_logp) [n, T], advantages [n],
  labels/group_ids [n] (for the in-loss CLIPO term).
  """
  policy_loss = get_loss(settings.policy_loss)
  kwargs = settings.loss_kwargs()
  in_loss = clipo_config.enabled and clipo_config.in_loss_coef > 0

  def loss_fn(params: Any, mb: dict, rng: jax.Array, head_params: Any) -> tuple[jax.Array, dict]:
    logits, hidden = response_logits(model, params, mb["prompt_tokens"], mb["prompt_mask"], mb["tokens"],
                                     mb["mask"], temperature)
    logp = token_logprobs(logits, mb["tokens"], mb["mask"])
    entropy = entropy_from_logits(logits) if settings.entropy_coef > 0 else None
    loss, metrics = policy_loss(logp, mb["old_logp"], mb["advantages"], mb["mask"], ref_logp=mb.get("ref_logp"),
                                entropy=entropy, **kwargs)
    if in_loss:
      term, _ = clipo.in_loss_term(clipo_config, head_params, hidden, mb["mask"], mb["labels"], mb["group_ids"],
                                   rng)
      loss = loss + clipo_config.in_loss_coef * term
      metrics = dict(metrics, clipo_in_loss=term, loss=loss)
    return loss, dict(metrics, num_tokens=jnp.sum(mb["mask"]))

  @jax.jit
  def update(params, opt_state, minibatch, head_params, rng):
    grads, metrics = accumulate_gradients(lambda p, b, r: loss_fn(p, b, r, head_params), params, minibatch, rng)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, dict(metrics, grad_norm=optax.global_norm(grads))

  return update


def _initial_params(config: Any, model_config: ModelConfig, rng: jax.Array) -> Any:
  """The policy's starting params: the `init_from` run's latest checkpoint, or a seeded init."""
  params = init_params(model_config, rng)
  return load_run_params(config.init_from, params) if config.init_from else params


def _first_problems(prompts: PromptData, count: int) -> dict[str, list[dict]]:
  """Each held-out set's prompt batches, cut to the batches that hold its first `count` problems."""
  size = prompts.batch_size
  return {name: batches[:-(-count // size)] for name, batches in prompts.eval_sets().items()} if count else {}


def _tokenizer(config: Any, model_config: ModelConfig, workdir: str) -> Tokenizer:
  """The `init_from` run's tokenizer as it is (never retrained: the policy's embedding rows are its ids), else
  the task's tokenizer trained in (or loaded from) `workdir`."""
  if not config.init_from:
    return task_tokenizer(config.task, model_config.vocab_size, workdir, os.path.join(workdir, "tfds"))
  path = os.path.join(config.init_from, "tokenizer", "spm.model")
  if not os.path.exists(path):
    raise ConfigError(f"config.init_from={config.init_from!r}: no tokenizer/spm.model there")
  return Tokenizer.load(path)


def build_grpo(config: Any, workdir: str) -> GRPOTrainer:
  model_config, settings, clipo_config, _ = validate_grpo_config(config)
  tokenizer = _tokenizer(config, model_config, workdir)
  check_vocab(model_config, tokenizer.vocab_size)
  prompts = PromptData.create(config.task, tokenizer, batch_size=int(config.data.prompts_per_step),
                              prompt_len=int(config.data.max_prompt_len), seed=int(config.seed),
                              data_dir=os.path.join(workdir, "tfds"))
  init_rng, train_rng, head_rng = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  ref_params = _initial_params(config, model_config, init_rng)
  total_updates = max(1, config.steps * settings.epochs * settings.minibatches)
  optimizer, _ = make_optimizer(config.optim, total_updates)

  def init_state() -> TrainState:
    aux = {"clipo": clipo.init_head_state(clipo_config, model_config.d_model, head_rng)} if clipo_config.enabled \
        else None
    return TrainState.create(jax.tree.map(jnp.copy, ref_params), optimizer, train_rng, aux=aux)

  model = TransformerLM(model_config)
  prompt_len = int(config.data.max_prompt_len)

  def sampler(greedy: bool) -> Callable:
    sampling = sampling_config(config, tokenizer.eos_id, tokenizer.pad_id, return_hidden=clipo_config.enabled,
                               greedy=greedy)
    return make_sampler(model_config, sampling, prompt_len)

  temperature = float(config.sampling.temperature)
  logprobs = jax.jit(lambda params, *arrays: response_logprobs(model, params, *arrays, temperature=temperature))
  return GRPOTrainer(
      settings=settings, clipo_config=clipo_config, tokenizer=tokenizer,
      prompts=prompts, init_state=init_state, ref_params=ref_params, sample=sampler(False),
      sample_greedy=sampler(True), logprobs=logprobs,
      update=make_policy_update(model, optimizer, settings, clipo_config, temperature),
      loop_config=LoopConfig.from_config(config), seed=int(config.seed),
      eval_prompts=int(config.data.eval_prompts), eval_sets=_first_problems(prompts, int(config.data.eval_prompts)),
      meta={"config": json.loads(config.to_json_best_effort())})


def train_grpo(config: Any, workdir: str, *, trainer: GRPOTrainer | None = None,
               stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) the GRPO run in `workdir`; `trainer` reuses compiled functions across runs."""
  trainer = trainer or build_grpo(config, workdir)
  save_run_config(config, workdir)
  logging.info("GRPO: %d prompts x %d rollouts per step, %d steps in %s", config.data.prompts_per_step,
               trainer.settings.group_size, config.steps, workdir)
  return train_loop(trainer.init_state(), trainer.train_step, trainer.batches, trainer.loop_config, workdir,
                    eval_fn=trainer.evaluate if config.data.eval_prompts else None, meta=trainer.meta,
                    stop_at=stop_at)


def run_grpo(config: Any, workdir: str) -> int:
  """`jaxpt grpo`: trains, then prints a one-line summary."""
  result = train_grpo(config, workdir)
  return print_summary("grpo", result, workdir, ["reward_mean", "accuracy"] +
                       sorted(k for k in result.last_row if k.startswith("eval_accuracy")))
