"""What a run starts from (`config.init_from`): random init (''), a jaxpt run's workdir, or `hf:DIR`.

    init_params(init_from, model_config, template)  the starting params, in `template`'s structure, dtypes and
                                                    shardings: a jaxpt run's latest checkpoint (orbax partial
                                                    restore; a PPO run's policy, never its critic), or an HF
                                                    checkpoint streamed block by block into the template's
                                                    shardings (`jaxpt.models.hf.load_params`)
    init_adapters(init_adapter, template)           the adapters of PEFT adapter directory `lora.init_adapter`, in
                                                    the template's shardings (`jaxpt.models.hf_peft`)
    init_tokenizer(init_from, workdir, resuming,    the tokenizer the starting params' embedding rows belong to,
                   model_config)                    copied into `workdir/tokenizer/` at the first launch (a
                                                    resumed run reads its own copy), or None for random init;
                                                    first, before any data work, checks the start fits

The model config of an `hf:` start comes from the checkpoint's config.json (`RunConfig.prepare_values`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from jaxpt.config import ConfigError, DataError
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.models import hf, hf_peft
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params as init_params_of
from jaxpt.nn import lora as lora_lib
from jaxpt.engine.checkpoint import check_run_params, load_run_params
from jaxpt.engine.record import CONFIG_FILE, recorded_config, run_lm_key
from jaxpt.engine.saved_model import recorded_lora

FIELD = "config.init_from"


def hf_directory(init_from: str) -> str | None:
  """The checkpoint directory of an `hf:DIR` start, else None."""
  return os.path.expanduser(init_from[len(hf.HF_PREFIX):]) if init_from.startswith(hf.HF_PREFIX) else None


def init_params(init_from: str, model_config: ModelConfig, template: Any, each: Any = None) -> Any:
  """The params `init_from` starts the run with, as `template` (a TransformerLM params tree of arrays) has them;
  with `each`, each kernel passed through `each(names, array)` as it is read (an `hf:` checkpoint's every leaf as it
  streams in, `hf.load_params`; a jaxpt run's kernels restored one at a time, `run_params`). ConfigError naming
  config.init_from for a checkpoint that does not fit."""
  directory = hf_directory(init_from)
  if directory is None:
    return run_params(init_from, model_config, template, each=each)
  shardings = jax.tree.map(lambda leaf: leaf.sharding, template)
  try:
    return hf.load_params(directory, model_config, shardings=shardings, each=each)
  except DataError as e:
    raise ConfigError(FIELD, str(e), init_from) from None


def init_adapters(init_adapter: str, template: Any) -> Any:
  """The adapters (an `adapter_params` tree) of the PEFT adapter directory `init_adapter` for the adapter leaves of
  `template` (a LoRA model's params, arrays), each in its template leaf's sharding; `RunConfig.check` has checked
  the file against the model."""
  return hf_peft.load_adapters(os.path.expanduser(init_adapter), template, "config.lora.init_adapter")


def run_params(workdir: str, model_config: ModelConfig, template: Any, field: str = FIELD, each: Any = None) -> Any:
  """The latest params of the jaxpt run in `workdir` as `template` has them (a PPO run's policy: its critic is not
  read); a LoRA run's adapters merged into its kernels (a QLoRA run's quantized kernels dequantized first), each
  restored split as its kernel in `template` (`adapted_target`).

  With `each(names, kernel)` (`builder.stream_quantizer`: a QLoRA run started from this one), the params are
  restored in parts: all but the projections (the dicts holding a `kernel`) at once, then each projection alone
  (merged, for a LoRA run), its kernel replaced by `each`'s value before the next is read: the float kernels are
  never all in memory (peak: benchmarks/qlora_run_load.py)."""
  lora, target, key = _run_target(workdir, model_config, template)
  adapted = lora is not None
  shardings = jax.tree.map(lambda leaf: leaf.sharding, template)
  merge = lambda p: lora_lib.merge_params(p, lora.scale, lora.quant, jnp.dtype(model_config.param_dtype))
  if each is None:
    restored = load_run_params(workdir, target, field, key)
    return jax.jit(merge, out_shardings=shardings)(restored) if adapted else restored
  check_run_params(workdir, target, field, key)  # the whole tree first: a misfit is refused before any read
  rest, projections = _projections(target)
  params = load_run_params(workdir, rest, field, key) if rest else {}
  for names in projections:
    part = _nested(names, _at(target, names))
    node = _at(load_run_params(workdir, part, field, key), names)
    if adapted:
      node = jax.jit(merge, out_shardings=_at(shardings, names))(node)
    node = dict(node, kernel=each(names + ("kernel",), node["kernel"]))
    _at(params, names[:-1], create=True)[names[-1]] = node
  return params


def _run_target(workdir: str, model_config: ModelConfig, template: Any) -> tuple[Any, Any, str | None]:
  """(the `LoRAConfig` of the jaxpt run in `workdir`, None without LoRA; what its params restore into: `template`,
  or with LoRA its `adapted_target`; the params key of its language model, `run_lm_key`)."""
  path = os.path.expanduser(workdir)
  lora = recorded_lora(recorded_config(path)) if os.path.isfile(os.path.join(path, CONFIG_FILE)) else None
  if lora is None or not lora.enabled:
    return None, template, run_lm_key(path)
  return lora, adapted_target(template, model_config, lora), run_lm_key(path)


def _projections(tree: Any, names: tuple[str, ...] = ()) -> tuple[dict, list[tuple[str, ...]]]:
  """(`tree` without its projections: the dicts holding a `kernel` (or a QLoRA run's `kernel_q`), the names
  of those dicts)."""
  if "kernel" in tree or "kernel_q" in tree:
    return {}, [names]
  rest, found = {}, []
  for key, value in tree.items():
    if isinstance(value, dict):
      sub, more = _projections(value, names + (key,))
      found += more
      if sub:
        rest[key] = sub
    else:
      rest[key] = value
  return rest, found


def _at(tree: dict, names: tuple[str, ...], create: bool = False) -> Any:
  for name in names:
    tree = tree.setdefault(name, {}) if create else tree[name]
  return tree


def _nested(names: tuple[str, ...], leaf: Any) -> dict:
  for name in reversed(names):
    leaf = {name: leaf}
  return leaf


def adapted_target(template: Any, model_config: ModelConfig, lora: Any) -> Any:
  """What a LoRA run's params restore into: `template` (the params of the model without LoRA, arrays or shapes with
  shardings) with the adapters of `lora` (a `LoRAConfig`) beside their kernels, and with a quantized base its codes
  and scales in place of the kernels, as shapes split as their kernel is (`_like_kernel`): at 7B, nf4 codes
  restored whole on every device would be ~3.7 GB each."""
  model = TransformerLM(model_config, lora=lora.spec())
  adapted = jax.eval_shape(lambda: init_params_of(model_config, jax.random.PRNGKey(0), model=model))
  return _restore_target(template, adapted)


def _restore_target(template: Any, adapted: Any) -> Any:
  """`template` (a model's params without LoRA) with the adapters of `adapted` (a LoRA run's params, shapes) beside
  their kernels, and a QLoRA run's quantized kernels (codes and scales) in place of the kernels."""
  if not isinstance(adapted, dict):
    return template
  extra = lora_lib.ADAPTER_NAMES + lora_lib.QUANT_NAMES
  out = {k: _restore_target(template[k], v) for k, v in adapted.items() if k not in extra}
  if "lora_a" in adapted:
    out.update(_like_kernel(template["kernel"], {k: v for k, v in adapted.items() if k in extra}))
  return out


def _like_kernel(kernel: Any, leaves: dict) -> dict:
  """The adapter and quantization `leaves` (shapes) of a projection whose kernel [*lead, *in, *out] is `kernel`,
  as shapes split as their logical axes say in the kernel's mesh axes: A [*lead, *in, r] as the kernel's in axes,
  B [*lead, r, *out] as its out axes, codes as the kernel, scales as the kernel but along the blocked (last input)
  axis, whole; the rank axis whole. An axis whose size the mesh axes do not divide stays whole."""
  sharding = kernel.sharding
  a, b = leaves["lora_a"], leaves["lora_b"]
  if not isinstance(sharding, NamedSharding):  # one device: nothing to split
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in leaves.items()}
  spec = tuple(sharding.spec) + (None,) * (kernel.ndim - len(tuple(sharding.spec)))
  ins = a.ndim - 1  # lead + in axes
  blocked = ins - 1
  specs = {"lora_a": spec[:ins] + (None,), "lora_b": spec[:a.ndim + b.ndim - 2 - kernel.ndim] + (None,) + spec[ins:],
           "kernel_q": spec, "kernel_scale": spec[:blocked] + (None,) + spec[blocked + 1:]}

  def fitted(shape: tuple[int, ...], axes: tuple) -> PartitionSpec:
    ways = lambda names: math.prod(sharding.mesh.shape[n] for n in ((names,) if isinstance(names, str) else names))
    return PartitionSpec(*(None if names is None or size % ways(names) else names for size, names in zip(shape, axes)))

  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(sharding.mesh, fitted(v.shape, specs[k])))
          for k, v in leaves.items()}


