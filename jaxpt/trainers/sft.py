"""Supervised fine-tuning on a math task: response-only LM loss on prompt + response + EOS rows, on the shared loop.

    loss = sum_t w_t nll_t / sum_t w_t,  w_t = 1 where target t is a response token or the EOS (jaxpt.data.sft)

Eval (every `eval_every` steps and at the end) on the held-out split `eval_split` ('test', or 'validation': the
training-split problems after task.train_size, so a run calibrated on its eval never reads the test split):
eval_loss / eval_ppl / eval_accuracy (token) on its rows,
and eval_answer_accuracy: the share of the first `decode.eval_problems` held-out problems whose greedy response
earns reward 1 (jaxpt.rl.rewards.math_reward); with `decode.temperature > 0` also eval_sample_accuracy, the same
for one sampled response each at that temperature (fixed key, so comparable across steps). Responses come from
the KV-cache sampler (jaxpt.rl.sampler) on left-padded prompts, at most `decode.max_new_tokens` tokens.

Config (`SFTRunConfig`): a pretraining run config plus
    task       the task (`jaxpt.data.math_task.TaskConfig`); data.path is unused
    eval_split 'test' | 'validation' (the held-out problems the eval reads)
    decode     prompt_len, max_new_tokens, eval_problems, batch_size, temperature (eval decoding)
and `init_from` ('' = random init, else a workdir whose latest checkpoint's params start the run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import ConfigError, Section, at_least, from_section, one_of
from jaxpt.data import math_task
from jaxpt.data import sft as sft_data
from jaxpt.data.tokenizer import Tokenizer
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.progress import say
from jaxpt.rl.rewards import math_reward
from jaxpt.rl.sampler import SampleOutput, SamplingConfig, make_sampler
from jaxpt.engine.builder import training_mesh
from jaxpt.engine.init_from import init_tokenizer
from jaxpt.trainers.lm import make_lm_evaluator
from jaxpt.engine.run import BuiltRun
from jaxpt.trainers.pretrain import PretrainRunConfig, build_lm_run
from jaxpt.engine.record import check_launch, digest, resumes
from jaxpt.engine.state import TrainState


@dataclasses.dataclass(frozen=True)
class DecodeConfig(Section):
  """The `decode` section: how the eval decodes held-out problems for eval_answer_accuracy (greedy) and
  eval_sample_accuracy (one sampled response each).

  Attributes:
    prompt_len: tokens prompts are left-padded to.
    max_new_tokens: longest response, in tokens.
    eval_problems: how many held-out problems (the first ones) the accuracies are over; a multiple of batch_size.
    batch_size: problems decoded per batch.
    temperature: of the one sampled response per problem (eval_sample_accuracy); 0 = greedy only.
  """

  prompt_len: int = 64
  max_new_tokens: int = 40
  eval_problems: int = 256
  batch_size: int = 64
  temperature: float = 1.0

  def check(self) -> None:
    for field in ("prompt_len", "max_new_tokens", "batch_size"):
      at_least(self, field, 1)
    at_least(self, "eval_problems", 0)
    at_least(self, "temperature", 0.0)
    if self.eval_problems % self.batch_size:
      raise ConfigError("eval_problems", f"must be a multiple of config.decode.batch_size={self.batch_size}",
                        self.eval_problems)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTRunConfig(PretrainRunConfig):
  """An SFT run: a pretraining run config plus these sections.

  Attributes:
    task: the math task fine-tuned on and evaluated (data.path is unused).
    decode: eval decoding: prompt and response lengths, problems, temperature.
    eval_split: the held-out problems the eval reads: 'test' (task.test_size of them) or 'validation'
      (task.validation_size: training-split problems no run with this train_size trains on; the test split is then
      never read, e.g. when the run's steps or task are chosen on its eval).
  """

  task: math_task.TaskConfig = math_task.TaskConfig()
  decode: DecodeConfig = DecodeConfig()
  eval_split: str = "test"

  def check(self) -> None:
    super().check()
    one_of(self, "eval_split", sft_data.EVAL_SPLITS)
    size_field = f"{self.eval_split}_size"
    size = getattr(self.task, size_field)
    if self.eval_split == "validation" and size < 1:
      raise ConfigError("eval_split", "'validation' needs config.task.validation_size > 0", self.eval_split)
    if size and self.decode.eval_problems > size:
      raise ConfigError("decode.eval_problems", f"more than config.task.{size_field}={size}",
                        self.decode.eval_problems)
    if self.decode.prompt_len + self.decode.max_new_tokens > self.model.max_seq_len:
      raise ConfigError("decode.max_new_tokens", "decode.prompt_len + decode.max_new_tokens exceed "
                        f"config.model.max_seq_len={self.model.max_seq_len}", self.decode.max_new_tokens)


def answer_accuracy(sample: Callable[..., SampleOutput], params: Any, prompt_batches: Sequence[dict],
                    tokenizer: Tokenizer, rng: jax.Array) -> float:
  """Mean reward of one response per prompt over `prompt_batches` (PromptData batches), drawn with `sample`
  (jaxpt.rl.sampler.make_sampler) under key fold_in(rng, batch index)."""
  rewards = []
  for index, batch in enumerate(prompt_batches):
    out = sample(params, jnp.asarray(batch["prompt_tokens"]), jnp.asarray(batch["prompt_mask"]),
                 jax.random.fold_in(rng, index))
    tokens, mask = jax.device_get((out.tokens, out.mask))
    for row, row_mask, answer in zip(tokens, mask, batch["answers"]):
      rewards.append(math_reward(tokenizer.decode(row[row_mask > 0]), answer))
  return float(np.mean(rewards)) if rewards else float("nan")


def make_sft_evaluator(model_config: ModelConfig, eval_batches: Sequence[dict], prompt_batches: Sequence[dict],
                       tokenizer: Tokenizer, decode: DecodeConfig, seed: int) -> Callable[[TrainState], dict]:
  """evaluate(state) -> the LM eval metrics plus eval_answer_accuracy (greedy) and, if decode.temperature > 0,
  eval_sample_accuracy (see module docstring)."""
  lm_evaluate = make_lm_evaluator(TransformerLM(model_config), eval_batches)
  stops = dict(eos_id=tokenizer.eos_id, stop_ids=tokenizer.stop_ids)
  settings = {"eval_answer_accuracy": SamplingConfig(decode.max_new_tokens, greedy=True, **stops)}
  if decode.temperature > 0:
    settings["eval_sample_accuracy"] = SamplingConfig(decode.max_new_tokens, temperature=decode.temperature, **stops)
  samplers = {name: make_sampler(model_config, s, decode.prompt_len) for name, s in settings.items()}
  rng = jax.random.PRNGKey(seed)

  def evaluate(state: TrainState) -> dict:
    metrics = dict(lm_evaluate(state))
    if prompt_batches:
      for name, sample in samplers.items():
        metrics[name] = answer_accuracy(sample, state.params, prompt_batches, tokenizer, rng)
    return metrics

  return evaluate


def build(config: SFTRunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds the task's tokenizer (`init_from`'s, else one
  trained on the task and cached in `workdir/tokenizer`), SFT data and evaluator and hands them to the shared
  LM-run builder (jaxpt.trainers.pretrain.build_lm_run: model, optimizer, compiled step, init from
  `config.init_from`)."""
  config = from_section(SFTRunConfig, config, "config")
  mesh = training_mesh(config, config.data.batch_size)  # before any data work
  check_launch(workdir, config, {"corpus": digest(f"task|{config.task.train_identity}")})
  data_dir = config.task.data_dir(workdir)
  say(f"preparing the task's data and tokenizer in {workdir} ...")
  tokenizer = init_tokenizer(config.init_from, workdir, resumes(workdir), config.model)
  if tokenizer is None:
    tokenizer = math_task.task_tokenizer(config.task, config.model.vocab_size, workdir, data_dir,
                                        keep_existing=resumes(workdir))
  data = sft_data.SFTData.create_for_task(config.task, config.data, tokenizer, config.seed, workdir, data_dir,
                                          eval_split=config.eval_split)
  problems = math_task.task_problems(config.task, config.eval_split, data_dir)[:config.decode.eval_problems]
  prompt_batches = math_task.prompt_batches(tokenizer, problems, config.decode.batch_size, config.decode.prompt_len,
                                           prompt_format=config.task.prompt_format)
  return build_lm_run("sft", config, mesh, data, lambda eval_batches: make_sft_evaluator(
      config.model, eval_batches, prompt_batches, tokenizer, config.decode, config.seed))
