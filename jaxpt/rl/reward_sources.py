"""Reward sources composed by config: the `reward` section an RL run reads, the reward assembly, the RM source.

Per rollout i of a step (N rows; scores_i the verifier's, `reward_fn(text, answer)`; dapo_i DAPO's soft overlong
punishment, 0 when off; rm_i a reward model's score, ODIN's quality head; truncated_i: no EOS in the response):

    raw_i  = verifier_weight * scores_i + dapo_i + model_weight * rm_i - eos_missing_penalty * truncated_i
    norm_i = raw_i                                    normalize 'none'
           = (raw_i - mean(raw)) / std(raw)           'batch' (whitening; a constant batch, std <= EPS (1 +
                                                      |mean|): raw_i - mean)
           = (raw_i - mu) / sigma                     'running': mu, sigma^2 over every reward so far, this step's
                                                      included (Chan's parallel update of count, mean, M2)
    reward = clip(norm, -clip, clip)                  (clip 0 = off)

`raw_rewards` is the first line (also on the host: DAPO's dynamic sampling filters groups on it, `jaxpt.rl.dapo`);
`assemble_rewards` is the whole statement (jax.numpy, jitted by the trainer; the running statistics are a pytree the
trainer keeps in its TrainState's `aux`, so they are checkpointed and resume bitwise). The per-token KL penalty in
the reward stays the trainer's one mechanism (`grpo.kl_in_reward`), applied after this assembly. With the default
section (verifier only, weight 1, no options) the trainer skips the assembly: the rewards are today's, bit for bit.

`RewardModelSource` scores rollouts with a jaxpt reward model (`reward.model`, a `jaxpt rm` run directory, loaded by
the trainer: `jaxpt.engine.saved_model`), compiled on the run's mesh with its params sharded by the run's rules like
the reference policy's. When the RM's tokenizer is the policy's and it was trained on prompts formatted the same way,
it reads the rollouts' own tokens (`rm_sequences`: per row prompt without its left padding + response + EOS,
right-padded, and the index of its last token: the layout of `jaxpt.data.preference_batches`); otherwise it scores
(prompt, response) texts re-tokenized with its own tokenizer, as `jaxpt.Model.score` does: the prompt is what the
policy was asked before any chat template (`jaxpt.data.math_task.prompt_message` of the row's question: a chat
policy's decoded prompt tokens would hand the RM its template as text), rendered as the RM was trained (plain, or one
user turn of its chat template); the response is the policy's tokens decoded.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxpt import parallel
from jaxpt.config import ConfigError, Section, fail, in_range, one_of
from jaxpt.data.math_task import prompt_message
from jaxpt.data.preference_batches import response_sequences
from jaxpt.data.tokenizer import chat_prompt, encode_prompts_as_trained
from jaxpt.models.reward import RewardModel
from jaxpt.progress import say
from jaxpt.rl.rollouts import response_texts

NORMALIZE = ("none", "batch", "running")
EPS = 1e-5  # a std <= EPS (1 + |mean|) counts as constant (float32 rounding): only the mean is subtracted
QUALITY_HEAD = 0  # ODIN's score columns: quality, length; the RL reward reads quality only


@dataclasses.dataclass(frozen=True)
class RewardConfig(Section):
  """The `reward` section: the reward's sources, their weights and its shaping (see the module docstring).

  Attributes:
    verifier_weight: weight of the verifier's score (today's math verifier, or the `reward_fn` a run is given).
    model: a jaxpt reward-model run directory (`jaxpt rm`) or `hf:DIR` (such a run written by `jaxpt export-hf`,
      or a transformers sequence classifier), scored on the run's mesh ('' = none); ODIN's quality head only.
    model_weight: weight of the reward model's score (read when `model` is set).
    clip: rewards clipped to [-clip, clip] after normalisation (0 = off).
    normalize: 'none' | 'batch' (each step's rewards whitened to mean 0, std 1) | 'running' (mean and std over
      every reward so far, checkpointed with the run).
    eos_missing_penalty: subtracted from the raw reward of each rollout that ends without EOS (truncated at
      sampling.max_new_tokens).
  """

  verifier_weight: float = 1.0
  model: str = ""
  model_weight: float = 1.0
  clip: float = 0.0
  normalize: str = "none"
  eos_missing_penalty: float = 0.0

  def check(self) -> None:
    for name in ("verifier_weight", "model_weight", "clip", "eos_missing_penalty"):
      in_range(self, name, 0.0)
    one_of(self, "normalize", NORMALIZE)
    if self.model and self.model_weight == 0:
      raise fail(self, "model_weight", f"is 0: the reward model {self.model} would be loaded and scored for nothing")
    if self.verifier_weight == 0 and not self.model:
      raise fail(self, "verifier_weight", "is 0 and no reward.model is set: the reward has no source")

  @property
  def is_default(self) -> bool:
    """Verifier only, weight 1, no shaping: the rewards are the collector's as they are."""
    return self == RewardConfig()

  @property
  def uses_model(self) -> bool:
    return bool(self.model)