def _source_tokenizer_dir(init_from: str) -> str:
  directory = hf_directory(init_from)
  return directory if directory is not None else os.path.join(os.path.expanduser(init_from), "tokenizer")


def check_fits(init_from: str, model_config: ModelConfig) -> None:
  """ConfigError naming config.init_from when the jaxpt run `init_from` names has no checkpoint or its params do
  not fit `model_config` (from the checkpoint's metadata: no arrays are read, nothing is written). An `hf:` start
  needs no check here: its model config is read from the checkpoint's own config.json."""
  if not init_from or hf_directory(init_from) is not None:
    return
  _, target, key = _run_target(init_from, model_config,
                               jax.eval_shape(lambda: init_params_of(model_config, jax.random.PRNGKey(0))))
  check_run_params(init_from, target, FIELD, key)  # a LoRA run's adapters, a QLoRA run's codes: as restored


def init_tokenizer(init_from: str, workdir: str, resuming: bool, model_config: ModelConfig):
  """The tokenizer of the run `init_from` names (jaxpt's sentencepiece `Tokenizer` or an `HFTokenizer`), from
  `workdir/tokenizer/`, where it is copied at the first launch; None for a random init (the trainer trains its
  own). A resumed run keeps its copy even if the source changed since. Called before any data work, it first
  checks the start: ConfigError naming config.init_from when it has no tokenizer, or one without EOS, or its params
  do not fit `model_config` (`check_fits`); nothing is copied into `workdir` then."""
  if not init_from:
    return None
  own = os.path.join(workdir, "tokenizer")
  source = _source_tokenizer_dir(init_from)
  kept = resuming and tokenizer_lib.has_tokenizer(own)
  if not kept and not tokenizer_lib.has_tokenizer(source):
    raise ConfigError(FIELD, f"{source}: no tokenizer (tokenizer.json or {tokenizer_lib.MODEL_FILE}; the run needs "
                      "the tokenizer its params were trained with)", init_from)
  if tokenizer_lib.load_tokenizer(own if kept else source).eos_id is None:
    raise ConfigError(FIELD, f"{source}: the tokenizer has no EOS token (eos_token in tokenizer_config.json), which "
                      "ends every training example and stops generation", init_from)
  check_fits(init_from, model_config)
  if not kept and jax.process_index() == 0:
    tokenizer_lib.copy_tokenizer(source, own)  # one writer; the others read it after the barrier
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("jaxpt_init_tokenizer")
  return tokenizer_lib.load_tokenizer(own)
