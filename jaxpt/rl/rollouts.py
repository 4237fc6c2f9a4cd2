"""Rollout plumbing on the host: prompts -> G copies each -> decoded completions -> verifier rewards.

Layout (shared with `jaxpt.losses.grpo`): the G rollouts of prompt p are rows p*G .. p*G + G-1 of every
`[N = num_prompts * G, ...]` array, so `group_ids = arange(N) // G`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

RewardFn = Callable[[str, str], float]  # (response text, ground-truth answer) -> reward


def repeat_prompts(prompt_tokens: np.ndarray, prompt_mask: np.ndarray,
                   group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """[B, P] prompts -> ([B*G, P] tokens, [B*G, P] mask, group ids int32 [B*G]); row p*G + g is copy g of p."""
  tokens = np.repeat(np.asarray(prompt_tokens), group_size, axis=0)
  mask = np.repeat(np.asarray(prompt_mask), group_size, axis=0)
  group_ids = np.repeat(np.arange(len(prompt_tokens), dtype=np.int32), group_size)
  return tokens, mask, group_ids


def response_texts(decode: Callable[[list[int]], str], tokens: np.ndarray, mask: np.ndarray,
                   stop_ids: Sequence[int], vocab_size: int | None = None) -> list[str]:
  """Decoded responses: tokens [N, T] where mask [N, T] is set, the stop tokens (`stop_ids`: EOS and the
  tokenizer's other end-of-generation ids) left out, and ids >= vocab_size (the
  tokenizer's; rows a policy's padded embedding has beyond it, which a sampled rollout can draw) too: they have no
  text."""
  texts = []
  limit = np.iinfo(np.int64).max if vocab_size is None else vocab_size
  stops = set(stop_ids)
  for row, row_mask in zip(np.asarray(tokens), np.asarray(mask)):
    ids = [int(t) for t, m in zip(row, row_mask) if m and int(t) not in stops and int(t) < limit]
    texts.append(decode(ids))
  return texts


def verifier_rewards(texts: Sequence[str], answers: Sequence[str], group_size: int,
                     reward_fn: RewardFn) -> np.ndarray:
  """float32 [N]: reward_fn(texts[i], answers[i // G]) for N = len(answers) * G rollouts."""
  if len(texts) != len(answers) * group_size:
    raise ValueError(f"{len(texts)} responses for {len(answers)} prompts x group_size {group_size}")
  return np.asarray([reward_fn(text, answers[i // group_size]) for i, text in enumerate(texts)], np.float32)
