"""The frozen TEACHER of KDRL (`config.grpo.teacher`): a language model that scores the student's rollouts on the
run's mesh, for the knowledge-distillation term of the policy loss (`jaxpt.losses.grpo.kd_term`).

    load_teacher(source, layout, tokenizer, temperature, length)  -> Teacher(config, params, logprobs)

`source` is a jaxpt run's workdir (its latest checkpoint's params, read as `init_from` reads them: a PPO run's
policy, a LoRA or QLoRA run's adapters merged; its model config from its config.json) or
'hf:DIR' (a Hugging Face checkpoint: model config from DIR's config.json, weights streamed into their shardings).
The teacher may be another size than the policy (its params are sharded by the run's rules on the same mesh) but
must share its tokenizer: the token ids the policy samples are the ids the teacher scores. `Teacher.logprobs` is
`response_logprobs` of the teacher compiled on the mesh, as the collector's is for the policy and the reference.
Every check raises a one-line ConfigError naming config.grpo.teacher.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt import parallel
from jaxpt.config import ConfigError, DataError, from_section
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.models import hf, hf_config
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.rl.logprobs import response_logprobs
from jaxpt.engine.init_from import hf_directory, run_params
from jaxpt.engine.record import NoRunRecord, recorded_config

FIELD = "config.grpo.teacher"


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A loaded teacher: its model config, params (on the mesh) and compiled teacher-forced log-probs
  logprobs(params, prompt_tokens, prompt_mask, tokens, mask) -> [N, T] (0 off the mask)."""

  config: ModelConfig
  params: Any
  logprobs: Callable


def teacher_model_config(source: str) -> ModelConfig:
  """The model config of the teacher `source` names (run workdir or 'hf:DIR'); ConfigError naming the field."""
  directory = hf_directory(source)
  if directory is not None:
    try:
      return hf_config.read_config(directory)
    except DataError as e:
      raise ConfigError(FIELD, str(e), source) from None
  path = os.path.expanduser(source)
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise ConfigError(FIELD, "no checkpoints/ folder there (expected the workdir of a jaxpt language-model run, or "
                      "'hf:DIR')", source)
  try:
    model = recorded_config(path).get("model")
  except NoRunRecord as e:
    raise ConfigError(FIELD, str(e), source) from None
  if not isinstance(model, dict):
    raise ConfigError(FIELD, "its config.json has no model section (not a language-model run)", source)
  return from_section(ModelConfig, model, f"{FIELD}'s model")


def teacher_tokenizer(source: str) -> Any:
  directory = hf_directory(source)
  directory = directory if directory is not None else os.path.join(os.path.expanduser(source), "tokenizer")
  if not tokenizer_lib.has_tokenizer(directory):
    raise ConfigError(FIELD, f"{directory}: no tokenizer (the teacher must share the policy's)", source)
  return tokenizer_lib.load_tokenizer(directory)


def load_teacher(source: str, layout: parallel.MeshLayout, tokenizer: Any, temperature: float,
                 length: int) -> Teacher:
  """The teacher `source` names, its params sharded by `layout`'s rules on its mesh, its log-probs compiled for
  `layout`'s batch sharding. ConfigError naming config.grpo.teacher when it has no checkpoint or tokenizer, its
  tokenizer is not `tokenizer` (the policy's), it has fewer embedding rows than the tokenizer has tokens or fewer
  positions than `length` (prompt + response), its params do not split on the mesh, or they do not restore. (Ids
  past the tokenizer's, which only an untrained policy's padding rows could sample, are not checked against the
  teacher's rows.)"""
  config = teacher_model_config(source)
  if teacher_tokenizer(source).model_proto != tokenizer.model_proto:
    raise ConfigError(FIELD, "its tokenizer is not the policy's (the teacher must score the policy's token ids)",
                      source)
  if config.vocab_size < tokenizer.vocab_size:
    raise ConfigError(FIELD, f"its model has {config.vocab_size} embedding rows, fewer than the tokenizer's "
                      f"{tokenizer.vocab_size} tokens", source)
  if config.max_seq_len < length:
    raise ConfigError(FIELD, f"its model has {config.max_seq_len} positions, fewer than the "
                      f"{length} of a prompt and its response", source)
  model = TransformerLM(config)
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  try:
    parallel.check_param_divisibility(boxed, layout.mesh, layout.rules)
  except ConfigError as e:
    raise ConfigError(FIELD, f"its model does not split on the run's mesh ({e})", source) from None
  shardings = parallel.param_shardings(boxed, layout.mesh, layout.rules)
  directory = hf_directory(source)
  if directory is None:
    template = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.meta.unbox(boxed),
                            shardings)
    params = run_params(os.path.expanduser(source), config, template, FIELD)  # PPO: its policy; LoRA: merged
  else:
    try:
      params = hf.load_params(directory, config, shardings=shardings)
    except DataError as e:
      raise ConfigError(FIELD, str(e), source) from None
  logprobs = layout.jit(lambda p, *arrays: response_logprobs(model, p, *arrays, temperature=temperature),
                        layout.batch, in_shardings=(shardings,) + (layout.batch,) * 4)
  return Teacher(config=config, params=params, logprobs=logprobs)