def init_running_stats() -> dict:
  """The running normalisation's statistics before any reward: count, mean, M2 (float32 scalars)."""
  return {"count": jnp.zeros((), jnp.float32), "mean": jnp.zeros((), jnp.float32), "m2": jnp.zeros((), jnp.float32)}


def _scale(std: jax.Array, mean: jax.Array) -> jax.Array:
  """The divisor of the normalisation: std, or 1 for rewards constant up to float32 rounding."""
  return jnp.where(std > EPS * (1 + jnp.abs(mean)), std, 1.0)


def raw_rewards(settings: RewardConfig, scores: Any, rm_scores: Any, extra: Any, truncated: Any, xp: Any = jnp) -> Any:
  """raw float32 [N] = verifier_weight * scores + extra + model_weight * rm_scores - eos_missing_penalty * truncated
  (the module docstring's first line), in `xp` (jax.numpy, or numpy on the host). scores, rm_scores (zeros without
  a model), extra (DAPO's punishment) float [N]; truncated bool [N]."""
  f32 = lambda x: xp.asarray(x, xp.float32)
  return (settings.verifier_weight * f32(scores) + f32(extra) + settings.model_weight * f32(rm_scores)
          - settings.eos_missing_penalty * f32(truncated))


def assemble_rewards(settings: RewardConfig, scores: jax.Array, rm_scores: jax.Array, extra: jax.Array,
                     truncated: jax.Array, stats: dict | None = None) -> tuple[jax.Array, dict | None]:
  """(rewards float32 [N], the updated running statistics, or `stats` unchanged when not 'running'): the module
  docstring's statement; the arrays as `raw_rewards` takes them."""
  raw = raw_rewards(settings, scores, rm_scores, extra, truncated)
  if settings.normalize == "batch":
    mean, std = jnp.mean(raw), jnp.std(raw)
    raw = (raw - mean) / _scale(std, mean)
  elif settings.normalize == "running":
    n = jnp.asarray(raw.shape[0], jnp.float32)
    batch_mean = jnp.mean(raw)
    batch_m2 = jnp.sum(jnp.square(raw - batch_mean))
    count = stats["count"] + n
    delta = batch_mean - stats["mean"]
    mean = stats["mean"] + delta * n / count
    m2 = stats["m2"] + batch_m2 + jnp.square(delta) * stats["count"] * n / count
    raw = (raw - mean) / _scale(jnp.sqrt(m2 / count), mean)
    stats = {"count": count, "mean": mean, "m2": m2}
  if settings.clip > 0:
    raw = jnp.clip(raw, -settings.clip, settings.clip)
  return raw, stats


