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
import json
import os
from typing import Any, Callable, Iterator, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from jaxpt import parallel
from jaxpt.data import preference_batches
from jaxpt.losses import club as club_lib
from jaxpt.losses import preference as preference_losses
from jaxpt.models.config import ConfigError, ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import param_count
from jaxpt.parallel.mesh import MeshConfig
from jaxpt.train import rm_eval
from jaxpt.train.config import ConfigChecker, check_optim, check_run_fields, check_vocab
from jaxpt.train.checkpoint import load_run_params
from jaxpt.train.loop import LoopConfig, LoopResult, print_summary, save_run_config, train_loop
from jaxpt.train.optim import decay_mask, make_optimizer
from jaxpt.train.pretrain import make_checked_mesh, with_rules
from jaxpt.train.sharded import ShardedTraining, shard_training
from jaxpt.train.state import TrainState
from jaxpt.train.step import split_micro_batches

RM_LOSSES = ("bt", "dir", "odin")
BIAS_PREFIX = "bias/"


@dataclasses.dataclass(frozen=True)
class RMSettings:
  """`config.rm`: the loss and its options.

  loss: bt | dir | odin. margin, label_smoothing, center_coef: Bradley-Terry options (all losses).
  DIR: mi_weight (lambda), bias (the data's bias label a used by CLUB), club_mode (difference | concat),
  inner_steps (K), estimator_lr / estimator_weight_decay (its AdamW), estimator_hidden, bias_classes.
  ODIN: odin_corr_coef, odin_ortho_coef.
  """

  loss: str = "bt"
  margin: float = 0.0
  label_smoothing: float = 0.0
  center_coef: float = 0.0
  mi_weight: float = 0.1
  bias: str = "length"
  club_mode: str = "difference"
  inner_steps: int = 5
  estimator_lr: float = 1e-4
  estimator_weight_decay: float = 0.01
  estimator_hidden: int = 1024
  bias_classes: int = 2
  odin_corr_coef: float = 1.0
  odin_ortho_coef: float = 1.0

  @classmethod
  def from_config(cls, rm_config: Any) -> "RMSettings":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: rm_config[name] for name in names if name in rm_config})

  @property
  def num_scores(self) -> int:
    return 2 if self.loss == "odin" else 1

  def estimator_optimizer(self) -> optax.GradientTransformation:
    return club_lib.make_estimator_optimizer(self.estimator_lr, self.estimator_weight_decay)


def rm_config_defaults() -> ml_collections.ConfigDict:
  """`config.rm` with every field at its default."""
  return ml_collections.ConfigDict(dataclasses.asdict(RMSettings()))


# ---------------------------------------------------------------------------------------------------------------
# Validation


def validate_rm_config(config: Any) -> tuple[ModelConfig, RMSettings]:
  """Checks every field an RM run reads (ConfigError naming the field); returns the model config and settings.

  The loop, model and optimizer fields go through `jaxpt.train.config`'s shared checks; the preference data and
  `rm` fields are checked here (the data layer checks its own fields again when it builds).
  """
  check = ConfigChecker(config)
  for section in ("model", "data", "optim", "rm"):
    check.get(section)
  loss = check.get("rm.loss")
  if loss not in RM_LOSSES:
    check.fail("rm.loss", f"must be one of {', '.join(RM_LOSSES)}")
  unknown = sorted(set(config.rm) - {f.name for f in dataclasses.fields(RMSettings)})
  if unknown:
    raise ConfigError(f"config.rm.{unknown[0]}: unknown field")
  for name in ("margin", "center_coef", "mi_weight", "estimator_weight_decay", "odin_corr_coef", "odin_ortho_coef"):
    if name in config.rm:
      check.number(f"rm.{name}", 0.0)
  if "label_smoothing" in config.rm:
    check.number("rm.label_smoothing", 0.0, 0.5)
  for name, minimum in (("inner_steps", 1), ("estimator_hidden", 1), ("bias_classes", 2)):
    if name in config.rm:
      check.integer(f"rm.{name}", minimum)
  if "estimator_lr" in config.rm:
    check.number("rm.estimator_lr", 0.0, low_open=True)
  if config.rm.get("club_mode", "difference") not in club_lib.CLUB_INPUT_MODES:
    check.fail("rm.club_mode", f"must be one of {', '.join(club_lib.CLUB_INPUT_MODES)}")
  settings = RMSettings.from_config(config.rm)

  try:
    data = preference_batches.validate(check.get("data"))  # the data layer's own checks, naming data.<field>
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if settings.loss == "dir" and settings.bias not in data.bias_names:
    check.fail("rm.bias", f"not among the data's bias labels config.data.biases={data.biases!r}")
  init_from = config.get("init_from", "") or ""
  if init_from and not os.path.isdir(os.path.expanduser(init_from)):
    check.fail("init_from", "no such run directory (a jaxpt pretrain/sft workdir, or '' for random init)")

  model = check_run_fields(config)
  seq_len = data.seq_len
  if seq_len > model.max_seq_len:
    check.fail("data.seq_len", f"longer than config.model.max_seq_len={model.max_seq_len}")
  check_optim(config)
  MeshConfig.from_config(config)
  return model, settings


