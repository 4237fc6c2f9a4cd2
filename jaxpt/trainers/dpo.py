"""DPO (Rafailov et al. 2023) and DPO+DIR on the shared loop: preference data -> TransformerLM policy -> trained policy.

One step on a batch of B pairs (`data` as for reward models, `jaxpt.data.preference_batches`):

    tokens = [chosen; rejected] [2B, S]: prompt + response + EOS, right-padded; last = index of the EOS
    m[r, t] = 1 for t in [max(last_r - len_r, 1), last_r]: the response tokens and the EOS (prompt and padding masked)
    logp[r] = sum_t m[r, t] log softmax(logits[r, t - 1])[tokens[r, t]]                 ONE policy forward over [2B, S]
    ref[r]  = the same under the reference policy (frozen; a separate forward, fed to the step as batch columns)
    z       = beta [(logp_c - ref_c) - (logp_r - ref_r)]
    L       = mean_i -(1 - eps) log sigmoid(z_i) - eps log sigmoid(-z_i)                 (`losses.preference.dpo`)
  DIR (`dpo.dir`): h = the policy's final-norm hidden state at each row's last token (the EOS) [2B, d], as the
  official DPO+DIR code takes `hidden_states[-1]` at the sequence end; a = the data's bias label (`dpo.bias`,
  default length: 1[len_c > len_r]). At loop steps t > mi_warmup_steps (0-based, the official `global_step > 80`)
  the estimator moves K steps on X = club_input(sg(h_c), sg(h_r)) (`jaxpt.trainers.dir_estimator`) and
    L += lambda I_club(X, a)  (psi held constant); before that neither the term nor the estimator moves.

The reference policy is the initial policy: `init_from`'s params (or the seeded init), copied when the state is
created; it is in no optimizer, never trained, never checkpointed, and rebuilt the same way on resume (as GRPO's).
With LoRA it is the base with the adapters off (no copy; fresh adapters start at B = 0, so that is the initial
policy); with `lora.init_adapter` (adapters started from PEFT's, e.g. an SFT adapter) it is that start, the base plus
those adapters (`Training.initial_policy`: kept once, a few MB), not the base alone (TRL's default with a PEFT model,
which its `ref_adapter_name` changes).
The estimator lives in `TrainState.aux`; a resumed run continues bit for bit. Eval (every eval split, 'test'
first): the implicit reward r = beta (logp - ref) of every response through `rm_eval.evaluate_pairs`: accuracy
(r_c > r_r, i.e. z > 0), accuracy split by which side is longer, corr(r, length) over responses and
corr(z, len_c - len_r) over pairs; the report (rm_eval.json / .md, score_vs_length.png) is written at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt import parallel
from jaxpt.config import Section, at_least, from_section, in_range, inline
from jaxpt.data import preference_batches
from jaxpt.data.preference_batches import PreferenceDataConfig
from jaxpt.losses import get_loss
from jaxpt.models.transformer import TransformerLM
from jaxpt.progress import say
from jaxpt.rl.logprobs import token_logprobs
from jaxpt.trainers import dir_estimator
from jaxpt.engine.builder import Training, batch_shapes, build_training, training_mesh
from jaxpt.engine.config import RunConfig, check_vocab
from jaxpt.trainers.dir_estimator import DIRSettings
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.trainers.pairs import (BIAS_PREFIX, PairEvaluator, check_bias_label, eval_splits, flatten_batch, pair_tokens,
                               PairReport)
from jaxpt.engine.record import check_launch, resumes, run_inputs
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import GradFn

__all__ = ["DPOConfig", "DPORunConfig", "ReferenceHooks", "build", "build_reference_run", "make_dpo_grad_fn",
           "pair_logps", "reference_logps", "reference_model_of", "response_mask", "sequence_logps"]

REFERENCE_KEYS = ("ref_chosen_logps", "ref_rejected_logps")  # [B] float32 batch columns the step reads


@dataclasses.dataclass(frozen=True)
class DPOConfig(Section):
  """The `dpo` section: the DPO objective and the optional DIR term (its settings as for `rm.loss = dir`).

  Attributes:
    beta: beta > 0, the strength of the implicit KL to the reference: z = beta [(pi_c - ref_c) - (pi_r - ref_r)].
    label_smoothing: eps in [0, 0.5] (conservative DPO): -(1 - eps) log sigmoid(z) - eps log sigmoid(-z).
    dir: add the DIR term lambda * I_club(X, a) on the policy's last-token hidden states (DPO+DIR).
    mi_warmup_steps: DIR: the term and the estimator's updates are on at loop steps > mi_warmup_steps (0-based step
      index; the official DPO+DIR code: 80).
    dir_settings: the DIR term's options (`jaxpt.trainers.dir_estimator.DIRSettings`), held inline: their fields are
      the section's own (`dpo.mi_weight`, `dpo.bias`, ...); mi_weight defaults to 1.0 here.
  """

  beta: float = 0.1
  label_smoothing: float = 0.0
  dir: bool = False
  mi_warmup_steps: int = 80
  # mi_weight 1: the official DPO+DIR code's default (debias_factor 1; on W GPUs that is 1 / W here)
  dir_settings: DIRSettings = inline(DIRSettings(mi_weight=1.0))

  def check(self) -> None:
    in_range(self, "beta", 0.0, low_open=True)
    in_range(self, "label_smoothing", 0.0, 0.5)
    at_least(self, "mi_warmup_steps", 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPORunConfig(RunConfig):
  """A DPO run: `RunConfig` plus these sections; `init_from` ('' = random init, an LM run's workdir, or 'hf:DIR';
  the run then uses its tokenizer) is both the starting policy and the frozen reference.

  Attributes:
    data: the preference pairs and their batching (as for `jaxpt rm`).
    dpo: the DPO objective and the optional DIR term.
  """

  data: PreferenceDataConfig = PreferenceDataConfig()
  dpo: DPOConfig = DPOConfig()

  def check(self) -> None:
    super().check()
    if self.dpo.dir:
      check_bias_label("dpo", self.dpo.dir_settings, self.data)
    self.check_seq_len(self.data.seq_len, "data.seq_len")
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")


# ---------------------------------------------------------------------------------------------------------------
# Sequence log-probs and the step


def response_mask(shape: tuple[int, int], last: jax.Array, response_len: jax.Array) -> jax.Array:
  """float32 [R, S]: 1 at the response tokens and the EOS of each row, t in [max(last - len, 1), last]."""
  t = jnp.arange(shape[1], dtype=jnp.int32)[None, :]
  first = jnp.maximum(jnp.asarray(last, jnp.int32) - jnp.asarray(response_len, jnp.int32), 1)[:, None]
  return ((t >= first) & (t <= jnp.asarray(last, jnp.int32)[:, None])).astype(jnp.float32)


def sequence_logps(model: TransformerLM, params: Any, tokens: jax.Array, last: jax.Array, response_len: jax.Array,
                   rng: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
  """(logp float32 [R], h float32 [R, d]) of rows tokens [R, S]: the response log-prob (module docstring) and the
  final-norm hidden state at index `last`. rng: a dropout key (None = deterministic)."""
  logits, hidden = model.apply({"params": params}, tokens, deterministic=rng is None, return_hidden=True,
                               rngs=None if rng is None else {"dropout": rng})
  mask = response_mask(tokens.shape, last, response_len)
  logp = jnp.sum(token_logprobs(logits[:, :-1], tokens[:, 1:], mask[:, 1:]), axis=-1)
  h = jnp.take_along_axis(hidden, jnp.asarray(last, jnp.int32)[:, None, None], axis=1)[:, 0]
  return logp, h.astype(jnp.float32)


def pair_logps(model: TransformerLM, params: Any, batch: dict,
               rng: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
  """`sequence_logps` of a preference batch's [chosen; rejected] rows: (logp [2B], h [2B, d])."""
  tokens, last = pair_tokens(batch)
  lengths = jnp.concatenate([batch["chosen_response_len"], batch["rejected_response_len"]], axis=0)
  return sequence_logps(model, params, tokens, last, lengths, rng)