def rm_sequences(prompt_tokens: jax.Array, prompt_mask: jax.Array, tokens: jax.Array, mask: jax.Array, *,
                 eos_id: int, pad_id: int, vocab_limit: int, seq_len: int,
                 stop_ids: Sequence[int] = ()) -> tuple[jax.Array, jax.Array]:
  """Rollouts in the reward model's layout: (tokens int32 [N, S], last int32 [N]).

  Row i: its prompt's real tokens (prompt_mask 1; the prompt is left-padded), its response's tokens (mask 1, the
  sampler's stop token, EOS or another of `stop_ids`, and ids >= vocab_limit, which have no text, left out), then
  EOS; right-padded with pad_id to S = seq_len and, when longer, truncated from the left (the end kept), as
  `preference_batches.response_sequences`.
  last[i]: the index of the row's last token (its EOS)."""
  n = tokens.shape[0]
  stops = jnp.asarray(tuple(dict.fromkeys([eos_id, *stop_ids])), tokens.dtype)
  keep_response = (mask > 0) & ~jnp.isin(tokens, stops) & (tokens < vocab_limit)
  stream = jnp.concatenate([prompt_tokens, tokens, jnp.full((n, 1), eos_id, tokens.dtype)], axis=1)
  valid = jnp.concatenate([prompt_mask > 0, keep_response, jnp.ones((n, 1), bool)], axis=1)
  position = jnp.cumsum(valid, axis=1) - 1  # where each valid entry lands in the compacted row
  total = position[:, -1] + 1  # the row's length (the EOS is always valid)
  shift = jnp.maximum(total - seq_len, 0)[:, None]  # left truncation
  target = jnp.where(valid & (position >= shift), position - shift, seq_len)  # seq_len: out of bounds, dropped
  rows = jnp.broadcast_to(jnp.arange(n)[:, None], target.shape)
  out = jnp.full((n, seq_len), pad_id, jnp.int32).at[rows, target].set(stream.astype(jnp.int32), mode="drop")
  return out, (jnp.minimum(total, seq_len) - 1).astype(jnp.int32)


def same_tokens(rm_tokenizer: Any, rm_prompt_format: str, tokenizer: Any, prompt_format: str) -> bool:
  """Whether the RM reads the rollouts' own tokens: the policy's tokenizer model and prompt format."""
  return rm_tokenizer.model_proto == tokenizer.model_proto and rm_prompt_format == prompt_format


