"""SFT examples of the math task (`jaxpt.data.math_task`): prompt + response + EOS rows, loss on the response.

An example is prompt + response + EOS (for an instruct model's tokenizer, EOS is its end-of-turn token), the prompt
and the response tokenized separately (`math_task.example_text`); `SFTData` serves them as LM batches [B, S] whose
weights are 1 only on response tokens and the EOS (`response_only`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxpt.config import ConfigError, from_section
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.data.arithmetic import Problem
from jaxpt.data.config import LMDataConfig
from jaxpt.data.math_task import TaskConfig, example_text, task_config, task_problems
from jaxpt.data.pipeline import LMData

PROMPT_SEGMENT, RESPONSE_SEGMENT = 1, 2
EVAL_SPLITS = ("test", "validation")  # the held-out problems SFTData's eval rows come from


def encode_examples(tokenizer: tokenizer_lib.Tokenizer, problems: Sequence[Problem], seq_len: int,
                    field: str = "config.data.seq_len", prompt_format: str = "plain") -> tuple[np.ndarray, np.ndarray]:
  """Rows of prompt + response + EOS, right-padded with 0 (prompts in `prompt_format`, see `prompt_text`).

  Returns (tokens int32 [N, seq_len], segments int32 [N, seq_len]): segments 1 on prompt tokens, 2 on response
  tokens and the EOS, 0 on padding. A longer example raises ConfigError naming `field`.
  """
  texts = [example_text(p, tokenizer, prompt_format) for p in problems]
  prompts = tokenizer_lib.encode_prompts_as_trained(tokenizer, [t[0] for t in texts], prompt_format == "chat")
  responses = tokenizer.encode_batch([t[1] for t in texts])
  tokens = np.zeros((len(problems), seq_len), np.int32)
  segments = np.zeros((len(problems), seq_len), np.int32)
  for i, (prompt, response) in enumerate(zip(prompts, responses)):
    length = len(prompt) + len(response) + 1
    if length > seq_len:
      raise ConfigError(field, f"example {i} ({problems[i].question[:60]!r}...) has {length} tokens "
                        "(prompt + response + EOS)", seq_len)
    tokens[i, :length] = prompt + response + [tokenizer.eos_id]
    segments[i, :len(prompt)] = PROMPT_SEGMENT
    segments[i, len(prompt):length] = RESPONSE_SEGMENT
  return tokens, segments


def response_only(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """An SFT batch from `packing.make_batch` of rows whose segments mark prompt (1) and response (2) tokens:
  one segment per row (segment_ids 1 on real tokens, positions 0, 1, ... from the row start), weights 1 only where
  the target is a response token or the EOS."""
  segments = batch["segment_ids"]
  real = segments > 0
  weights = np.zeros(segments.shape, np.float32)
  weights[:, :-1] = segments[:, 1:] == RESPONSE_SEGMENT
  positions = np.where(real, np.arange(segments.shape[1], dtype=np.int32), 0).astype(np.int32)
  return dict(batch, segment_ids=real.astype(np.int32), positions=positions, weights=weights)


class SFTData(LMData):
  """SFT batches: one example per row, a function of (seed, step) (epoch permutations of the training problems,
  as in LMData), resumable. Build with `SFTData.create_for_task`.

  train_batch(step) / eval_batches(), numpy, B = data.batch_size, S = data.seq_len:
    inputs      int32   [B, S]  prompt + response + EOS tokens, right-padded with 0
    targets     int32   [B, S]  inputs shifted left by one (last column 0)
    weights     float32 [B, S]  1.0 where targets[t] is a response token or the EOS, else 0 (prompt, padding)
    positions   int32   [B, S]  0, 1, ... along the example; 0 at padding
    segment_ids int32   [B, S]  1 on the example's tokens, 0 at padding
  eval_batches(): data.eval_batches batches of the held-out problems (`eval_split`: 'test' or 'validation'),
  always the same.
  """

  @classmethod
  def create_for_task(cls, task: TaskConfig | Any, data_config: LMDataConfig | Any,
                      tokenizer: tokenizer_lib.Tokenizer, seed: int, workdir: str,
                      data_dir: str | None = None, eval_split: str = "test") -> "SFTData":
    """Encodes the task's train problems and its `eval_split` problems ('test' | 'validation') with `tokenizer`;
    ConfigError naming the field on bad config."""
    config = from_section(LMDataConfig, data_config, "config.data")
    if eval_split not in EVAL_SPLITS:
      raise ConfigError("config.eval_split", f"must be one of {EVAL_SPLITS}", eval_split)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
      raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    prompt_format = task_config(task).prompt_format
    train = encode_examples(tokenizer, task_problems(task, "train", data_dir), config.seq_len,
                            prompt_format=prompt_format)
    test = encode_examples(tokenizer, task_problems(task, eval_split, data_dir), config.seq_len,
                           prompt_format=prompt_format)
    arrays = {"train_tokens": train[0], "train_segments": train[1], "eval_tokens": test[0],
              "eval_segments": test[1]}
    data = cls(config, tokenizer, int(seed), arrays, workdir, corpus_id=f"task|{task_config(task).train_identity}")
    needed = config.eval_batches * config.batch_size
    if data.num_eval_rows < needed:
      raise ConfigError("config.data.eval_batches", f"needs {needed} held-out problems (data.batch_size="
                        f"{config.batch_size}), but task.{eval_split}_size gives {data.num_eval_rows}",
                        config.eval_batches)
    return data

  def train_batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict[str, np.ndarray]:
    """This process's rows of the batch of `step` (see class docstring); [B / P, S]."""
    return response_only(super().train_batch(step, process_index, process_count))

  def eval_batches(self, process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    return [response_only(b) for b in super().eval_batches(process_index, process_count)]