# ---------------------------------------------------------------------------------------------------------------
# The step


def flatten_batch(batch: dict) -> dict:
  """A preference batch with its nested `bias` dict flattened to `bias/<name>` keys (one level of arrays)."""
  flat = {k: v for k, v in batch.items() if k != "bias"}
  flat.update({BIAS_PREFIX + name: v for name, v in batch.get("bias", {}).items()})
  return flat


def pair_tokens(batch: dict) -> tuple[jax.Array, jax.Array]:
  """(tokens [2B, S], last index [2B]): chosen rows first, then rejected."""
  tokens = jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]], axis=0)
  last = jnp.concatenate([batch["chosen_last"], batch["rejected_last"]], axis=0)
  return tokens, last


def rm_objective(settings: RMSettings, scores: jax.Array, hidden: jax.Array, head_kernel: jax.Array, batch: dict,
                 q_params: Optional[club_lib.Params]) -> tuple[jax.Array, dict]:
  """The configured loss on one batch: scores [2B] ([2B, 2] for ODIN), hidden [2B, d], head kernel [d, n]."""
  b = batch["chosen_tokens"].shape[0]
  weights = batch["weights"]
  bt_options = dict(margin=settings.margin, label_smoothing=settings.label_smoothing,
                    center_coef=settings.center_coef, weights=weights)
  if settings.loss == "bt":
    return preference_losses.bradley_terry(scores[:b], scores[b:], **bt_options)
  if settings.loss == "dir":
    return preference_losses.dir_loss(scores[:b], scores[b:], hidden[:b], hidden[b:],
                                      batch[BIAS_PREFIX + settings.bias], q_params, settings.mi_weight,
                                      settings.club_mode, **bt_options)
  return preference_losses.odin(scores[:b, 0], scores[b:, 0], scores[:b, 1], scores[b:, 1],
                                batch["chosen_response_len"], batch["rejected_response_len"], head_kernel[:, 0],
                                head_kernel[:, 1], settings.odin_corr_coef, settings.odin_ortho_coef, **bt_options)


def init_estimator(settings: RMSettings, d_model: int, rng: jax.Array) -> Optional[dict]:
  """`TrainState.aux` for DIR: {"q_params", "q_opt_state"}; None for the other losses."""
  if settings.loss != "dir":
    return None
  q_params = club_lib.init_club_estimator(rng, club_lib.club_input_dim(d_model, settings.club_mode),
                                          settings.bias_classes, settings.estimator_hidden)
  return {"q_params": q_params, "q_opt_state": settings.estimator_optimizer().init(q_params)}


def make_rm_grad_fn(model: RewardModel, settings: RMSettings) -> Callable:
  """grad_fn(params, aux, batch, rng) -> (grads, aux, metrics) for one (micro-)batch of pairs.

  One backbone forward over [2B, S] under `jax.vjp`; the DIR estimator moves K steps on the primal hidden states
  (its update never sees the RM gradient), then the loss gradient w.r.t. (head, hidden) is pulled back through the
  stored vjp. rng: dropout key (unused when model.config.dropout_rate = 0). metrics gain `num_pairs` (sum of pair
  weights) and, for DIR, `estimator_loss_first`/`estimator_loss` (L_q before the first / last inner step) and
  `estimator_accuracy` (before the last step).
  """
  use_dropout = model.config.dropout_rate > 0
  estimator_optimizer = settings.estimator_optimizer()

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    tokens, last = pair_tokens(batch)

    def features(backbone):
      return model.apply({"params": {"backbone": backbone}}, tokens, last, not use_dropout,
                         rngs={"dropout": rng} if use_dropout else None, method=RewardModel.features)

    hidden, pullback = jax.vjp(features, params["backbone"])
    extra = {}
    q_params = None
    if settings.loss == "dir":
      b = batch["chosen_tokens"].shape[0]
      x = club_lib.club_input(hidden[:b], hidden[b:], settings.club_mode)
      q_params, q_opt_state, inner = club_lib.inner_update(
          aux["q_params"], aux["q_opt_state"], x, batch[BIAS_PREFIX + settings.bias], estimator_optimizer,
          settings.inner_steps, batch["weights"])
      aux = {"q_params": q_params, "q_opt_state": q_opt_state}
      extra = {"estimator_loss_first": inner["estimator_loss"][0], "estimator_loss": inner["estimator_loss"][-1],
               "estimator_accuracy": inner["estimator_accuracy"][-1]}

    def objective(head, h):
      scores = model.apply({"params": {"head": head}}, h, method=RewardModel.score)
      return rm_objective(settings, scores, h, head["kernel"], batch, q_params)

    (_, metrics), (head_grads, hidden_grads) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
        params["head"], hidden)
    (backbone_grads,) = pullback(hidden_grads)
    metrics = dict(metrics, **extra, num_pairs=jnp.sum(batch["weights"].astype(jnp.float32)))
    return {"backbone": backbone_grads, "head": head_grads}, aux, metrics

  return grad_fn


