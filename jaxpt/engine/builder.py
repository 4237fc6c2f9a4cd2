"""The one sharded-training builder every trainer (pretraining, SFT, reward models, GRPO) composes.

    mesh = training_mesh(run, batch_size)        # config.mesh on the devices; before any data work
    training = build_training(run, mesh, model, init_args, batch_shapes, loss_fn=... | grad_fn=..., ...)
    training.init_state() -> sharded TrainState (params from run.init_from); training.train_step: the shared step
    (`jaxpt.engine.step`) compiled for the mesh; training.batches(train_batch, batch_size): global batches

Keys: split(PRNGKey(seed)) -> (init, train); init -> (model, aux) when the trainer carries an aux state. Trainers
differ only in what they pass: model and init arguments, the gradient, batch shapes, an aux state (the DIR
estimator, the CLIPO head), the params subtree `init_from` fills, and the number of optimizer updates.

LoRA (`config.lora.rank > 0`, the model built with `config.lora.spec()`): only the adapters and the params
subtrees `new_heads` (a reward head, PPO's value head) train and have optimizer state (`Training.trainable`); the
frozen base is kept in `lora.base_dtype` (QLoRA, `lora.base_quant`: the adapted kernels quantized once, when the run
gets its base: `Training.init_state`). `Training.merged_params` is the policy as the same model without LoRA reads it
(samplers, evaluators built on `config.model` alone), `Training.base_params` the base, adapters off (without a copy),
`Training.adapters_off` the same base for the adapted model (adapters at 0), `Training.initial_policy` the policy the
run started from (the reference of DPO, KTO, GRPO and PPO: the base with fresh adapters, with `lora.init_adapter`'s
adapters the base plus those); `Training.of_part(key)` reads them (and `layout`) for one params subtree (PPO's
policy beside its critic).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax
from jax.sharding import Mesh


from jaxpt import parallel
from jaxpt.data import order
from jaxpt.engine.config import RunConfig
from jaxpt.engine.init_from import init_adapters, init_params
from jaxpt.engine.optim import decay_mask, make_optimizer
from jaxpt.engine.sharded import ShardedTraining, compile_step, shard_training
from jaxpt.engine.state import TrainState, trainable_part
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.quant import quantize
from jaxpt.engine.step import GradFn, LossFn, make_train_step

HostBatchFn = Callable[[int, int, int], dict]  # (step, process_index, process_count) -> this process's rows


def training_mesh(config: RunConfig, batch_size: int, field: str = "config.data.batch_size") -> Mesh:
  """The device mesh of `config.mesh`, checked against the devices and the global batch (ConfigError naming the
  fields); trainers call it before any data work."""
  mesh = parallel.make_mesh(config.mesh)
  parallel.check_global_batch(batch_size, mesh, field)
  return mesh


def batch_shapes(sample: dict, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Global shapes `[batch_size, ...]` of the leaves of one host batch `sample` (any leading size)."""
  return {k: jax.ShapeDtypeStruct((batch_size,) + np.shape(v)[1:], np.asarray(v).dtype) for k, v in sample.items()}


