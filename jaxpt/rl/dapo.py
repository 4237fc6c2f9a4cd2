"""DAPO's rollout-side pieces on the host (Yu et al. 2025, arXiv 2503.14476): dynamic sampling, overlong
filtering and the soft overlong punishment. Its other two pieces are loss options already: clip-higher
(`grpo.eps_hi` > `grpo.eps_lo`, DAPO: 0.28 / 0.2) and the token-level loss (`grpo.agg='token-mean'`).

Conventions follow verl's DAPO recipe (github volcengine/verl at 246cac4c, before `recipe/` moved out):
- soft overlong punishment, `verl/workers/reward_manager/dapo.py:116-122`: with L_max the response cap
  (`sampling.max_new_tokens`) and L_cache the buffer, a response of |y| tokens (its EOS counted) gets
      R_length(|y|) = factor * min(((L_max - L_cache) - |y|) / L_cache, 0)
  added to its reward: 0 up to L_max - L_cache tokens, then linear down to -factor at L_max (the paper's -1 beyond
  L_max is never reached: the sampler stops at L_max; it is kept here by clamping at -factor).
- dynamic sampling, `recipe/dapo/dapo_ray_trainer.py:229-288`: a group is kept when the filter metric is not the
  same for all its rollouts, or it has one rollout (verl: `std > 0 or len == 1`; here max > min, the exact form of
  "not all equal"); kept groups of successive generation rounds are concatenated and the first `prompts_per_step`
  are trained on. verl's metric for DAPO is `acc` (the verifier's 0/1, `run_dapo_qwen2.5_32b.sh:26`): here
  'score'; 'reward' is the reward the run trains on before its normalisation (the `reward` section's raw sum,
  `jaxpt.rl.reward_sources.raw_rewards`: with the default section the score plus the overlong punishment, verl's
  `seq_reward`; with `reward.model`, the reward model's scores weighted in). Normalisation ('batch', 'running') is
  one affine map per step, so it changes no group's being all-equal; clipping after it may tie a group further,
  which the filter does not see.
- a reward model's scores are continuous: exact ties within a group are rare, so "all equal" keeps nearly every
  group, and a group whose rewards differ by float rounding only carries noise as its advantage (GRPO divides by
  the group's std). `filter_min_std` > 0 keeps a group only when the (population) std of its filter metric exceeds
  it, in the reward's own units before normalisation (e.g. a small fraction of the RM scores' spread over a
  batch); 0 is the exact rule above. With `reward.model` set, filter_metric 'score' (the verifier's) is refused:
  it would drop groups on a signal the run does not train on (`jaxpt.trainers.grpo_config`).
- the cap: verl raises an error after `max_num_gen_batches` rounds (`dapo_ray_trainer.py:273-284`; <= 0 means no
  limit). Here `at_cap='error'` does that, and the default `at_cap='fill'` tops the batch up with the dropped
  groups, first drawn first: their filter metric is equal across the group, so the part of their advantage that
  comes from it is 0 (grpo, drgrpo, rloo, reinforce_pp_baseline alike). Terms added to the reward after the
  filter still reach them: the overlong punishment when the metric is 'score', CLIPO's contrastive reward, and the
  KL penalty with kl_in_reward; and they count in the KL / entropy terms and the loss denominators.
  A cap is required (a run's extra prompts are read at fixed positions, below).
- overlong filtering (paper, section 3.4): truncated responses (L_max tokens, no EOS) are masked out of the
  policy loss; their rewards still enter the group advantages. verl does not implement it (its recipe README:
  "Where is the Overlong Filtering in the paper?").

Determinism: round 0 of step k samples the step's own prompts (`PromptData.batch(k)`), round r >= 1 samples
`PromptData.refill_batch(k (max_rounds - 1) + r - 1)` (an independent stream of the training problems, read at
fixed positions whether or not a step needs them) with key fold_in(step key, r); so the prompts and keys of step
k are a function of (seed, k) and a resumed run draws exactly what an uninterrupted one would. (verl draws the
extra batches from its one dataloader, so its data position depends on how many rounds earlier steps took.)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import Section, at_least, in_range, one_of

FILTER_METRICS = ("score", "reward")
AT_CAP = ("fill", "error")


@dataclasses.dataclass(frozen=True)
class DAPOConfig(Section):
  """The `dapo` section: dynamic sampling, overlong filtering and the soft overlong punishment (all off by default).

  Attributes:
    dynamic_sampling: drop groups whose filter_metric is equal over all their rollouts and sample more prompts until
      data.prompts_per_step groups are informative (or max_rounds is reached).
    filter_metric: what must vary within a kept group: 'score' (the verifier's 1/0, verl's `acc`) | 'reward'
      (the reward trained on, before normalisation: score + the overlong punishment, verl's `seq_reward`, and the
      `reward` section's terms: reward.model's weighted scores, the EOS-missing penalty).
    filter_min_std: a group is informative when the std of its filter metric exceeds this (0 = when it is not all
      equal, verl's rule); for a reward model's continuous scores, in the reward's units.
    max_rounds: generation rounds per step at most, the step's own prompts included (verl's max_num_gen_batches).
    at_cap: max_rounds rounds left too few informative groups: 'fill' (top up with dropped groups, first drawn
      first) | 'error' (stop the run, as verl does).
    overlong_filtering: mask truncated responses (sampling.max_new_tokens tokens, no EOS) out of the policy loss.
    overlong_buffer: L_cache, the soft overlong punishment's buffer in tokens below sampling.max_new_tokens (0 = off).
    overlong_penalty_factor: the punishment at sampling.max_new_tokens tokens (1 = DAPO's -1).
  """

  dynamic_sampling: bool = False
  filter_metric: str = "score"
  filter_min_std: float = 0.0
  max_rounds: int = 3
  at_cap: str = "fill"
  overlong_filtering: bool = False
  overlong_buffer: int = 0
  overlong_penalty_factor: float = 1.0

  def check(self) -> None:
    one_of(self, "filter_metric", FILTER_METRICS)
    one_of(self, "at_cap", AT_CAP)
    at_least(self, "max_rounds", 1)
    at_least(self, "overlong_buffer", 0)
    in_range(self, "filter_min_std", 0.0)
    in_range(self, "overlong_penalty_factor", 0.0)


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int, factor: float = 1.0) -> np.ndarray:
  """DAPO's soft overlong punishment (module doc): lengths int [N] (EOS counted) -> float32 [N],
  factor * clip(((max_len - buffer) - |y|) / buffer, -1, 0), computed in float64; all 0 when buffer is 0."""
  lengths = np.asarray(lengths, np.float64)
  if buffer <= 0:
    return np.zeros(lengths.shape, np.float32)
  if buffer > max_len:
    raise ValueError(f"overlong buffer {buffer} longer than the response cap {max_len}")
  exceed = lengths - (max_len - buffer)
  return (factor * np.clip(-exceed / buffer, -1.0, 0.0)).astype(np.float32)


def truncated(lengths: np.ndarray, last_tokens: np.ndarray, max_len: int, stop_ids: Sequence[int]) -> np.ndarray:
  """bool [N]: the response has max_len tokens and its last one is not a stop token (EOS or another id of
  `stop_ids`; every full row when stop_ids is empty).

  lengths int [N] (mask sums, EOS counted), last_tokens int [N] (column max_len - 1 of the responses)."""
  full = np.asarray(lengths) >= max_len
  return full & ~np.isin(np.asarray(last_tokens), list(stop_ids))


def filter_overlong(mask: jax.Array, is_truncated: np.ndarray) -> jax.Array:
  """Overlong filtering: mask [N, T] (a device array, global on a mesh) with the rows of truncated responses
  zeroed; is_truncated bool [N] on the host. Same dtype and layout as mask."""
  return jnp.where(np.asarray(is_truncated, bool)[:, None], jnp.zeros((), mask.dtype), mask)


def informative_groups(values: np.ndarray, group_size: int, min_std: float = 0.0) -> np.ndarray:
  """bool [num_groups]: values [N = num_groups * G] (groups contiguous) are not all equal within the group (min_std
  0), or their population std (float64) exceeds min_std; always True for G = 1 (verl keeps single-rollout
  groups)."""
  v = np.asarray(values).reshape(-1, group_size)
  if group_size == 1:
    return np.ones(len(v), bool)
  return v.max(axis=1) > v.min(axis=1) if min_std == 0 else v.astype(np.float64).std(axis=1) > min_std


def _take_rows(tree: Any, rows: np.ndarray) -> Any:
  return jax.tree.map(lambda x: jnp.take(x, jnp.asarray(rows), axis=0), tree)


def _gather(rounds: list[dict], picks: list[tuple[int, int]], group_size: int, take: Callable) -> dict:
  """The rows of the picked (round, group) groups, in pick order, from per-round rollout dicts of the same keys:
  numpy arrays gathered on the host, device arrays by one `take(tree, rows)` over their concatenation (None stays
  None)."""
  n = len(next(v for v in rounds[0].values() if v is not None))
  rows = np.asarray([r * n + g * group_size + i for r, g in picks for i in range(group_size)])
  host = {k: np.concatenate([ro[k] for ro in rounds])[rows] for k, v in rounds[0].items()
          if isinstance(v, np.ndarray)}
  device = {k: jnp.concatenate([ro[k] for ro in rounds]) for k, v in rounds[0].items()
            if v is not None and k not in host}
  return {**{k: None for k, v in rounds[0].items() if v is None}, **host, **take(device, rows)}


def dynamic_sampling(draw: Callable[[int], dict], num_groups: int, group_size: int, max_rounds: int,
                     at_cap: str, metric_key: str, take: Callable = _take_rows,
                     min_std: float = 0.0) -> tuple[dict, dict]:
  """DAPO dynamic sampling (module doc). draw(r) -> round r's rollouts: a dict of per-row values (host numpy
  [N, ...], device arrays or None), N = num_groups * G, groups contiguous, `metric_key` the filter metric [N] (on
  the host, whole). take(tree, rows) gathers rows of device arrays (default jnp.take; the GRPO trainer passes one
  compiled to keep the rows split over its mesh). A group is informative by `informative_groups(.., min_std)`.

  Rounds r = 0, 1, ... are drawn until they hold num_groups informative groups or max_rounds were drawn; the
  batch is the first num_groups informative groups in draw order, topped up (at_cap='fill') with the dropped
  ones in draw order, or RuntimeError (at_cap='error'). Returns (batch, metrics) with `group_ids` renumbered
  0..num_groups-1 and metrics dapo_rounds (rounds drawn), dapo_groups_drawn, dapo_groups_informative (among
  those drawn), dapo_groups_filled (dropped groups trained on).
  """
  rounds, kept, dropped = [], [], []
  while len(rounds) < max_rounds and len(kept) < num_groups:
    r = len(rounds)
    rounds.append(draw(r))
    flags = informative_groups(rounds[r][metric_key], group_size, min_std)
    if len(flags) != num_groups:
      raise ValueError(f"round {r} drew {len(flags)} groups, expected {num_groups}")
    kept += [(r, g) for g in np.flatnonzero(flags)]
    dropped += [(r, g) for g in np.flatnonzero(~flags)]
  informative = len(kept)
  if informative < num_groups and at_cap == "error":
    raise RuntimeError(f"dynamic sampling: {len(rounds)} rounds (config.dapo.max_rounds) gave {informative} "
                       f"informative groups of the {num_groups} needed (config.data.prompts_per_step); raise "
                       "max_rounds or set config.dapo.at_cap='fill'")
  picks = (kept + dropped)[:num_groups]
  batch = _gather(rounds, picks, group_size, take)
  batch["group_ids"] = np.repeat(np.arange(num_groups, dtype=np.int32), group_size)
  metrics = {"dapo_rounds": len(rounds), "dapo_groups_drawn": len(rounds) * num_groups,
             "dapo_groups_informative": informative, "dapo_groups_filled": max(0, num_groups - informative)}
  return batch, metrics