@dataclasses.dataclass
class RewardModelSource:
  """A jaxpt reward model as a reward source: `scores(ro, questions)` -> float32 [N] on every process (see the module
  docstring); built once by `create`."""

  params: Any  # the RM's params, sharded on the run's mesh
  forward: Callable  # (params, tokens [N, S], last [N]) -> the quality scores [N], compiled on the mesh
  sequences: Callable  # (prompt_tokens, prompt_mask, tokens, mask) -> (tokens [N, S], last [N]) on the mesh
  shared: bool  # the rollouts' own tokens (True) or re-tokenized text (False)
  tokenizer: Any  # the RM's
  policy_tokenizer: Any
  chat: bool  # the RM was trained on chat-formatted prompts
  policy_prompt_format: str  # the policy's: what `prompt_message` gives the re-tokenizing path as the prompt
  stop_ids: tuple[int, ...]  # the ids the rollouts stop at (left out of the response the RM reads)
  seq_len: int
  layout: parallel.MeshLayout

  @classmethod
  def create(cls, model_config: Any, params: Any, num_scores: int, tokenizer: Any, prompt_format: str,
             policy_tokenizer: Any, policy_prompt_format: str, layout: parallel.MeshLayout,
             prompt_len: int, new_tokens: int, source: str = "",
             stop_ids: Sequence[int] | None = None) -> "RewardModelSource":
    """The source for an RM of `model_config` (`params` on `layout`'s mesh, `num_scores` heads) whose tokenizer
    and prompt format are those given, for rollouts of `prompt_len` + `new_tokens` tokens that stop at `stop_ids`
    (the run's, `jaxpt.rl.collect.run_stop_ids`; None: the policy tokenizer's). Logs (absl, once) which layout it
    reads."""
    stop_ids = tuple(policy_tokenizer.stop_ids if stop_ids is None else stop_ids)
    shared = same_tokens(tokenizer, prompt_format, policy_tokenizer, policy_prompt_format)
    # the rollouts' own tokens: at most prompt + response + EOS; re-tokenized text can be longer (Model.score's)
    seq_len = min(prompt_len + new_tokens + 1, model_config.max_seq_len) if shared else model_config.max_seq_len
    module = RewardModel(model_config, num_scores=num_scores)

    def forward(params, tokens, last):
      scores = module.apply({"params": params}, tokens, last)[0]
      return scores if num_scores == 1 else scores[:, QUALITY_HEAD]

    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    compiled = layout.jit(forward, layout.replicated, in_shardings=(param_shardings, layout.batch, layout.batch))
    eos = tokenizer.eos_id
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    sequences = layout.jit(lambda *arrays: rm_sequences(*arrays, eos_id=eos, pad_id=pad, stop_ids=stop_ids,
                                                        vocab_limit=policy_tokenizer.vocab_size, seq_len=seq_len),
                           layout.batch)
    line = (f"reward model {source}: scoring " + ("the rollouts' own tokens (the policy's tokenizer and prompt "
            "format)" if shared else f"re-tokenized prompt + response texts (its own tokenizer, {prompt_format} "
            "prompts)"))
    logging.info("%s", line)
    say(line)  # the CLI shows absl's INFO lines only with -v
    return cls(params=params, forward=compiled, sequences=sequences, shared=shared, tokenizer=tokenizer,
               policy_tokenizer=policy_tokenizer, chat=prompt_format == "chat",
               policy_prompt_format=policy_prompt_format, stop_ids=stop_ids, seq_len=seq_len, layout=layout)

  def scores(self, ro: dict, questions: Sequence[str]) -> np.ndarray:
    """The RM's (quality) score of each rollout of `ro` (global device arrays prompt_tokens, prompt_mask, tokens,
    mask; G rollouts a prompt, in prompt order): float32 [N], whole on every process. `questions`: the question
    texts of this process's prompts (its block of the prompt batch, `batch["questions"]`), read by the
    re-tokenizing path only."""
    n = ro["tokens"].shape[0]
    if self.shared:
      tokens, last = self.sequences(ro["prompt_tokens"], ro["prompt_mask"], ro["tokens"], ro["mask"])
    else:
      tokens, last = self.retokenized(ro, questions)
      put = parallel.global_batch({"tokens": tokens, "last": last}, self.layout.batch, n)
      tokens, last = put["tokens"], put["last"]
    return np.asarray(self.forward(self.params, tokens, last), np.float32)

  def retokenized(self, ro: dict, questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """This process's rows of `ro` as `jaxpt.Model.score` builds (prompt, response) texts with the RM's tokenizer:
    (tokens [M, S], last [M]). The prompt is `prompt_message` of the row's question in the policy's format (not
    the decoded prompt tokens: a chat policy's are its chat template, which the RM would read as text); the
    response, its tokens decoded by the policy's tokenizer."""
    responses = response_texts(self.policy_tokenizer.decode, parallel.process_rows(ro["tokens"]),
                               parallel.process_rows(ro["mask"]), self.stop_ids, self.policy_tokenizer.vocab_size)
    if not questions or len(responses) % len(questions):
      raise ValueError(f"reward model scores: {len(responses)} rollouts of this process for {len(questions or [])} "
                       "questions (need G rollouts a question)")
    group = len(responses) // len(questions)
    prompts = [prompt_message(q, self.policy_prompt_format) for q in questions for _ in range(group)]
    if self.chat:
      prompts = [chat_prompt(self.tokenizer, text, "reward.model") for text in prompts]
    prompt_ids = [list(ids) for ids in encode_prompts_as_trained(self.tokenizer, prompts, self.chat)]
    response_ids = [list(self.tokenizer.encode(text)) for text in responses]
    pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else 0
    end = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else pad  # as Model.score: no EOS, the pad id
    return response_sequences(prompt_ids, response_ids, self.seq_len, pad, end)


def check_model_fits(model_config: Any, rm_tokenizer: Any, prompt_len: int, new_tokens: int, source: str) -> None:
  """ConfigError naming reward.model: an RM whose max_seq_len cannot hold prompt + response + the EOS it scores at
  (`rm_sequences`' row; a longer one is cut from the left, losing the prompt's start), or without a tokenizer."""
  if rm_tokenizer is None:
    raise ConfigError("reward.model", "has no tokenizer (tokenizer.json or spm.model)", source)
  if prompt_len + new_tokens + 1 > model_config.max_seq_len:
    raise ConfigError("reward.model", f"its model.max_seq_len={model_config.max_seq_len} cannot hold "
                      f"data.max_prompt_len ({prompt_len}) + sampling.max_new_tokens ({new_tokens}) + the EOS it "
                      "scores at", source)