def make_rm_train_step(model: RewardModel, settings: RMSettings, optimizer: optax.GradientTransformation,
                       schedule: optax.Schedule, grad_accum_steps: int = 1) -> Callable:
  """train_step(state, batch) -> (state, metrics) (un-jitted); `batch` as from `flatten_batch`.

  With M = grad_accum_steps > 1 the micro-batches run in order under a scan, the estimator state carried from one
  to the next; grads and metrics are pair-weighted means (n_i = sum of micro-batch i's pair weights), `num_pairs`
  the sum. Micro-batch i uses dropout key fold_in(step_rng, i). metrics gain `grad_norm` and `lr`.
  """
  grad_fn = make_rm_grad_fn(model, settings)

  def accumulate(params, aux, batch, rng):
    if grad_accum_steps == 1:
      return grad_fn(params, aux, batch, rng)
    micro = split_micro_batches(batch, grad_accum_steps)

    def body(carry, xs):
      grad_sum, aux, metric_sum, total = carry
      index, micro_batch = xs
      grads, aux, metrics = grad_fn(params, aux, micro_batch, jax.random.fold_in(rng, index))
      n = metrics["num_pairs"]
      grad_sum = jax.tree.map(lambda acc, g: acc + n * g.astype(jnp.float32), grad_sum, grads)
      metric_sum = jax.tree.map(lambda acc, m: acc + n * m, metric_sum, metrics)
      return (grad_sum, aux, metric_sum, total + n), None

    first = jax.tree.map(lambda x: x[0], micro)
    shapes = jax.eval_shape(lambda: grad_fn(params, aux, first, rng))
    zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), tree)
    init = (zeros(shapes[0]), aux, zeros(shapes[2]), jnp.zeros((), jnp.float32))
    (grad_sum, aux, metric_sum, total), _ = jax.lax.scan(body, init, (jnp.arange(grad_accum_steps), micro))
    denom = jnp.where(total > 0, total, 1.0)
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grad_sum, params)
    metrics = {k: v / denom for k, v in metric_sum.items()}
    metrics["num_pairs"] = total
    return grads, aux, metrics

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    grads, aux, metrics = accumulate(state.params, state.aux, batch, state.step_rng())
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.global_norm(grads), lr=jnp.asarray(schedule(state.step), jnp.float32))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, aux=aux), metrics

  return train_step


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