@dataclasses.dataclass
class Training:
  """A run's model, optimizer and the shared step compiled for its mesh; see the module docstring."""

  config: RunConfig
  model: nn.Module
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule
  sharded: ShardedTraining  # mesh, rules, shardings, the compiled step and its per-device memory
  init_from_subtree: str | None
  trainable: Any = None  # LoRA: bools shaped like the params, True where they train (None: all train)
  part: str | None = None  # the params key `layout` and the LoRA helpers read (`of_part`; None: the whole params)
  start_adapters: Any = dataclasses.field(default=None, repr=False)  # lora.init_adapter's, read by `initial_policy`

  def of_part(self, key: str) -> "Training":
    """This training as the programs that read `params[key]` alone see it (PPO's policy): `layout` holds that
    subtree's shardings, and `merged_params`, `adapters_off`, ... take and give that subtree."""
    return dataclasses.replace(self, part=key, start_adapters=None)

  @property
  def train_step(self) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    return self.sharded.train_step

  @property
  def memory(self) -> dict:
    """Compiled per-device memory of the train step in MiB (argument, output, temp, alias, peak)."""
    return self.sharded.memory

  @property
  def layout(self) -> parallel.MeshLayout:
    """The mesh, its rules and the params' and batch shardings, for the run's other programs (a sampler, ...)."""
    params = self.sharded.state_sharding.params
    params = params if self.part is None else params[self.part]
    return parallel.MeshLayout(self.sharded.mesh, self.sharded.rules, params, self.sharded.batch_sharding)

  def describe(self, command: str) -> str:
    """One line for `jaxpt <command>` at start: processes, devices, mesh, rules, compiled step memory."""
    mesh = " ".join(f"{axis}={size}" for axis, size in self.sharded.mesh.shape.items())
    return (f"jaxpt {command}: process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} "
            f"devices, mesh {mesh} (rules {self.config.mesh.rules}); compiled train step peak memory per device "
            f"{self.memory.get('peak_mib', float('nan')):.1f} MiB")

  def init_state(self) -> TrainState:
    """A fresh (un-donated) initial state, sharded on the mesh; with `init_from`, its params (or the
    `init_from_subtree` of them) are that run's latest params or the HF checkpoint's (`jaxpt.engine.init_from`),
    and the optimizer state starts fresh; with LoRA, the adapters are fresh (B = 0) or `lora.init_adapter`'s."""
    state = self.sharded.init_state()
    init_from, model = self.config.init_from, self.config.model
    if not init_from:
      return state

    def start(template: Any) -> Any:  # LoRA: the base from init_from, beside it fresh adapters or init_adapter's
      if not self.lora:
        return init_params(init_from, model, template)
      if self.config.lora.init_adapter:
        template = lora_lib.replace_adapters(template, init_adapters(self.config.lora.init_adapter, template))
      if self.quant is None:
        loaded = init_params(init_from, model, lora_lib.base_params(template))
        return lora_lib.with_adapters(frozen_dtype(loaded, self.config), template)
      # QLoRA: the float base loaded into the dequantized layout and quantized on the mesh kernel by kernel as it is
      # read (an hf: checkpoint's as it streams in, a jaxpt run's restored one projection at a time): the float
      # base is never whole
      shardings = jax.tree.map(lambda leaf: leaf.sharding, template)
      floats = jax.eval_shape(lambda p: lora_lib.dequantize_params(p, self.quant, self.base_dtype), template)
      floats = jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                            floats, lora_lib.dequantized_layout(shardings))
      each = stream_quantizer(template, self.quant, self.base_dtype)
      loaded = init_params(init_from, model, lora_lib.base_params(floats), each=each)
      return lora_lib.with_adapters(frozen_dtype(lifted(loaded), self.config), template)

    if self.init_from_subtree is None:
      return state.replace(params=start(state.params))
    return state.replace(params={**state.params, self.init_from_subtree: start(state.params[self.init_from_subtree])})

  @property
  def lora(self) -> bool:
    return self.config.lora.enabled

  @property
  def quant(self) -> Any:
    """QLoRA's `jaxpt.nn.quant.Quant` of the frozen base (None: a float base)."""
    return self.config.lora.quant if self.lora else None

  @property
  def base_dtype(self) -> Any:
    return jnp.dtype(self.config.lora.base_dtype)

  def merged_params(self, params: Any) -> Any:
    """The params as the model without LoRA reads them: W + s A B in place of each adapted kernel, W dequantized
    (QLoRA) to lora.base_dtype (jitted on the mesh; `params` itself without LoRA)."""
    return self._merge(params) if self.lora else params

  @functools.cached_property
  def _merge(self) -> Callable[[Any], Any]:
    scale, quant, dtype = self.config.lora.scale, self.quant, self.base_dtype
    return jax.jit(lambda params: lora_lib.merge_params(params, scale, quant, dtype),
                   out_shardings=self.merged_layout.params)

  @property
  def merged_layout(self) -> parallel.MeshLayout:
    """`layout` for programs that read `merged_params` or `dequantized_base` (the params' shardings without
    adapters, a quantized kernel's as its codes')."""
    layout = self.layout
    if not self.lora:
      return layout
    return dataclasses.replace(layout, params=lora_lib.base_params(lora_lib.dequantized_layout(layout.params)))

  def base_params(self, params: Any) -> Any:
    """The base params, adapters off (the same arrays: no copy; QLoRA: the codes, for the model with
    `lora_lib.base_spec`); `params` itself without LoRA."""
    return lora_lib.base_params(params) if self.lora else params

  def dequantized_base(self, params: Any) -> Any:
    """The base params, adapters off, as the model without LoRA reads them: QLoRA's kernels dequantized to
    lora.base_dtype (a copy, jitted on the mesh); `base_params` otherwise."""
    return self._dequantize(self.base_params(params)) if self.quant is not None else self.base_params(params)

  def adapters_off(self, params: Any) -> Any:
    """`params` with every adapter (A and B) at 0: the adapted model then computes its base exactly (s (x 0) 0 = 0
    is added to each projection), so programs compiled for the policy's params read the base too (new arrays for
    the adapters alone; the base's are the same); `params` itself without LoRA."""
    if not self.lora:
      return params
    return lora_lib.replace_adapters(params, self._zero_adapters(lora_lib.adapter_params(params)))

  def initial_policy(self, params: Any) -> Any:
    """The policy the run started from, for the adapted model, beside the base arrays of LoRA `params` (no copy of
    them): its adapters at 0 (`adapters_off`: fresh adapters start at B = 0, the base exactly) or, with
    `lora.init_adapter`, that adapter's (read from it once, then kept: a few MB); `params` itself without LoRA."""
    if not self.lora or not self.config.lora.init_adapter:
      return self.adapters_off(params)
    if self.start_adapters is None:
      self.start_adapters = init_adapters(self.config.lora.init_adapter, params)
    return lora_lib.replace_adapters(params, self.start_adapters)

  @functools.cached_property
  def _zero_adapters(self) -> Callable[[Any], Any]:
    return jax.jit(lambda adapters: jax.tree.map(jnp.zeros_like, adapters),
                   out_shardings=lora_lib.adapter_params(self.layout.params))

  @functools.cached_property
  def _dequantize(self) -> Callable[[Any], Any]:
    quant, dtype = self.quant, self.base_dtype
    return jax.jit(lambda params: lora_lib.dequantize_params(params, quant, dtype),
                   out_shardings=self.merged_layout.params)

  def put(self, batch: dict) -> dict:
    """A host batch every process holds whole -> global arrays laid out like the training batches."""
    return parallel.full_batch(batch, self.sharded.batch_sharding)

  def batches(self, train_batch: HostBatchFn, batch_size: int) -> Callable[[int], Iterator[dict]]:
    """batches(start) -> the global batches of steps start, start + 1, ...; this process reads only its rows
    [index B / count, (index + 1) B / count) of each."""
    index, count = parallel.process_batch_slice(self.sharded.batch_sharding, batch_size)

    def batches(start: int) -> Iterator[dict]:
      local = order.step_batches(train_batch, batch_size, start, index, count)
      return parallel.global_batches(local, self.sharded.batch_sharding, batch_size)

    return batches

  def compile_step(self, step_fn: Callable, shapes: dict[str, jax.ShapeDtypeStruct]) -> Callable:
    """Another step `step_fn(state, batch) -> (state, metrics)` on this run's state (same shardings), compiled for
    batches of `shapes` (e.g. PPO's critic-only warm-up update beside its train step)."""
    sharded = self.sharded
    abstract = jax.eval_shape(sharded.init_state)
    return compile_step(step_fn, abstract, sharded.state_sharding, sharded.batch_sharding, sharded.mesh, sharded.rules,
                        shapes, donate=jax.default_backend() != "cpu")

  def under_rules(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with the mesh's activation rules on (its jitted functions trace on the first call)."""

    def run(*args: Any, **kwargs: Any) -> Any:
      with parallel.activation_sharding(self.sharded.mesh, self.sharded.rules):
        return fn(*args, **kwargs)

    return run


def build_training(config: RunConfig, mesh: Mesh, model: nn.Module, init_args: tuple,
                   shapes: dict[str, jax.ShapeDtypeStruct], *, loss_fn: LossFn | None = None,
                   grad_fn: GradFn | None = None, weight_key: str = "num_tokens", total_steps: int | None = None,
                   init_aux: Callable[[jax.Array], Any] | None = None,
                   init_from_subtree: str | None = None, new_heads: tuple[str, ...] = (),
                   optimizer: Callable[[Any, int], tuple[Any, optax.Schedule]] | None = None,
                   donate: bool | None = None) -> Training:
  """Model params, optimizer and aux created sharded on `mesh`, and the shared step compiled for it.

  init_args: dummy inputs of `model.init` after the rng; shapes: the global batch shapes the step is compiled for;
  loss_fn / grad_fn: the gradient (see `jaxpt.engine.step.make_train_step`); total_steps: optimizer updates of the
  schedule (default config.steps); init_aux(rng) -> the TrainState's aux (default None); new_heads: params
  subtrees ('head', or a '/'-joined path: 'critic/head') that train whole with LoRA on (module docstring);
  optimizer(decay, steps) -> (optimizer, schedule) replaces `config.optim`'s (`make_optimizer`), e.g. one
  optimizer per params subtree (`jaxpt.engine.optim.partitioned`), `decay` the weight-decay mask of the params it
  updates (`decay_mask`; with LoRA, of the trainable part alone). donate: the step donates the state
  (None: on accelerators only; `jaxpt plan` compiles a donated step on CPU to read an accelerator's memory).
  """
  rules = config.mesh.logical_rules
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  model_rng, aux_rng = jax.random.split(init_rng) if init_aux is not None else (init_rng, None)
  boxed = jax.eval_shape(model.init, model_rng, *init_args)["params"]
  parallel.check_param_divisibility(boxed, mesh, rules, config.mesh.rules)
  steps = config.steps if total_steps is None else total_steps
  trainable = lora_trainable(boxed, new_heads) if config.lora.enabled else None
  decay = trainable_part(decay_mask(boxed), trainable)
  if optimizer is None:
    optimizer, schedule = make_optimizer(config.optim, steps, mask=decay)
  else:
    optimizer, schedule = optimizer(decay, steps)

  def init_fn() -> TrainState:
    params = frozen_dtype(nn.meta.unbox(model.init(model_rng, *init_args)["params"]), config, trainable)
    aux = init_aux(aux_rng) if init_aux is not None else None
    return TrainState.create(params, optimizer, train_rng, aux=aux, trainable=trainable)

  step_fn = make_train_step(loss_fn, optimizer, schedule, config.optim.grad_accum_steps, weight_key, grad_fn=grad_fn,
                            skip_nonfinite=config.on_nonfinite == "skip", trainable=trainable)
  # On CPU a checkpoint's host copy may alias device memory, so donate the state only on accelerators.
  sharded = shard_training(init_fn, step_fn, boxed, optimizer, mesh, rules, shapes,
                           donate=jax.default_backend() != "cpu" if donate is None else donate, trainable=trainable)
  return Training(config=config, model=model, optimizer=optimizer, schedule=schedule, sharded=sharded,
                  init_from_subtree=init_from_subtree, trainable=trainable)


def lora_trainable(boxed: Any, new_heads: tuple[str, ...] = ()) -> Any:
  """Bools shaped like the (unboxed) params: True at the LoRA adapters and under the subtrees `new_heads` (a
  top-level key, or a '/'-joined path of keys)."""
  paths = [tuple(head.split("/")) for head in new_heads]

  def mark(tree: Any, at: tuple[str, ...]) -> Any:
    if at in paths:
      return jax.tree.map(lambda _: True, tree)
    if not isinstance(tree, dict) or not any(path[:len(at)] == at for path in paths):
      return tree
    return {key: mark(value, at + (key,)) for key, value in tree.items()}

  return mark(nn.meta.unbox(lora_lib.adapter_mask(boxed)), ())


def stream_quantizer(template: Any, quant: Any, dtype: Any) -> Callable[[tuple[str, ...], jax.Array], Any]:
  """each(names, array) for `init_params` (called as an `hf:` start's every leaf streams in, as a jaxpt run's every
  kernel is restored): a kernel that
  `template` (QLoRA params: arrays or shapes with shardings) holds quantized -> {kernel_q, kernel_scale} in the
  template's shardings (the kernel cast to `dtype`, lora.base_dtype, as `frozen_dtype` casts it, then blocked as
  `quantize_params` blocks it: the same codes); any other leaf as it is. `lifted` puts the codes in place."""

  def each(names: tuple[str, ...], array: jax.Array) -> Any:
    node = functools.reduce(lambda tree, name: tree[name], names[:-1], template)
    if names[-1] != "kernel" or "kernel_q" not in node:
      return array
    axis = node["lora_a"].ndim - 2  # the kernel's last input axis, as quantize_params
    stacked = node["lora_a"].ndim + node["lora_b"].ndim - 2 > node["kernel_q"].ndim  # a leading layers axis
    codes = quantizer(axis, stacked, tuple(node[k].sharding for k in lora_lib.QUANT_NAMES))(array)
    return dict(zip(lora_lib.QUANT_NAMES, codes))

  @functools.cache
  def quantizer(axis: int, stacked: bool, shardings: tuple) -> Callable[[jax.Array], tuple]:  # one jit per kind
    one = lambda w, axis: quantize(w.astype(dtype), quant, axis)
    if not stacked:
      return jax.jit(lambda w: one(w, axis), out_shardings=shardings)
    # a scanned kernel [layers, ...], one layer at a time (the same codes: blocks never span layers): the
    # quantizer's float temporaries (~5x the kernel: benchmarks/qlora_run_load.py) are one layer's, not all
    return jax.jit(lambda w: lax.map(lambda layer: one(layer, axis - 1), w), out_shardings=shardings)

  return each


def lifted(params: Any) -> Any:
  """A params tree whose quantized kernels are {kernel: {kernel_q, kernel_scale}} (`stream_quantizer`) with the
  codes and scales beside the kernel's siblings instead, as the QLoRA model holds them."""
  if not isinstance(params, dict):
    return params
  out = {}
  for key, value in params.items():
    if key == "kernel" and isinstance(value, dict):
      out.update(value)
    else:
      out[key] = lifted(value)
  return out


def frozen_dtype(params: Any, config: RunConfig, trainable: Any = None) -> Any:
  """LoRA with `lora.base_dtype` bfloat16: the frozen float leaves (all but the adapters, or those `trainable`
  says do not train; QLoRA's float32 scales kept) cast to it; `params` unchanged otherwise."""
  if not config.lora.enabled or config.lora.base_dtype == "float32":
    return params
  dtype = jnp.dtype(config.lora.base_dtype)
  keep = trainable if trainable is not None else nn.meta.unbox(lora_lib.adapter_mask(params))
  keep = jax.tree.map(lambda train, quant: train or quant, keep, nn.meta.unbox(lora_lib.quant_mask(params)))
  cast = lambda p, train: p if train or not jnp.issubdtype(p.dtype, jnp.floating) else p.astype(dtype)
  return jax.tree.map(cast, params, keep)