def reference_logps(model: TransformerLM, ref_params: Any, batch: dict) -> dict:
  """The batch columns of the frozen reference: {"ref_chosen_logps", "ref_rejected_logps"} float32 [B]."""
  logp, _ = pair_logps(model, jax.lax.stop_gradient(ref_params), batch)
  b = batch["chosen_tokens"].shape[0]
  return dict(zip(REFERENCE_KEYS, (logp[:b], logp[b:])))


def make_dpo_grad_fn(model: TransformerLM, settings: DPOConfig) -> GradFn:
  """grad_fn(params, aux, batch, rng) -> (grads, aux, metrics) for one (micro-)batch of pairs.

  batch: a flattened preference batch plus `step` int32 [B] (the loop step, every row) and the REFERENCE_KEYS
  columns. One policy forward over [2B, S] under `jax.vjp`; with DIR the estimator moves K steps on the primal
  hidden states when step > mi_warmup_steps (else aux is kept), then the loss gradient w.r.t. (logp, h) is pulled
  back. metrics: those of the `dpo` loss, `num_pairs` (sum of pair weights) and, with DIR,
  `estimator_loss_first` / `estimator_loss` / `estimator_accuracy` (of the K inner steps, also while they are not
  applied).
  """
  dpo_loss = get_loss("preference", "dpo")
  use_dropout = model.config.dropout_rate > 0

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    b = batch["chosen_tokens"].shape[0]

    def forward(p):
      logp, hidden = pair_logps(model, p, batch, rng if use_dropout else None)
      return (logp, hidden) if settings.dir else (logp,)

    outputs, pullback = jax.vjp(forward, params)
    extra, dir_kwargs = {}, {}
    if settings.dir:
      hidden, labels, step = outputs[1], batch[BIAS_PREFIX + settings.bias], jnp.max(batch["step"])
      updated, extra = dir_estimator.estimator_update(settings.dir_settings, aux, hidden[:b], hidden[b:], labels,
                                                      batch["weights"])
      aux = jax.tree.map(lambda new, old: jnp.where(step > settings.mi_warmup_steps, new, old), updated, aux)
      dir_kwargs = dict(q_params=aux["q_params"], bias_labels=labels, step=step,
                        warmup_steps=settings.mi_warmup_steps, mi_weight=settings.mi_weight,
                        mode=settings.club_mode)

    def objective(logp, hidden=None):
      kwargs = dir_kwargs if hidden is None else dict(dir_kwargs, hidden_chosen=hidden[:b], hidden_rejected=hidden[b:])
      return dpo_loss(logp[:b], logp[b:], batch["ref_chosen_logps"], batch["ref_rejected_logps"], settings.beta,
                      settings.label_smoothing, batch["weights"], **kwargs)

    (_, metrics), cotangents = jax.value_and_grad(objective, argnums=tuple(range(len(outputs))), has_aux=True)(
        *outputs)
    (grads,) = pullback(cotangents)
    metrics = dict(metrics, **extra, num_pairs=jnp.sum(batch["weights"].astype(jnp.float32)))
    return grads, aux, metrics

  return grad_fn