class RMEvaluator:
  """Scores held-out pairs and computes `rm_eval.evaluate_pairs` on them (the quality head r_Q for ODIN).

  splits: {name: (batches, meta)}: flattened host preference batches (whole on every process; weight-0 rows are
  padding; `put` places each on the devices) and the data's per-pair host metadata of the real rows, in order
  (`PreferenceData.eval_meta`): its `bias/<name>` columns give the per-bias splits, its string columns (e.g.
  `sycophancy`: natural | adversarial) the groups. The first split is the main one: its scalars are `eval_*`, the
  others' `eval_<split>_*`.
  Every process must call the methods (the scoring is a jitted computation over the mesh).
  """

  def __init__(self, model: RewardModel, splits: dict[str, tuple[list[dict], dict]],
               put: Callable[[dict], dict] = lambda batch: batch, out_sharding: Any = None):
    self.meta = {split: meta for split, (_, meta) in splits.items()}
    self.device_batches = {split: [put(b) for b in batches] for split, (batches, _) in splits.items()}
    host_keys = ("weights", "chosen_response_len", "rejected_response_len")
    self.host = {split: {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in host_keys}
                 for split, (batches, _) in splits.items()}

    def score(params: Any, batch: dict) -> jax.Array:
      tokens, last = pair_tokens(batch)
      scores, _ = model.apply({"params": params}, tokens, last)
      return scores if scores.ndim == 1 else scores[:, 0]

    # Replicated scores (out_sharding) let every process of a multi-host run read them whole.
    self._score = jax.jit(score, out_shardings=out_sharding)

  @property
  def splits(self) -> list[str]:
    return list(self.meta)

  def scored(self, params: Any, split: str) -> dict[str, np.ndarray]:
    """Real pairs of `split` (weight > 0), in order: chosen/rejected scores and response lengths [N]."""
    scores = [np.asarray(jax.device_get(self._score(params, b)), np.float64) for b in self.device_batches[split]]
    chosen = np.concatenate([s[:len(s) // 2] for s in scores])
    rejected = np.concatenate([s[len(s) // 2:] for s in scores])
    host = self.host[split]
    keep = host["weights"] > 0
    return {"chosen_scores": chosen[keep], "rejected_scores": rejected[keep],
            "chosen_response_len": host["chosen_response_len"][keep],
            "rejected_response_len": host["rejected_response_len"][keep]}

  def results(self, state: TrainState, split: str) -> tuple[dict, dict[str, np.ndarray]]:
    s = self.scored(state.params, split)
    meta = self.meta[split] or {}
    bias = {k[len(BIAS_PREFIX):]: v for k, v in meta.items() if k.startswith(BIAS_PREFIX)}
    groups = {k: v for k, v in meta.items() if np.asarray(v).dtype.kind in "US"}
    for name, column in {**bias, **groups}.items():
      if len(column) != len(s["chosen_scores"]):
        raise ValueError(f"eval meta column {name!r} of split {split!r} has {len(column)} rows, the batches "
                         f"{len(s['chosen_scores'])} real pairs")
    results = rm_eval.evaluate_pairs(s["chosen_scores"], s["rejected_scores"], s["chosen_response_len"],
                                     s["rejected_response_len"], bias, groups)
    return results, s

  def __call__(self, state: TrainState) -> dict:
    metrics = {}
    for index, split in enumerate(self.splits):
      prefix = "eval_" if index == 0 else f"eval_{split}_"
      metrics.update(rm_eval.scalar_metrics(self.results(state, split)[0], prefix))
    return metrics

  def write_report(self, state: TrainState, workdir: str, title: str, write: bool = True) -> None:
    """rm_eval.json / .md / score_vs_length.png for the main split into `workdir`, the others into
    `workdir/eval_<split>/` (files written only where `write`, e.g. on process 0)."""
    for index, split in enumerate(self.splits):
      results, s = self.results(state, split)
      if not write:
        continue
      directory = workdir if index == 0 else os.path.join(workdir, f"eval_{split}")
      rm_eval.write_report(directory, dict(results, split=split), s["chosen_scores"], s["rejected_scores"],
                           s["chosen_response_len"], s["rejected_response_len"], f"{title}, {split}")


# ---------------------------------------------------------------------------------------------------------------
# Build and run


@dataclasses.dataclass
class RewardTraining:
  """Everything `train_loop` needs for an RM run, built once (the step compiled for the mesh)."""

  model_config: ModelConfig
  settings: RMSettings
  model: RewardModel
  data: Any  # jaxpt.data.preference.PreferenceData
  init_state: Callable[[], TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  batches: Callable[[int], Iterator[dict]]
  evaluator: RMEvaluator  # every eval split of the data ('test' first)
  evaluate: Callable[[TrainState], dict]  # the evaluator under the mesh's activation rules
  loop_config: LoopConfig
  meta: dict
  sharded: ShardedTraining

  @property
  def memory(self) -> dict:
    return self.sharded.memory


def build_rm(config: Any, workdir: str) -> RewardTraining:
  """Validates `config`, then builds preference data, RewardModel, optimizer, the compiled step and evaluator.

  Keys: split(PRNGKey(config.seed)) -> (init, train); init -> (model, estimator). `config.init_from` (a jaxpt
  pretrain/SFT workdir) replaces the backbone params of the initial state with that run's latest params.
  """
  model_config, settings = validate_rm_config(config)
  mesh_config = parallel.MeshConfig.from_config(config)
  mesh = make_checked_mesh(config)  # before any data work
  batch_size = int(config.data.batch_size)
  try:
    data = preference_batches.PreferenceData.create(config.data, vocab_size=model_config.vocab_size, workdir=workdir,
                                                    seed=config.seed)
  except ValueError as e:
    raise ConfigError(str(e) if str(e).startswith("config.") else f"config.{e}") from e
  check_vocab(model_config, data.tokenizer.vocab_size)
  rules = mesh_config.logical_rules
  model = RewardModel(model_config, settings.num_scores)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  model_rng, estimator_rng = jax.random.split(init_rng)
  dummy = (jnp.zeros((1, config.data.seq_len), jnp.int32), jnp.zeros((1,), jnp.int32))
  boxed = jax.eval_shape(model.init, model_rng, *dummy)["params"]
  parallel.check_param_divisibility(boxed, mesh, rules, mesh_config.rules)
  optimizer, schedule = make_optimizer(config.optim, config.steps, mask=decay_mask(boxed))

  def init_fn() -> TrainState:
    params = nn.meta.unbox(model.init(model_rng, *dummy)["params"])
    aux = init_estimator(settings, model_config.d_model, estimator_rng)
    return TrainState.create(params, optimizer, train_rng, aux=aux)

  step_fn = make_rm_train_step(model, settings, optimizer, schedule, config.optim.grad_accum_steps)
  batch_sh = parallel.batch_sharding(mesh, rules)
  data_index, data_count = parallel.process_batch_slice(batch_sh, batch_size)
  sample = flatten_batch(data.train_batch(0, data_index, data_count))
  batch_shapes = {k: jax.ShapeDtypeStruct((batch_size,) + np.shape(v)[1:], np.asarray(v).dtype)
                  for k, v in sample.items()}
  sharded = shard_training(init_fn, step_fn, boxed, optimizer, mesh, rules, batch_shapes,
                           donate=jax.default_backend() != "cpu")
  init_from = config.get("init_from", "") or ""

  def init_state() -> TrainState:
    state = sharded.init_state()
    if init_from:
      backbone = load_run_params(init_from, state.params["backbone"])
      state = state.replace(params={**state.params, "backbone": backbone})
    return state

  names = ["test"] + [split for split in data.eval_splits if split != "test"]
  evaluator = RMEvaluator(model, {split: ([flatten_batch(b) for b in data.eval_batches(split)], data.eval_meta(split))
                                  for split in names},
                          put=lambda b: parallel.full_batch(b, batch_sh), out_sharding=parallel.replicated(mesh))

  def batches(start: int) -> Iterator[dict]:
    local = (flatten_batch(b) for b in data.train_batches(start, data_index, data_count))
    return parallel.global_batches(local, batch_sh, batch_size)

  return RewardTraining(
      model_config=model_config, settings=settings, model=model, data=data, init_state=init_state,
      train_step=sharded.train_step, batches=batches, evaluator=evaluator,
      evaluate=with_rules(evaluator, mesh, rules),
      loop_config=LoopConfig.from_config(config), meta={"config": json.loads(config.to_json_best_effort())},
      sharded=sharded)


def train_rm(config: Any, workdir: str, *, setup: Optional[RewardTraining] = None,
             stop_at: Optional[int] = None) -> LoopResult:
  """Trains (or resumes) the RM run in `workdir`. At the end (not on preemption) writes rm_eval.json, rm_eval.md
  and score_vs_length.png there (other eval splits in eval_<split>/). `setup` reuses compiled functions."""
  setup = setup or build_rm(config, workdir)
  save_run_config(config, workdir)
  state = setup.init_state()
  logging.info("reward model (%s): %.2fM params; training %d steps in %s", setup.settings.loss,
               param_count(state.params) / 1e6, config.steps, workdir)
  parallel.log_memory("rm_train_step", setup.memory)
  result = train_loop(state, setup.train_step, setup.batches, setup.loop_config, workdir, eval_fn=setup.evaluate,
                      meta=setup.meta, stop_at=stop_at)
  finished = not result.preempted and int(jax.device_get(result.state.step)) == config.steps
  if finished:
    with parallel.activation_sharding(setup.sharded.mesh, setup.sharded.rules):
      setup.evaluator.write_report(result.state, workdir, f"reward model ({setup.settings.loss})",
                                   write=jax.process_index() == 0)
  return result


def run_rm(config: Any, workdir: str) -> int:
  """`jaxpt rm`: builds, trains, prints one summary line; returns the exit code."""
  validate_rm_config(config)
  setup = build_rm(config, workdir)
  print(f"jaxpt rm: loss {setup.settings.loss}, {jax.device_count()} devices; compiled train step peak memory per "
        f"device {setup.memory.get('peak_mib', float('nan')):.1f} MiB", flush=True)
  return print_summary("rm", train_rm(config, workdir, setup=setup), workdir,
                       ("loss", "accuracy", "eval_accuracy", "eval_pearson_score_length", "eval_spearman_score_length"))
