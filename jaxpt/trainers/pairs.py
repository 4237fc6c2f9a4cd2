"""Preference-pair pieces shared by the reward-model and DPO trainers: the flat batch, [chosen; rejected] rows, and
the held-out evaluation of per-response scores (a reward model's r, DPO's implicit reward beta (log pi - log ref)).

Batches are those of `jaxpt.data.preference_batches` with the nested `bias` dict flattened to `bias/<name>` keys.
`PairEvaluator` scores every eval split's pairs with a `score(params, batch) -> [2B]` function (chosen rows first)
and computes `rm_eval.evaluate_pairs` on the real pairs (accuracy r_c > r_r, score-length correlations, per-bias
and per-group accuracies).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import ConfigError
from jaxpt.data import bias as bias_lib
from jaxpt.trainers import rm_eval
from jaxpt.engine.builder import Training
from jaxpt.engine.loop import LoopResult
from jaxpt.engine.run import Hooks
from jaxpt.engine.state import TrainState

BIAS_PREFIX = "bias/"
ScoreFn = Callable[[Any, dict], jax.Array]  # (params, device batch of B pairs) -> scores [2B], chosen rows first


def flatten_batch(batch: dict) -> dict:
  """A preference batch with its nested `bias` dict flattened to `bias/<name>` keys (one level of arrays)."""
  flat = {k: v for k, v in batch.items() if k != "bias"}
  flat.update({BIAS_PREFIX + name: v for name, v in batch.get("bias", {}).items()})
  return flat


def pair_tokens(batch: dict) -> tuple[jax.Array, jax.Array]:
  """(tokens [2B, S], last index [2B]): chosen rows first, then rejected."""
  tokens = jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]], axis=0)
  last = jnp.concatenate([batch["chosen_last"], batch["rejected_last"]], axis=0)
  return tokens, last


def check_bias_label(section: str, settings: Any, data: Any) -> None:
  """ConfigError naming `<section>.bias` when the DIR bias label is not among the preference data's `biases`, or
  `<section>.bias_classes` when the estimator's classes are not that label's (a label past them would give the
  estimator a NaN loss while CLUB silently skipped the pair). settings: the section's `DIRSettings` fields."""
  if settings.bias not in data.bias_names:
    raise ConfigError(f"{section}.bias", f"not among the data's bias labels config.data.biases={data.biases!r}",
                      settings.bias)
  classes = bias_lib.num_classes(settings.bias)
  if settings.bias_classes != classes:
    raise ConfigError(f"{section}.bias_classes", f"the bias label {settings.bias!r} takes {classes} values",
                      settings.bias_classes)


def eval_splits(data: Any) -> dict[str, tuple[list[dict], dict]]:
  """{split: (flattened eval batches, eval meta)} of a `PreferenceData`, 'test' first (the main split)."""
  names = ["test"] + [split for split in data.eval_splits if split != "test"]
  return {split: ([flatten_batch(b) for b in data.eval_batches(split)], data.eval_meta(split)) for split in names}


class PairEvaluator:
  """Scores held-out pairs and computes `rm_eval.evaluate_pairs` on them.

  score(params, batch) -> scores [2B] of a device batch (e.g. jitted with replicated out_shardings, so every
  process of a multi-host run reads them whole). splits: {name: (batches, meta)}: flattened host preference
  batches (whole on every process; weight-0 rows are padding; `put` places each on the devices) and the data's
  per-pair host metadata of the real rows, in order (`PreferenceData.eval_meta`): its `bias/<name>` columns give the
  per-bias splits, its string columns (e.g. `sycophancy`: natural | adversarial) the groups. The first split is the
  main one: its scalars are `eval_*`, the others' `eval_<split>_*`.
  Every process must call the methods (the scoring is a jitted computation over the mesh).
  """

  def __init__(self, score: ScoreFn, splits: dict[str, tuple[list[dict], dict]],
               put: Callable[[dict], dict] = lambda batch: batch):
    self.score = score
    self.meta = {split: meta for split, (_, meta) in splits.items()}
    self.device_batches = {split: [put(b) for b in batches] for split, (batches, _) in splits.items()}
    host_keys = ("weights", "chosen_response_len", "rejected_response_len")
    self.host = {split: {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in host_keys}
                 for split, (batches, _) in splits.items()}

  @property
  def splits(self) -> list[str]:
    return list(self.meta)

  def scored(self, params: Any, split: str) -> dict[str, np.ndarray]:
    """Real pairs of `split` (weight > 0), in order: chosen/rejected scores and response lengths [N]."""
    scores = [np.asarray(jax.device_get(self.score(params, b)), np.float64) for b in self.device_batches[split]]
    chosen = np.concatenate([s[:len(s) // 2] for s in scores])
    rejected = np.concatenate([s[len(s) // 2:] for s in scores])
    host = self.host[split]
    keep = host["weights"] > 0
    return {"chosen_scores": chosen[keep], "rejected_scores": rejected[keep],
            "chosen_response_len": host["chosen_response_len"][keep],
            "rejected_response_len": host["rejected_response_len"][keep]}

  def results(self, state: TrainState, split: str) -> tuple[dict, dict[str, np.ndarray]]:
    s = self.scored(state.params, split)
    meta = self.meta[split] or {}
    bias = {k[len(BIAS_PREFIX):]: v for k, v in meta.items() if k.startswith(BIAS_PREFIX)}
    groups = {k: v for k, v in meta.items() if np.asarray(v).dtype.kind in "US"}
    for name, column in {**bias, **groups}.items():
      if len(column) != len(s["chosen_scores"]):
        raise ValueError(f"eval meta column {name!r} of split {split!r} has {len(column)} rows, the batches "
                         f"{len(s['chosen_scores'])} real pairs")
    results = rm_eval.evaluate_pairs(s["chosen_scores"], s["rejected_scores"], s["chosen_response_len"],
                                     s["rejected_response_len"], bias, groups)
    return results, s

  def __call__(self, state: TrainState) -> dict:
    metrics = {}
    for index, split in enumerate(self.splits):
      prefix = "eval_" if index == 0 else f"eval_{split}_"
      metrics.update(rm_eval.scalar_metrics(self.results(state, split)[0], prefix))
    return metrics

  def write_report(self, state: TrainState, workdir: str, title: str, write: bool = True) -> None:
    """rm_eval.json / .md / score_vs_length.png for the main split into `workdir`, the others into
    `workdir/eval_<split>/` (files written only where `write`, e.g. on process 0)."""
    for index, split in enumerate(self.splits):
      results, s = self.results(state, split)
      if not write:
        continue
      directory = workdir if index == 0 else os.path.join(workdir, f"eval_{split}")
      rm_eval.write_report(directory, dict(results, split=split), s["chosen_scores"], s["rejected_scores"],
                           s["chosen_response_len"], s["rejected_response_len"], f"{title}, {split}")


@dataclasses.dataclass
class PairReport(Hooks):
  """The loop hooks of the pair trainers (reward model, DPO): when the run ends (step == steps; nothing after a
  SIGTERM or a `stop_at`), the evaluator's report (`PairEvaluator.write_report`, process 0) in the workdir."""

  training: Training
  evaluator: PairEvaluator
  title: str  # the report's title: 'reward model (dir)', 'DPO implicit reward'

  def finished(self, result: LoopResult, workdir: str) -> None:
    if result.preempted or int(jax.device_get(result.state.step)) != self.training.config.steps:
      return
    self.training.under_rules(self.evaluator.write_report)(result.state, workdir, self.title,
                                                           write=jax.process_index() == 0)