# ---------------------------------------------------------------------------------------------------------------
# Build and run


@dataclasses.dataclass
class ReferenceHooks(PairReport):
  """The loop hooks of a run over a frozen reference policy (DPO, KTO): each step's batch gets the reference's
  columns (`reference`, jitted and laid out like the batch: its log-probs) before the shared step; the reference
  params are the initial policy's, copied by `init_state` (or made on first need by `reference_params`: `jaxpt
  eval`), never checkpointed. With LoRA the reference is the policy's own frozen base, adapters off (no copy), or with
  `lora.init_adapter` that base plus those adapters (`reference_model` runs either)."""

  reference: Callable[[Any, dict], dict]  # reference_logps(ref_params, batch)
  ref_params: Any = None

  def init_state(self, training: Training) -> TrainState:
    """The initial state (params from `init_from`, or the seeded init); its params, copied, are the reference
    (with LoRA: nothing is copied)."""
    state = training.init_state()
    if not training.lora:
      self.ref_params = jax.tree.map(jnp.copy, state.params)  # the state is donated to the step on accelerators
    return state

  def reference_params(self, params: Any = None) -> Any:
    """The reference of the policy `params`: with LoRA their base (the same arrays; with `lora.init_adapter`, beside
    its adapters: `Training.initial_policy`), else the initial params."""
    if self.training.lora:
      lora = self.training.config.lora
      return self.training.initial_policy(params) if lora.init_adapter else self.training.base_params(params)
    if self.ref_params is None:
      self.ref_params = self.training.init_state().params
    return self.ref_params

  def train_step(self, training: Training, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    return training.train_step(state, {**batch, **self.reference(self.reference_params(state.params), batch)})


def build(config: DPORunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds the DPO run (`build_reference_run`)."""
  config = from_section(DPORunConfig, config, "config")
  settings = config.dpo
  model = TransformerLM(config.model, lora=config.lora.spec())
  reference_model = reference_model_of(config)

  def init_aux(rng: jax.Array) -> Optional[dict]:  # always given: the policy's init key is the same with or without DIR
    return dir_estimator.init_estimator(settings.dir_settings, config.model.d_model, rng) if settings.dir else None

  name = f"DPO{'+DIR' if settings.dir else ''}"
  return build_reference_run("dpo", config, workdir, model, make_dpo_grad_fn(model, settings), settings.beta,
                             lambda p, batch: reference_logps(reference_model, p, batch), REFERENCE_KEYS,
                             f"{name} implicit reward", init_aux=init_aux,
                             title=f"dpo{' + DIR' if settings.dir else ''}")


def reference_model_of(config: RunConfig) -> TransformerLM:
  """The model the frozen reference of `ReferenceHooks.reference_params` runs on: the base (QLoRA: quantized) or,
  with `lora.init_adapter`, the adapted policy's model."""
  lora = config.lora.spec() if config.lora.init_adapter else config.lora.base_spec()
  return TransformerLM(config.model, lora=lora)


def build_reference_run(trainer: str, config: RunConfig, workdir: str, model: TransformerLM, grad_fn: GradFn,
                        beta: float, reference: Callable[[Any, dict], dict], reference_keys: tuple[str, ...],
                        report_title: str, *, columns: Callable[[Any], Callable[[dict], dict]] = lambda data: dict,
                        init_aux: Callable[[jax.Array], Any] | None = None, title: str = "") -> BuiltRun:
  """The run of a preference trainer over a frozen reference policy (DPO, KTO), for a checked run `config` with a
  `data` section of preference pairs: the mesh, the launch check, the pairs (tokenized with the `init_from` run's
  tokenizer, else one trained on the pairs), the compiled step of `grad_fn` on the flattened pair batches plus
  `step` [B] and `columns(data)(batch)`'s host columns, the jitted `reference(ref_params, batch)` -> the
  `reference_keys` columns (float32 [B] each) added before each step (`ReferenceHooks`), and the evaluator of the
  implicit reward beta (logp - ref) on every eval split (the report titled `report_title` at the end)."""
  batch_size = config.data.batch_size
  mesh = training_mesh(config, batch_size)  # before any data work
  check_launch(workdir, config)
  say(f"preparing preference data in {workdir} ...")
  tokenizer = init_tokenizer(config.init_from, workdir, resumes(workdir), config.model)
  data = preference_batches.PreferenceData.create(config.data, vocab_size=config.model.vocab_size, workdir=workdir,
                                                  seed=config.seed, tokenizer=tokenizer,
                                                  keep_tokenizer=resumes(workdir))
  check_vocab(config.model, data.tokenizer.vocab_size)
  add_columns = columns(data)

  def train_batch(step: int, index: int, count: int) -> dict:
    batch = flatten_batch(data.train_batch(step, index, count))
    return add_columns(dict(batch, step=np.full(len(batch["weights"]), step, np.int32)))

  sample = train_batch(0, 0, 1)
  shapes = batch_shapes(dict(sample, **{k: np.zeros(len(sample["weights"]), np.float32) for k in reference_keys}),
                        batch_size)
  say("compiling the train step ...")
  training = build_training(config, mesh, model, (jnp.zeros((1, config.data.seq_len), jnp.int32),), shapes,
                            grad_fn=grad_fn, weight_key="num_pairs", init_aux=init_aux)
  rules, batch_sharding = training.sharded.rules, training.sharded.batch_sharding
  reference = jax.jit(parallel.with_activation_sharding(reference, mesh, rules),
                      out_shardings={k: batch_sharding for k in reference_keys})

  reference_model = reference_model_of(config)  # with LoRA: the base, or the adapted model (lora.init_adapter)

  def implicit_rewards(params: Any, ref_params: Any, batch: dict) -> jax.Array:
    """r = beta (logp - ref) [2B] of the batch's [chosen; rejected] rows."""
    return beta * (pair_logps(model, params, batch)[0] - pair_logps(reference_model, ref_params, batch)[0])

  score = jax.jit(implicit_rewards, out_shardings=parallel.replicated(mesh))
  evaluator = PairEvaluator(lambda params, batch: score(params, hooks.reference_params(params), batch),
                            eval_splits(data), put=training.put)
  hooks = ReferenceHooks(training, evaluator, report_title, reference)
  return BuiltRun(trainer, config, training, training.batches(train_batch, batch_size),
                  inputs=run_inputs(data.corpus_id, data.tokenizer), tokenizer=data.tokenizer, data=data,
                  evaluate=training.under_rules(evaluator), hooks=hooks, title=title)
