"""The math task of SFT and RL: its config section, problems, tokenizer, prompt text and RL prompt batches.

The task config (`config.task`, a `TaskConfig`):
    name            'arithmetic' (embedded generator, jaxpt.data.arithmetic) | 'gsm8k' (local jsonl folder) |
                    'multipath' (the arithmetic knobs, '+' / '-' only: answers reached by several solution paths,
                    jaxpt.data.multipath)
    num_steps, max_value, ops, max_factor, allow_negative, test_fraction   arithmetic / multipath difficulty knobs
    train_size, test_size   problems per split (gsm8k: at most this many, 0 = all)
    seed            the generator's seed (arithmetic)
    path            gsm8k: folder with train.jsonl / test.jsonl
    tfds_data_dir   gsm8k: where its TFDS dataset is built ('' = the caller's choice, else ~/tensorflow_datasets)
    prompt_format   'plain' | 'chat' (the tokenizer's chat template; see `prompt_text`)

Text: prompt = math_prompts.format_prompt(question) (plain) or the chat template's rendering of one user turn
(chat), response = math_prompts.format_response(solution, answer), tokenized separately (SFT examples:
`jaxpt.data.sft`). RL prompts (`PromptData`, sized by the GRPO run's `data` section, `PromptDataConfig`):
prompt_tokens / prompt_mask int32 [B, P], left-padded, with the answers the verifier checks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from jaxpt.config import ConfigError, Section, at_least, fail, from_section, one_of
from jaxpt.data import arithmetic, gsm8k, multipath, order
from jaxpt.data import tokenizer as tokenizer_lib
from jaxpt.data.arithmetic import Problem
from jaxpt.data.math_prompts import format_prompt, format_response

TASKS = ("arithmetic", "gsm8k", "multipath")
GENERATED = {"arithmetic": arithmetic, "multipath": multipath}  # the embedded generators: generate, VERSION
# The user turn of a chat-format prompt: the question, then the instruction Qwen2.5-Math's evaluation uses.
CHAT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_LEN_FIELD = "config.data.max_prompt_len"  # the RL run config's prompt length (PromptData)
_KNOBS = tuple(f.name for f in dataclasses.fields(arithmetic.ArithmeticConfig))
_ARITHMETIC = arithmetic.ArithmeticConfig



@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
  """The `task` config section (see the module docstring); the arithmetic knobs default to ArithmeticConfig's.

  Attributes:
    name: 'arithmetic' (the embedded generator, jaxpt.data.arithmetic) | 'gsm8k' (a local jsonl folder) |
      'multipath' (jaxpt.data.multipath: the arithmetic knobs with ops in '+-', several solution paths each).
    train_size: training problems (gsm8k: at most this many, 0 = all).
    test_size: held-out problems (gsm8k: at most this many, 0 = all).
    validation_size: problems of the training split after its first train_size, which a run with this train_size
      never trains on: the 'validation' eval set, for choosing hyper-parameters without the test set (0 = none).
    seed: the generator's seed (arithmetic).
    path: gsm8k: the folder with train.jsonl / test.jsonl.
    tfds_data_dir: gsm8k: where its TFDS dataset is built ('' = the caller's choice, else ~/tensorflow_datasets).
    num_steps: arithmetic: operations per problem.
    max_value: arithmetic: the start value and +/- operands are drawn from [1, max_value].
    ops: arithmetic: the operations to draw from (a subset of '+-*').
    max_factor: arithmetic: '*' operands are drawn from [2, max_factor].
    allow_negative: arithmetic: if False, every running total stays >= 0.
    test_fraction: arithmetic: share of the arithmetic contents (numbers, ops) held out for the 'test' split.
    prompt_format: 'plain' ("Question: ...\nAnswer:\n", jaxpt.data.math_prompts) | 'chat' (one user turn, the
      question + CHAT_INSTRUCTION, rendered by the tokenizer's chat template with the generation prompt: for
      instruct models started from `init_from='hf:DIR'`).
  """

  name: str = "arithmetic"
  train_size: int = 20000
  test_size: int = 512
  validation_size: int = 0
  seed: int = 0
  path: str = ""
  tfds_data_dir: str = ""
  num_steps: int = _ARITHMETIC.num_steps
  max_value: int = _ARITHMETIC.max_value
  ops: str = _ARITHMETIC.ops
  max_factor: int = _ARITHMETIC.max_factor
  allow_negative: bool = _ARITHMETIC.allow_negative
  test_fraction: float = _ARITHMETIC.test_fraction
  prompt_format: str = "plain"

  @property
  def arithmetic(self) -> arithmetic.ArithmeticConfig | None:
    """The arithmetic generator's knobs (None for the other tasks)."""
    return arithmetic.ArithmeticConfig(**self._knobs()) if self.name == "arithmetic" else None

  @property
  def generator_knobs(self) -> arithmetic.ArithmeticConfig | None:
    """The embedded generator's knobs (arithmetic, multipath; None for gsm8k)."""
    return arithmetic.ArithmeticConfig(**self._knobs()) if self.name in GENERATED else None

  def _knobs(self) -> dict[str, Any]:
    return {k: getattr(self, k) for k in _KNOBS}

  def check(self) -> None:
    one_of(self, "name", TASKS)
    one_of(self, "prompt_format", tokenizer_lib.PROMPT_FORMATS)
    for field in ("train_size", "test_size", "validation_size", "seed"):
      at_least(self, field, 0)
    if self.validation_size and not self.train_size:
      raise fail(self, "validation_size", "needs task.train_size > 0 (validation problems follow the training ones)")
    if self.name in GENERATED:
      for field in ("train_size", "test_size"):
        if getattr(self, field) < 1:
          raise fail(self, field, f"must be >= 1 for the {self.name} task")
      arithmetic.ArithmeticConfig(**self._knobs())  # the knobs' own checks
      if self.name == "multipath" and set(self.ops) - set(multipath.OPS):
        raise fail(self, "ops", "must be a subset of '+-' for the multipath task (the changes' order is free)")
      if self.name == "multipath" and self.num_steps > multipath.MAX_STEPS:
        raise fail(self, "num_steps", f"must be <= {multipath.MAX_STEPS} for the multipath task")
    elif not all(os.path.isfile(os.path.join(self.path, f"{s}.jsonl")) for s in gsm8k.SPLITS):
      raise fail(self, "path", "must be a folder with train.jsonl and test.jsonl")

  def data_dir(self, workdir: str) -> str:
    """Where the task's TFDS data is built for a run in `workdir`: tfds_data_dir, else WORKDIR/tfds."""
    return self.tfds_data_dir or os.path.join(workdir, "tfds")

  @property
  def train_identity(self) -> str:
    """A string naming the training split's text exactly (knobs, train_size, seed; gsm8k: a hash of the files),
    the tokenizer's cache key: test_size and tfds_data_dir do not change it."""
    knobs = self.generator_knobs
    fields = {"name": self.name, "train_size": self.train_size, "seed": self.seed, "path": self.path,
              "arithmetic": None if knobs is None else dataclasses.asdict(knobs)}
    if self.name == "gsm8k":
      fields["path"] = gsm8k.fingerprint(self.path)
    else:
      fields["version"] = GENERATED[self.name].VERSION
    return json.dumps(fields, sort_keys=True)


def task_config(task: TaskConfig | Any) -> TaskConfig:
  """`task` as a checked TaskConfig (a `task` section is converted; ConfigError naming `config.task.<field>`)."""
  return from_section(TaskConfig, task, "config.task")


def task_problems(task: TaskConfig | Any, split: str, data_dir: str | None = None) -> list[Problem]:
  """The problems of `split` ('train' | 'test' | 'validation': the training split's problems train_size ..
  train_size + validation_size - 1). gsm8k builds its TFDS dataset under `data_dir` if given, else
  `task.tfds_data_dir`, else ~/tensorflow_datasets."""
  task = task_config(task)
  if split == "validation":
    extended = dataclasses.replace(task, train_size=task.train_size + task.validation_size, validation_size=0)
    return task_problems(extended, "train", data_dir)[task.train_size:]
  if task.name in GENERATED:
    size = task.train_size if split == "train" else task.test_size
    try:
      return GENERATED[task.name].generate(task.generator_knobs, size, task.seed, split)
    except ValueError as e:  # the knobs cannot supply that many distinct problems
      raise ConfigError(f"config.task.{split}_size", str(e), size) from None
  data_dir = data_dir or task.tfds_data_dir or os.path.expanduser("~/tensorflow_datasets")
  problems = gsm8k.load_gsm8k(task.path, data_dir, split)
  size = task.train_size if split == "train" else task.test_size
  return problems[:size] if size else problems


def prompt_message(question: str, prompt_format: str = "plain") -> str:
  """What the policy is asked about `question`, before any chat template: 'plain', the whole prompt
  ("Question: ...\nAnswer:\n"); 'chat', the user turn (the question and CHAT_INSTRUCTION). A reward model of
  another tokenizer or prompt format reads it as the prompt of (prompt, response) (`jaxpt.rl.reward_sources`)."""
  return format_prompt(question) if prompt_format == "plain" else f"{question.strip()}\n{CHAT_INSTRUCTION}"


def prompt_text(question: str, tokenizer: Any = None, prompt_format: str = "plain") -> str:
  """The model's input for `question` in `prompt_format` (see TaskConfig.prompt_format): `prompt_message`, in
  'chat' rendered by the tokenizer's chat template (ConfigError naming config.task.prompt_format without one)."""
  message = prompt_message(question, prompt_format)
  if prompt_format == "plain":
    return message
  return tokenizer_lib.chat_prompt(tokenizer, message, "config.task.prompt_format")


def example_text(problem: Problem, tokenizer: Any = None, prompt_format: str = "plain") -> tuple[str, str]:
  """(prompt, response) text of a problem (see `prompt_text`)."""
  return (prompt_text(problem.question, tokenizer, prompt_format),
          format_response(problem.solution, problem.answer))


def task_tokenizer(task: TaskConfig | Any, vocab_size: int, workdir: str, data_dir: str | None = None,
                   keep_existing: bool = False) -> tokenizer_lib.Tokenizer:
  """SentencePiece (jaxpt.data.tokenizer.load_or_train) trained on the training split's prompt + response texts,
  cached in `workdir/tokenizer`: any run (SFT, GRPO) with the same training split (TaskConfig.train_identity)
  and vocab_size reuses it; another task trains another one (kept beside it in the cache). keep_existing: the run
  resumes, so its tokenizer is kept as it is."""
  task = task_config(task)

  def documents() -> list[str]:
    return ["".join(example_text(p)) for p in task_problems(task, "train", data_dir)]

  return tokenizer_lib.load_or_train(os.path.join(workdir, "tokenizer"), vocab_size, f"task|{task.train_identity}",
                                     documents, keep_existing=keep_existing)



def encode_prompts(tokenizer: tokenizer_lib.Tokenizer, questions: Sequence[str], prompt_len: int,
                   field: str = "config.decode.prompt_len", prompt_format: str = "plain"
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded prompt tokens: (tokens int32 [N, P], mask int32 [N, P]) with each prompt's tokens rightmost,
  mask 1 on them and 0 (token 0) on the padding to their left. A longer prompt raises ConfigError naming `field`."""
  encoded = tokenizer_lib.encode_prompts_as_trained(tokenizer, [prompt_text(q, tokenizer, prompt_format)
                                                                for q in questions], prompt_format == "chat")
  tokens = np.zeros((len(encoded), prompt_len), np.int32)
  mask = np.zeros((len(encoded), prompt_len), np.int32)
  for i, ids in enumerate(encoded):
    if len(ids) > prompt_len:
      raise ConfigError(field, f"prompt {i} ({questions[i][:60]!r}...) has {len(ids)} tokens", prompt_len)
    if ids:
      tokens[i, prompt_len - len(ids):] = ids
      mask[i, prompt_len - len(ids):] = 1
  return tokens, mask


def _prompt_batch(tokens: np.ndarray, mask: np.ndarray, problems: Sequence[Problem]) -> dict[str, Any]:
  return {"prompt_tokens": tokens, "prompt_mask": mask, "answers": [p.answer for p in problems],
          "questions": [p.question for p in problems]}


def prompt_batches(tokenizer: tokenizer_lib.Tokenizer, problems: Sequence[Problem], batch_size: int,
                   prompt_len: int, field: str = "config.decode.prompt_len", prompt_format: str = "plain"
                   ) -> list[dict[str, Any]]:
  """`problems` in order as PromptData batches of `batch_size` (the last may be smaller); a prompt longer than
  `prompt_len` tokens raises ConfigError naming `field`."""
  tokens, mask = encode_prompts(tokenizer, [p.question for p in problems], prompt_len, field, prompt_format)
  return [_prompt_batch(tokens[i:i + batch_size], mask[i:i + batch_size], problems[i:i + batch_size])
          for i in range(0, len(problems), batch_size)]


class PromptData:
  """Prompt batches for RL: batch(step) is a function of (seed, step): step k takes problems [k B, (k + 1) B) of
  the stream of epoch permutations (permutation of epoch e drawn from (seed, e)). refill_batch(i) reads batch i of
  a second, independent stream of the same problems (permutations from (seed, e, 1)): extra prompts drawn by
  position (DAPO dynamic sampling), so they too are a function of (seed, i) and a resumed run draws the same.

  batch(step) / each batch of eval_sets():
    prompt_tokens int32 [B, P]  prompt_text(question) tokens, LEFT-padded with 0 (real tokens rightmost)
    prompt_mask   int32 [B, P]  1 on real prompt tokens, 0 on padding
    answers       list[str]     the exact answers (host-side; score with jaxpt.rl.rewards.math_reward(response, answer))
    questions     list[str]     the question texts
  """

  def __init__(self, train: Sequence[Problem], eval_problems: dict[str, Sequence[Problem]],
               tokenizer: tokenizer_lib.Tokenizer, batch_size: int, prompt_len: int, seed: int,
               prompt_format: str = "plain"):
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size}: must be >= 1")
    if not train:
      raise ValueError("PromptData: no training problems")
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.prompt_len = prompt_len
    self.seed = seed
    self.prompt_format = prompt_format
    self.train = list(train)
    self.eval_problems = {k: list(v) for k, v in eval_problems.items()}
    self._train_tokens = encode_prompts(tokenizer, [p.question for p in self.train], prompt_len, PROMPT_LEN_FIELD,
                                        prompt_format)
    self._order = order.StepOrder(seed, len(self.train), batch_size)
    self._refill_order = order.StepOrder(seed, len(self.train), batch_size, stream=1)

  @classmethod
  def create(cls, task: TaskConfig | Any, tokenizer: tokenizer_lib.Tokenizer, batch_size: int, prompt_len: int,
             seed: int, data_dir: str | None = None) -> "PromptData":
    """Train problems, and as held-out sets the test problems ('test') and, for the arithmetic task, their
    perturbed variants 'test_rename', 'test_distractor', 'test_numbers' (problem i perturbed with seed i; new
    numbers are drawn from the test split's arithmetic contents, never the training split's); with
    task.validation_size also 'validation'."""
    test = task_problems(task, "test", data_dir)
    eval_problems = {"test": test}
    if task_config(task).validation_size:
      eval_problems["validation"] = task_problems(task, "validation", data_dir)
    if task_config(task).name == "arithmetic":
      test_fraction = task_config(task).test_fraction
      for kind in arithmetic.PERTURBATIONS:
        eval_problems[f"test_{kind}"] = [arithmetic.perturb(p, kind, seed=i, test_fraction=test_fraction)
                                         for i, p in enumerate(test)]
    return cls(task_problems(task, "train", data_dir), eval_problems, tokenizer, batch_size, prompt_len,
               seed, task_config(task).prompt_format)

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict[str, Any]:
    """The prompts of `step` (see class docstring); process `process_index` of `process_count` gets its
    contiguous B / process_count of them (`jaxpt.data.order`)."""
    return self._rows_batch(self._order.rows(step, process_index, process_count))

  def refill_batch(self, index: int, process_index: int = 0, process_count: int = 1) -> dict[str, Any]:
    """Batch `index` of the refill stream (see class docstring); same layout and process slices as `batch`."""
    return self._rows_batch(self._refill_order.rows(index, process_index, process_count))

  def _rows_batch(self, rows: np.ndarray) -> dict[str, Any]:
    tokens, mask = self._train_tokens
    return _prompt_batch(tokens[rows], mask[rows], [self.train[i] for i in rows])

  def eval_sets(self) -> dict[str, list[dict[str, Any]]]:
    """{'test', 'test_rename', 'test_distractor', 'test_numbers'} (gsm8k: 'test' only) -> batches of B problems
    in order (the last batch may be smaller)."""
    return {name: prompt_batches(self.tokenizer, problems, self.batch_size, self.prompt_len, PROMPT_LEN_FIELD,
                                 self.prompt_format)
            for name, problems in self.eval_problems.items()}


@dataclasses.dataclass(frozen=True)
class PromptDataConfig(Section):
  """The `data` section of GRPO runs.

  Attributes:
    prompts_per_step: B, prompts per training step (each sampled group_size times).
    max_prompt_len: P, tokens prompts are left-padded to.
    eval_prompts: held-out problems per eval set, each decoded greedily (0 = no eval).
    eval_samples: k: each of those problems is also sampled k times with the training sampler's settings
      (sampling.temperature, default 1), giving the sampled pass@1 `eval_pass1_<set>` = the mean correctness over
      problems and samples (0 = greedy only). The eval keys are fixed, so every checkpoint and every run is
      scored on the same random draws.
  """

  prompts_per_step: int = 8
  max_prompt_len: int = 64
  eval_prompts: int = 128
  eval_samples: int = 0

  def check(self) -> None:
    at_least(self, "prompts_per_step", 1)
    at_least(self, "max_prompt_len", 1)
    at_least(self, "eval_prompts", 0)
    at_least(self, "eval_samples", 0)
