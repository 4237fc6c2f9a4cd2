"""`jaxpt plan`: the per-device memory of a run's training step (and rollout sampler) before any run, from its
config alone.

    plan_memory("sft", config, devices=1, device_gib=16) -> {"per_device_gib": {...}, "fits": ..., "advice": [...]}

The analytic account (`account`), per device, with P the params each device holds under the run's sharding rules
(`config.mesh`, `jaxpt.parallel.rules`; the mesh sizes resolved for `devices`), T the trainable part of them (LoRA:
the adapters, `jaxpt.engine.builder.lora_trainable`), b the micro-batch's rows on one device
(rows / grad_accum_steps / (data x fsdp)), S the step's sequence length, c the compute dtype's bytes:

    params       P in param_dtype (LoRA: the frozen base in lora.base_dtype, the adapters in param_dtype; QLoRA:
                 the adapted kernels as stored, codes (1 byte, nf4 1/2) + float32 scales (4 / base_quant_block))
    grads        T in param_dtype, the gradient (with grad_accum_steps > 1: a micro-batch's, then their average);
                 the optimizer update needs nothing beside it: AdamW's moment and param writes (the clip a scalar
                 factor, `jaxpt.engine.optim.clip_by_global_norm`) fuse and overwrite the donated state in place
    block_grads  with scanned layers (model.scan_layers), T / L in param_dtype: one block's gradient, which the
                 backward's layer scan holds beside the stacked gradient it writes it into (XLA:CPU's compiled
                 temporaries at L = 2 and 4 layers: T + T / L + the activations, within 4%)
    accumulator  with grad_accum_steps > 1, T in float32: the sum the micro-batches' gradients are added into
                 (alive through the backward passes; the update reads the average, the sum's buffer freed)
    optimizer    AdamW's two moments: 2 T in param_dtype (optax keeps them in the params' dtype)
    reference    a frozen copy of the policy (DPO / KTO, GRPO with kl_coef > 0, PPO with a KL; not with LoRA, whose
                 reference is the base, adapters off, or with lora.init_adapter the base beside the start's adapters:
                 no copy; not counted: GRPO's / PPO's transient merged copy of that start under merged rollouts
                 while the reference log-probs run): P in param_dtype
    activations  what the backward pass keeps of the L blocks (PPO: of one model, its critic's backward done before
                 the policy's forward, `jaxpt.trainers.ppo.sequenced_grad_fn`), per layer and token (`_layer_bytes`):
                 remat none: every block intermediate (norms, q/k/v, attention out, the MLP's hidden, the attention
                 probabilities b H S (S + chunk) / 2 in float32); remat dots: the matmul outputs; remat full: the block
                 input (x streams); plus one block's intermediates recomputed in the backward; LoRA: + one block's
                 frozen weights (read out of the stacked params in the backward)
    logits       [b, S, vocab / tensor] in float32, once (their gradient, softmax - onehot fused, is written over
                 them); a reward model's scores are negligible
    kv_cache     GRPO / PPO's sampler: 2 L rows (prompt + new tokens) kv_heads head_dim c, rows split over data x
                 fsdp, heads over tensor
    sampler_params  with LoRA rollouts on merged params (`lora.rollouts`), the merged policy W + s A B the sampler
                 reads (the base's size in lora.base_dtype; QLoRA with lora.rollouts=merged: dequantized); 0 when
                 the rollouts read the params as stored (QLoRA's default: the codes and unmerged adapters)
    total        params + optimizer + reference (alive all run) + the larger of two phases: the step's backward
                 (grads + block_grads + accumulator + activations + logits) or the rollouts' kv_cache +
                 sampler_params; `fits` when total <= device_gib (1 - HEADROOM).
                 `step_total`: the same without the rollouts' phase (the train step alone)

Beside it, `compiled` (only with compile=True; every planned trainer: `step_training` builds its step without
data, as the trainer builds it; PPO's is the policy + critic update): XLA's memory analysis of the trainer's real
train step (`jaxpt.engine.builder.build_training`, compiled for the mesh from abstract shapes: no params are
allocated; the reference log-probs of DPO, KTO, GRPO and PPO are batch columns, computed outside the step, so its
peak + reference is the account's step phase), with the analytic terms it should match: argument ~ params +
optimizer (+ the batch), temp ~ `step_transient` (the backward phase).
The step is compiled donating the state, as an accelerator run does (the new state is written over the old:
`alias` = `output`), also on CPU, where a run does not donate it. `benchmarks/plan_tables.py` compares the account
with this analysis and with the measured peak of the same step on the CPU (d256 and d512 models, SFT / DPO / GRPO,
full and LoRA: plan / measured 1.00 to 1.06; SFT and GRPO also with grad_accum_steps 4: 0.97 to 1.02);
`benchmarks/results_plan_tables.json` holds the figures.

`hf:DIR` starts are read from DIR/config.json alone (no weights are opened): the model's architecture fields are
filled as a run fills them (`jaxpt.engine.config.RunConfig.prepare_values`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.config import ConfigError, DataError, from_section, section_values
from jaxpt.models import hf, hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.parallel.mesh import resolve_mesh_shape
from jaxpt.parallel.rules import DATA_AXES
from jaxpt.rl.engine import own_pages
from jaxpt.engine.builder import lora_trainable
from jaxpt.nn import lora as lora_lib
from jaxpt.engine.config import RunConfig, check_hf_model, config_json
from jaxpt.engine.trainers import TRAINERS

__all__ = ["HEADROOM", "PLANNED", "Workload", "account", "advice", "compiled_account", "plan_memory",
           "rollout_capacity", "run_config", "step_shapes", "step_total", "step_training", "step_transient", "workload"]

GIB = 2 ** 30
HEADROOM = 0.10  # of device memory left for XLA's workspace, fragmentation and the runtime
PLANNED = ("pretrain", "sft", "dpo", "kto", "rm", "grpo", "ppo")  # the language-model trainers `jaxpt plan` reads
LOGIT_COPIES = 1  # float32 logits; XLA writes their gradient (softmax - onehot, fused) over them


@dataclasses.dataclass(frozen=True)
class Workload:
  """What one optimizer update of a trainer processes (global sizes).

  Attributes:
    rows: sequences per update; micro_rows: per micro-batch (rows / grad_accum_steps); seq: their length.
    vocab_logits: the step computes [rows, seq, vocab] logits (False: a reward model's scores).
    reference: the trainer keeps a frozen copy of the policy's params.
    models: trained models of this size (2: PPO's policy and critic).
    sampler_rows, sampler_len: the rollout sampler's rows and KV-cache positions (0: no sampler).
  """

  rows: int
  micro_rows: int
  seq: int
  vocab_logits: bool = True
  reference: bool = False
  models: int = 1
  sampler_rows: int = 0
  sampler_len: int = 0


def run_config(trainer: str, config: Any) -> RunConfig:
  """The trainer's checked run config of `config` (ConfigDict or dict); an `hf:DIR` start is read from
  DIR/config.json alone (no weight files are needed). ConfigError naming the field otherwise."""
  if trainer not in PLANNED:
    raise ConfigError("trainer", f"jaxpt plan reads the language-model trainers ({', '.join(PLANNED)})", trainer)
  config_type = TRAINERS.get(trainer).config_type
  values = section_values(config)
  init_from = values.get("init_from") or ""
  if not (isinstance(init_from, str) and init_from.startswith(hf.HF_PREFIX)):
    return from_section(config_type, values, "config")
  directory = os.path.expanduser(init_from[len(hf.HF_PREFIX):])
  try:
    fields, _ = hf_config.checkpoint_fields(directory)
  except DataError as e:
    raise ConfigError("config.init_from", str(e), init_from) from None
  given = section_values(values.get("model"))
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  model = {**given, **{k: v for k, v in fields.items() if given.get(k, defaults[k]) == defaults[k]}}
  run = from_section(config_type, {**values, "model": model, "init_from": ""}, "config")
  check_hf_model(init_from, run.model)
  return run


def workload(trainer: str, run: Any) -> Workload:
  """The sizes one update of `trainer` processes under run config `run` (module docstring)."""
  accum = run.optim.grad_accum_steps
  if trainer in ("pretrain", "sft"):
    rows, seq = run.data.batch_size, run.data.seq_len
    return Workload(rows, rows // accum, seq)
  if trainer in ("dpo", "kto", "rm"):  # chosen + rejected (KTO: the examples and their mismatched KL rows)
    rows, seq = 2 * run.data.batch_size, run.data.seq_len
    return Workload(rows, rows // accum, seq, vocab_logits=trainer != "rm",
                    reference=trainer != "rm" and not run.lora.enabled)
  settings = run.grpo if trainer == "grpo" else run.ppo
  rollouts = run.data.prompts_per_step * settings.group_size
  seq = run.data.max_prompt_len + run.sampling.max_new_tokens
  rows = rollouts // settings.minibatches
  kl = getattr(settings, "kl_coef", 0.0) > 0
  return Workload(rows, rows // accum, seq, reference=kl and not run.lora.enabled,
                  models=2 if trainer == "ppo" else 1, sampler_rows=rollouts, sampler_len=seq)


def _mesh_shape(run: RunConfig, devices: int) -> dict[str, int]:
  return resolve_mesh_shape(run.mesh, devices)


def _shard_elements(shape: tuple[int, ...], names: tuple, rules: Any, mesh_shape: dict[str, int]) -> int:
  """Elements one device holds of an array of `shape` with logical axis `names` under `rules` (uneven splits
  rounded up, as XLA pads them)."""
  spec = nn.logical_to_mesh_axes(names, rules)
  count = 1
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    count *= -(-dim // math.prod(mesh_shape[a] for a in axes))
  return count


def param_bytes(run: RunConfig, mesh_shape: dict[str, int]) -> dict[str, float]:
  """Per-device bytes of the params (`params`, as the run keeps them), of the trainable ones in their dtype
  (`trainable`) and in float32 (`trainable_f32`), and of the whole policy in param_dtype (`full`); from the model's
  abstract init (nothing allocated; one per model, LoRA, rules and mesh: `advice` asks for many)."""
  return dict(_param_bytes(run.model, run.lora, run.mesh.logical_rules, tuple(sorted(mesh_shape.items()))))


@functools.lru_cache(maxsize=256)
def _param_bytes(model_config: ModelConfig, lora: Any, rules: Any, mesh_items: tuple) -> dict[str, float]:
  mesh_shape = dict(mesh_items)
  model = TransformerLM(model_config, lora=lora.spec())
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))["params"]
  trainable = lora_trainable(boxed) if lora.enabled else jax.tree.map(
      lambda _: True, boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  base = jnp.dtype(lora.base_dtype) if lora.enabled else None
  quant = lora.quant if lora.enabled else None
  out = dict(params=0.0, trainable=0.0, trainable_f32=0.0, full=0.0, frozen_float=0.0)
  leaves = jax.tree.leaves_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  for (path, leaf), train in zip(leaves, jax.tree.leaves(trainable)):
    value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
    names = leaf.names if isinstance(leaf, nn.Partitioned) else (None,) * value.ndim
    elements = _shard_elements(value.shape, names, rules, mesh_shape)
    size = jnp.dtype(value.dtype).itemsize
    name = getattr(path[-1], "key", None)
    if name in lora_lib.QUANT_NAMES:  # QLoRA: codes and float32 scales as stored; the float kernel they stand for
      out["params"] += elements * size
      out["frozen_float"] += elements * quant.pack * base.itemsize if name == "kernel_q" else 0
      out["full"] += elements * quant.pack * jnp.dtype(model_config.param_dtype).itemsize if name == "kernel_q" else 0
      continue
    out["full"] += elements * size
    if train:
      out["params"] += elements * size
      out["trainable"] += elements * size
      out["trainable_f32"] += elements * 4
    else:
      frozen = base if base is not None and jnp.issubdtype(value.dtype, jnp.floating) else value.dtype
      out["params"] += elements * jnp.dtype(frozen).itemsize
      out["frozen_float"] += elements * jnp.dtype(frozen).itemsize
  return out


def _layer_bytes(model: ModelConfig, tokens: float, rows: float, seq: int, tp: int, mode: str,
                 lora: bool = False) -> float:
  """Bytes of one block per device (`tokens` = rows x seq on the device) by `mode`: 'saved' what remat none keeps of
  every block for the backward (every intermediate: norm inputs and outputs, q / k / v and their head-major copies, the
  attention output, three of the MLP's hidden (SwiGLU: gate, up and their product, `jaxpt.nn.mlp.swiglu`; GELU: its
  input, one intermediate and its output), three float32 copies of the attention probabilities [rows, heads, S, (S +
  chunk) / 2]); 'working' the intermediates alive while one block's backward runs (the MLP hidden's gradients among
  them); 'dots' the matmul outputs; 'full' the block's input streams. LoRA adds each adapted projection's low-rank
  output (a matmul output's size) to 'saved' and 'working'."""
  c = jnp.dtype(model.dtype).itemsize
  d, hd, f = model.d_model, model.resolved_head_dim, model.mlp_dim
  heads, kv = model.num_heads / tp, model.num_kv_heads / tp
  streams = model.num_streams
  if mode == "full":
    return tokens * d * c * streams
  experts = max(1, model.experts_per_token if model.num_experts else 1)
  swiglu = model.mlp_type == "swiglu"
  mlp_hidden = (2 if swiglu else 1) * f / tp * experts
  matmuls = tokens * c * ((heads + 2 * kv) * hd + d + mlp_hidden + d)  # q, k, v, o, mlp in, mlp out
  if mode == "dots":
    return matmuls
  adapters = matmuls if lora else 0.0
  chunk = model.attention_query_chunk or seq
  probs = rows * heads * seq * min(seq, (seq + chunk) / 2) * 4  # float32 softmax, causal chunks skipped
  if mode == "saved":
    hidden = 3 * f / tp * experts
    attention = (2 * (heads + 2 * kv) + 2 * heads) * hd
    return tokens * c * (8 * d * streams + attention + hidden) + 3 * probs + adapters
  norms = tokens * d * 4 * 2 * streams  # float32 norm inputs, both sub-layers
  rest = tokens * c * (streams * 2 * d + (heads + kv) * hd + heads * hd + mlp_hidden)  # normed x, rope'd q k, ...
  mlp_grads = tokens * c * mlp_hidden  # the MLP's backward: d gate and d up beside the recomputed gate and up
  return matmuls + probs + norms + rest + mlp_grads + adapters


def account(trainer: str, run: RunConfig, devices: int) -> dict[str, float]:
  """The analytic per-device bytes of the training step by component (module docstring), and `total`."""
  mesh_shape = _mesh_shape(run, devices)
  load = workload(trainer, run)
  dp = math.prod(mesh_shape[a] for a in DATA_AXES + ("expert",))
  tp = mesh_shape["tensor"]
  p = param_bytes(run, mesh_shape)
  accum = run.optim.grad_accum_steps
  model = run.model
  rows = -(-load.micro_rows // dp)
  tokens = rows * load.seq
  layer = lambda mode: _layer_bytes(model, tokens, rows, load.seq, tp, mode, run.lora.enabled)
  # LoRA: the backward's scan reads one block's frozen weights out of the stacked params (a copy; the full
  # fine-tune's update writes its gradients in place instead)
  frozen_block = p["frozen_float"] / model.num_layers if run.lora.enabled else 0.0  # QLoRA: dequantized
  if model.remat == "none":
    blocks = model.num_layers * layer("saved")
  else:  # what remat keeps of each block, and one block's intermediates, recomputed in its backward
    blocks = model.num_layers * layer(model.remat) + layer("working")
  logits = tokens * model.vocab_size / tp * 4 * LOGIT_COPIES if load.vocab_logits else 0.0
  parts = dict(
      params=p["params"] * load.models,
      grads=p["trainable"] * load.models,
      # PPO: one model's (its backward runs one model at a time, `jaxpt.trainers.ppo.sequenced_grad_fn`)
      block_grads=p["trainable"] / model.num_layers if model.scan_layers else 0.0,
      accumulator=p["trainable_f32"] * load.models if accum > 1 else 0.0,
      optimizer=2 * p["trainable"] * load.models,
      reference=p["full"] if load.reference else 0.0,
      activations=blocks + frozen_block,  # PPO: one model's at a time (`jaxpt.trainers.ppo.sequenced_grad_fn`)
      logits=logits,
      kv_cache=0.0,
      sampler_params=0.0)
  if load.sampler_rows:
    kv_rows = -(-load.sampler_rows // dp)
    parts["kv_cache"] = (2 * model.num_layers * kv_rows * load.sampler_len * model.num_kv_heads / tp
                         * model.resolved_head_dim * jnp.dtype(model.dtype).itemsize)
    if run.lora.enabled and not run.lora.samples_unmerged:  # merged rollouts: W + s A B, a copy in base_dtype
      parts["sampler_params"] = p["frozen_float"]  # (lora.rollouts unmerged: the sampler reads the codes as stored)
  parts["total"] = max(step_total(parts), resident(parts) + parts["kv_cache"] + parts["sampler_params"])
  return parts


def resident(parts: dict[str, float]) -> float:
  """What the run holds throughout (`account`'s parts): params + optimizer state + the reference's params."""
  return parts["params"] + parts["optimizer"] + parts["reference"]


def step_transient(parts: dict[str, float]) -> float:
  """The train step's own bytes beyond the resident state (`account`'s parts): its backward phase, grads +
  block_grads + accumulator + activations + logits (the optimizer update after it holds only the gradient)."""
  return (parts["grads"] + parts["block_grads"] + parts["accumulator"] + parts["activations"]
          + parts["logits"])


def step_total(parts: dict[str, float]) -> float:
  """The train step's peak by the account: params + optimizer + reference + `step_transient` (no rollouts)."""
  return resident(parts) + step_transient(parts)


def step_shapes(trainer: str, run: RunConfig) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch shapes `trainer`'s train step is compiled for (one optimizer update's rows): the flattened
  pair batch of DPO / KTO / RM (no DIR bias columns; DPO and KTO with the reference's log-prob columns, KTO with its
  mismatched rows and per-side weights), GRPO's and PPO's experience minibatch, an LM batch otherwise."""
  load = workload(trainer, run)
  i32, f32 = jnp.int32, jnp.float32
  if trainer in ("grpo", "ppo"):
    from jaxpt.trainers import grpo, ppo
    return (grpo if trainer == "grpo" else ppo).experience_shapes(run)
  if trainer in ("dpo", "kto", "rm"):
    b, s = load.rows // 2, load.seq
    sides = ("chosen", "rejected")
    shapes = {"chosen_tokens": ((b, s), i32), "rejected_tokens": ((b, s), i32), "weights": ((b,), f32),
              **{f"{k}_{end}": ((b,), i32) for k in sides for end in ("last", "response_len")}}
    if trainer != "rm":
      shapes.update({"step": ((b,), i32), "ref_chosen_logps": ((b,), f32), "ref_rejected_logps": ((b,), f32)})
    if trainer == "kto":
      shapes.update({f"kl_{k}_tokens": ((b, s), i32) for k in sides})
      shapes.update({f"kl_{k}_{end}": ((b,), i32) for k in sides for end in ("last", "response_len")})
      shapes.update({f"{k}_weights": ((b,), f32) for k in sides})
      shapes.update({f"ref_kl_{k}_logps": ((b,), f32) for k in sides})
  else:
    shapes = {k: ((load.rows, load.seq), i32) for k in ("inputs", "targets", "segment_ids", "positions")}
    shapes["weights"] = ((load.rows, load.seq), f32)
  return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


def step_training(trainer: str, run: RunConfig, devices: int, donate: bool = True) -> Any:
  """`trainer`'s sharded training (`jaxpt.engine.builder.Training`: its init and its real train step, compiled for
  the first `devices` local devices from abstract shapes, `step_shapes`), built as the trainer builds it, without
  its data; donating the state by default (module docstring). PPO's is the policy + critic update
  (`jaxpt.trainers.ppo.update_training`), the critic at the policy's size (a `ppo.critic_init` reward model's own
  shapes are not read, as in the account); an RM with ODIN's `odin_length_sign=auto` compiles as `longer` (the
  sign is read from the data; the memory is the same). ConfigError for what is not compiled here (DPO + DIR, an RM
  with DIR, GRPO + CLIPO or a teacher)."""
  from jaxpt.engine.builder import build_training
  from jaxpt.parallel.mesh import make_mesh

  mesh = make_mesh(run.mesh, jax.devices()[:devices])
  if trainer == "ppo":  # its minibatch shapes are `experience_shapes`, read by update_training itself
    from jaxpt.trainers.ppo import update_training
    return update_training(run, mesh, run.model, donate=donate)[0]
  shapes = step_shapes(trainer, run)
  if trainer == "rm":
    from jaxpt.trainers.rm import rm_training
    settings = run.rm
    if settings.objective.uses_club:
      raise ConfigError("config.rm.loss", "jaxpt plan compiles the reward model's step without DIR's estimator",
                        settings.loss)
    if settings.odin_length_sign == "auto":
      settings = dataclasses.replace(settings, odin_length_sign="longer")
    return rm_training(run, settings, mesh, shapes, donate=donate)
  model = TransformerLM(run.model, lora=run.lora.spec())
  seq = run.data.max_prompt_len if trainer == "grpo" else workload(trainer, run).seq
  build = functools.partial(build_training, run, mesh, model, (jnp.zeros((1, seq), jnp.int32),), shapes,
                            donate=donate)
  if trainer == "dpo":
    from jaxpt.trainers.dpo import make_dpo_grad_fn
    if run.dpo.dir:
      raise ConfigError("config.dpo.dir", "jaxpt plan compiles DPO's step without DIR's estimator", True)
    return build(grad_fn=make_dpo_grad_fn(model, run.dpo), weight_key="num_pairs")
  if trainer == "kto":
    from jaxpt.trainers.kto import make_kto_grad_fn
    return build(grad_fn=make_kto_grad_fn(model, run.kto), weight_key="num_pairs")
  if trainer == "grpo":
    from jaxpt.engine.step import grad_fn_of
    from jaxpt.trainers.grpo import AGG_WEIGHT, make_policy_loss
    if run.clipo.enabled or run.grpo.teacher or run.reward.normalize == "running":
      raise ConfigError("config.grpo", "jaxpt plan compiles GRPO's update without CLIPO, a teacher or running reward "
                        "statistics", "")
    loss_fn = make_policy_loss(model, run.grpo, run.clipo, run.sampling.temperature)
    return build(grad_fn=grad_fn_of(loss_fn, reads_aux=True),
                 weight_key=AGG_WEIGHT,
                 total_steps=max(1, run.steps * run.updates_per_step))
  from jaxpt.trainers.lm import make_lm_loss_fn
  return build(loss_fn=make_lm_loss_fn(model, run.loss.name, **run.loss.kwargs()))


def compiled_account(trainer: str, run: RunConfig, devices: int) -> dict[str, Any]:
  """XLA's memory analysis (bytes per device) of `trainer`'s real train step compiled for `devices` devices of the
  local backend from abstract shapes (`step_training`: no params allocated); {"skipped": why} where it cannot be
  compiled here."""
  if jax.device_count() < devices:
    return {"skipped": f"the local backend has {jax.device_count()} devices, not {devices} (jaxpt plan sets "
                       "jax_num_cpu_devices before jax starts; a process that started jax earlier cannot)"}
  try:
    training = step_training(trainer, run, devices)
  except ConfigError as e:
    return {"skipped": str(e)}
  stats = training.sharded.train_step.memory_analysis()
  if stats is None:
    return {"skipped": f"the {jax.default_backend()} backend gives no memory analysis"}
  out = dict(argument=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
             temp=stats.temp_size_in_bytes, alias=stats.alias_size_in_bytes)
  out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  return out


def _gib(n: float) -> float:
  return round(n / GIB, 4)


def _changed(run: RunConfig, changes: dict[str, Any]) -> RunConfig | None:
  """`run` with the dotted `changes` applied and checked; None when the result is no valid config."""
  values = config_json(run)
  for dotted, value in changes.items():
    section, _, field = dotted.rpartition(".")
    target = values
    for key in filter(None, section.split(".")):
      target = target.setdefault(key, {})
    target[field] = value
  try:
    return from_section(type(run), values, "config")
  except ConfigError:
    return None


def _candidates(trainer: str, run: RunConfig, devices: int) -> list[tuple[str, dict[str, Any]]]:
  """(why, dotted overrides) of each single change that may lower the run's memory."""
  out: list[tuple[str, dict[str, Any]]] = []
  if TRAINERS.get(trainer).lora and not run.lora.enabled:
    out.append(("LoRA: only the adapters get gradients and AdamW state"
                + ("; the reference is the base, adapters off" if workload(trainer, run).reference else ""),
                {"lora.rank": 8}))
  if run.lora.enabled and run.lora.base_dtype == "float32":
    out.append(("the frozen base in bfloat16", {"lora.base_dtype": "bfloat16"}))
  if run.lora.enabled and run.lora.quant is None and _quant_block_fits(run):
    out.append(("QLoRA: the adapted kernels in 4-bit NF4 (0.56 bytes a param)", {"lora.base_quant": "nf4"}))
  if run.model.remat != "full":
    out.append(("recompute the blocks in the backward", {"model.remat": "full"}))
  if run.model.dtype == "float32":
    out.append(("compute in bfloat16", {"model.dtype": "bfloat16"}))
  if devices > 1 and run.mesh.fsdp != devices:
    rules = {} if "fsdp" in run.mesh.rules else {"mesh.rules": "fsdp_tp" if "tp" in run.mesh.rules else "fsdp"}
    tensor = {"mesh.tensor": 1} if run.mesh.tensor != 1 else {}
    out.append((f"params, grads and AdamW state split over all {devices} devices (fsdp)",
                {**rules, "mesh.fsdp": devices, "mesh.data": 1, **tensor}))
  out.append(("half the micro-batch, the same batch: activations and logits halve",
              {"optim.grad_accum_steps": run.optim.grad_accum_steps * 2}))
  if workload(trainer, run).sampler_rows and run.data.prompts_per_step > 1:
    out.append(("half the prompts per step: the rollouts, their KV cache and the step's rows halve",
                {"data.prompts_per_step": run.data.prompts_per_step // 2}))
  return out


def _quant_block_fits(run: RunConfig) -> bool:
  """Whether lora.base_quant_block divides every adapted kernel's blocked axis (so nf4 can be advised)."""
  dims = run.model.projection_blocked_dims()
  return all(dims[name] % run.lora.base_quant_block == 0 for name in lora_lib.resolve_targets(run.lora.targets))


def _flags(changes: dict[str, Any]) -> str:
  return " ".join(f"--config.{k}={v}" for k, v in changes.items())


def advice(trainer: str, run: RunConfig, devices: int, device_gib: float, parts: dict[str, float]) -> list[str]:
  """[] when the plan fits; else concrete overrides, each with the total it plans to: every single change that
  lowers the total (largest saving first), then changes found greedily that together make it fit (each step the
  change that saves most; fewer prompts per step only when nothing that keeps the batch helps)."""
  budget = device_gib * GIB * (1 - HEADROOM)
  if parts["total"] <= budget:
    return []
  fits = lambda total: "fits" if total <= budget else "still over"
  singles = []
  for why, changes in _candidates(trainer, run, devices):
    other = _changed(run, changes)
    if other is not None and (total := account(trainer, other, devices)["total"]) < parts["total"] * 0.98:
      singles.append((total, f"{_flags(changes)} ({why}) -> {_gib(total)} GiB per device ({fits(total)})"))
  tips = [text for _, text in sorted(singles)]
  current, applied, total = run, {}, parts["total"]
  for _ in range(12):
    best = None
    for keeps_batch in (True, False):  # fewer prompts per step change the algorithm: only when nothing else helps
      for _why, changes in _candidates(trainer, current, devices):
        if ("data.prompts_per_step" not in changes) != keeps_batch:
          continue
        other = _changed(current, changes)
        if other is not None and (t := account(trainer, other, devices)["total"]) < total * 0.98:
          best = min(best or (t, changes, other), (t, changes, other), key=lambda x: x[0])
      if best is not None:
        break
    if best is None:
      break
    total, changes, current = best
    applied.update(changes)
    if total <= budget:
      break
  if len(applied) > 1 or (applied and total <= budget and not any(_flags(applied) in t for t in tips)):
    tips.append(f"together: {_flags(applied)} -> {_gib(total)} GiB per device ({fits(total)})")
  return tips


def plan_memory(trainer: str, config: Any, devices: int, device_gib: float, compile: bool = False) -> dict:
  """The plan (one JSON-able dict): trainer, mesh, workload, per_device_gib by component and total, the budget and
  `fits` (total <= device_gib (1 - HEADROOM)), `advice`, and with `compile` the compiled step's analysis (GiB).
  ConfigError naming the field for a bad config, `devices` or `device_gib`."""
  if devices < 1:
    raise ConfigError("--devices", "must be a positive integer", devices)
  if not device_gib > 0:
    raise ConfigError("--device-gib", "must be > 0", device_gib)
  run = run_config(trainer, config)
  mesh_shape = _mesh_shape(run, devices)
  dp = math.prod(mesh_shape[a] for a in DATA_AXES + ("expert",))
  load = workload(trainer, run)
  if load.micro_rows % dp:
    field = "config.data.prompts_per_step" if load.sampler_rows else "config.data.batch_size"
    raise ConfigError(field, f"its {load.micro_rows} rows per micro-batch do not split over the data-parallel mesh "
                      f"axes data x fsdp x expert = {dp} of --devices {devices}", getattr(run.data, field[12:]))
  parts = account(trainer, run, devices)
  out = dict(
      trainer=trainer, devices=devices, mesh=mesh_shape, rules=run.mesh.rules,
      workload=dict(dataclasses.asdict(load), remat=run.model.remat, dtype=run.model.dtype,
                    param_dtype=run.model.param_dtype, lora_rank=run.lora.rank,
                    lora_base_quant=run.lora.base_quant),
      per_device_gib={k: _gib(v) for k, v in parts.items()},
      device_gib=device_gib, headroom=HEADROOM, fits=parts["total"] <= device_gib * GIB * (1 - HEADROOM),
      advice=advice(trainer, run, devices, device_gib, parts))
  if compile:
    compiled = compiled_account(trainer, run, devices)
    out["compiled_gib"] = {k: (_gib(v) if isinstance(v, (int, float)) else v) for k, v in compiled.items()}
  return out


def rollout_capacity(model: ModelConfig, prompt_len: int, max_new_tokens: int, device_gib: float,
                     group_size: int = 1, page_size: int = 16, dtype: str = "bfloat16",
                     held_new_tokens: float | None = None) -> dict[str, Any]:
  """The most rollouts decoding at once on one device of `device_gib`, from the model's shapes alone (the static
  sampler's preallocated cache against the rollout engine's pages, `jaxpt.rl.engine`).

  Budget = device_gib (1 - HEADROOM) - the params in `dtype` (the rollout weights); each rollout then costs its
  float32 logits row (vocab 4 bytes) and its K/V, kv = 2 L kv_heads head_dim bytes(dtype) per token, with the
  prompt's G = group_size rows sharing the prompt's K/V (both systems prefill a prompt once):
      preallocated   kv (P / G + T - 1)                   every row holds its whole response buffer
      paged_reserved kv ps max_n (ceil(n / ps) / G + ceil((n % ps + T - 1) / ps))
                                                          the engine's default (reserve_pages): each admitted row's
                                                          worst case over prompt lengths n <= P: its share of the
                                                          prompt's pages, then its own (its copy of the prompt's
                                                          partly filled page, then its response)
      paged_held     kv ps max_n (ceil(n / ps) / G + (n % ps + h) / ps + 1)
                                                          reserve_pages=False with a pool for the tokens rows hold:
                                                          h = held_new_tokens, a row's mean response tokens held at
                                                          a decode step (+ one partly filled page)
  -> {"params_gib", "kv_bytes_per_token", "budget_gib", "rollouts": {scheme: count}, "bytes_per_rollout": {...}}."""
  c = jnp.dtype(dtype).itemsize
  shapes = jax.eval_shape(TransformerLM(model).init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
  params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) * c
  kv = 2 * model.num_layers * model.num_kv_heads * model.resolved_head_dim * c
  lengths = range(max(1, prompt_len - page_size + 1), prompt_len + 1)  # the worst n lies in the last page's span
  shared = lambda n: -(-n // page_size) / group_size
  logits = model.vocab_size * 4
  reserved = max(shared(n) + own_pages(n, max_new_tokens, page_size) for n in lengths)
  per_rollout = {"preallocated": kv * (prompt_len / group_size + max_new_tokens - 1) + logits,
                 "paged_reserved": kv * page_size * reserved + logits}
  if held_new_tokens is not None:
    held = max(shared(n) + (n % page_size + held_new_tokens) / page_size + 1 for n in lengths)
    per_rollout["paged_held"] = kv * page_size * held + logits
  budget = device_gib * GIB * (1 - HEADROOM) - params
  return dict(params_gib=_gib(params), kv_bytes_per_token=kv, budget_gib=_gib(budget),
              rollouts={k: max(0, int(budget // v)) for k, v in per_rollout.items()},
              bytes_per_rollout={k: round(v) for k, v in per_rollout.items()})
