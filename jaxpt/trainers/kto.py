"""KTO (Ethayarajh et al. 2024, Kahneman-Tversky Optimization) of a language model on unpaired examples.

The data are preference pairs (`jaxpt.data.preference_batches`, as for `jaxpt dpo`: synthetic, local jsonl or
hh-rlhf) split into unpaired rows: each chosen response is a desirable example of its prompt, each rejected one an
undesirable example. With `kto.one_response_per_prompt`, each prompt keeps one of the two (a seeded coin per pair,
the paper's one-y-per-x setting), so no prompt is seen with both. One step on a batch of B pairs:

    rows    = [chosen; rejected] [2B, S], desirable = [1]*B + [0]*B, row weights w (0 = a dropped side)
    kl rows = the prompt of pair i with the response (and EOS) of pair i + 1 (mod B), each side: mismatched
              (x, y') pairs whose log-ratio estimates the reference point (this process's pairs, so B / processes
              >= 2 for a mismatch)
    logp / ref = summed response log-probs under the policy / the frozen reference (`jaxpt.trainers.dpo`)
    L = kto(logp, ref, logp_kl, ref_kl, desirable; beta, lambda_D, lambda_U)      (`jaxpt.losses.preference.kto`)

The reference is the initial policy (`init_from`'s params or the seeded init), as for DPO. Eval: the implicit reward
beta (logp - ref) of the held-out pairs' responses (accuracy r_c > r_r, length correlations), as for DPO.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.config import ConfigError, Section, from_section, in_range
from jaxpt.data.preference_batches import PreferenceDataConfig
from jaxpt.engine.config import RunConfig
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.step import GradFn
from jaxpt.losses import get_loss
from jaxpt.models.transformer import TransformerLM
from jaxpt.trainers.dpo import build_reference_run, pair_logps, reference_model_of, sequence_logps

__all__ = ["KTOConfig", "KTORunConfig", "build", "make_kto_grad_fn", "mismatched_rows"]

REFERENCE_KEYS = ("ref_chosen_logps", "ref_rejected_logps", "ref_kl_chosen_logps", "ref_kl_rejected_logps")


@dataclasses.dataclass(frozen=True)
class KTOConfig(Section):
  """The `kto` section: the KTO objective.

  Attributes:
    beta: beta > 0, the sharpness of the value function sigmoid(beta (r - z0)).
    desirable_weight: lambda_D, the weight of desirable examples (the paper keeps lambda_D n_D / (lambda_U n_U) in
      [1, 4/3]).
    undesirable_weight: lambda_U, the weight of undesirable examples.
    one_response_per_prompt: keep one response of each pair (chosen or rejected by a coin seeded by the run's seed
      and the pair's tokens, so the same one at every epoch), as unpaired data would have; False = both, as two
      unpaired rows.
  """

  beta: float = 0.1
  desirable_weight: float = 1.0
  undesirable_weight: float = 1.0
  one_response_per_prompt: bool = False

  def check(self) -> None:
    in_range(self, "beta", 0.0, low_open=True)
    in_range(self, "desirable_weight", 0.0, low_open=True)
    in_range(self, "undesirable_weight", 0.0, low_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KTORunConfig(RunConfig):
  """A KTO run: `RunConfig` plus these sections; `init_from` ('' = random init, an LM run's workdir, or 'hf:DIR') is
  both the starting policy and the frozen reference.

  Attributes:
    data: the preference pairs, split into unpaired rows, and their batching (as for `jaxpt dpo`).
    kto: the KTO objective.
  """

  data: PreferenceDataConfig = PreferenceDataConfig()
  kto: KTOConfig = KTOConfig()

  def check(self) -> None:
    super().check()
    self.check_seq_len(self.data.seq_len, "data.seq_len")
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")
    check_pairs_per_process(self.data.batch_size, 1)


def check_pairs_per_process(batch_size: int, processes: int) -> None:
  """ConfigError naming data.batch_size when a process's batch holds fewer than 2 pairs: the reference point pairs
  each row's prompt with the next row's response (`mismatched_rows`), and with one row that is its own (matched)
  response."""
  if batch_size // processes < 2:
    raise ConfigError("data.batch_size", f"KTO's reference point pairs each prompt with another row's response: "
                      f"each of the {processes} process(es) needs >= 2 pairs a batch", batch_size)


def mismatched_rows(tokens: np.ndarray, last: np.ndarray, response_len: np.ndarray,
                    pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens int32 [B, S], last [B], response_len [B]) of the rows pairing the prompt of row i with the response and
  EOS of row (i + 1) mod B, right-padded with pad_id and left-truncated to S as the data's rows are."""
  b, s = tokens.shape
  out, new_last, new_len = np.full_like(tokens, pad_id), np.zeros_like(last), np.zeros_like(response_len)
  starts = np.maximum(last - response_len, 1)  # the first response token of each row (`dpo.response_mask`)
  for i in range(b):
    j = (i + 1) % b
    ids = np.concatenate([tokens[i, :starts[i]], tokens[j, starts[j]:last[j] + 1]])[-s:]
    out[i, :len(ids)], new_last[i], new_len[i] = ids, len(ids) - 1, last[j] - starts[j]
  return out, new_last, new_len


def kl_columns(pad_id: int, seed: int, one_response_per_prompt: bool):
  """columns(batch) -> the host columns a KTO step reads beside a flattened pair batch: each side's mismatched rows
  (`kl_<side>_tokens`, `_last`, `_response_len`) and, with one_response_per_prompt, the row weights of each side
  (`chosen_weights`, `rejected_weights`: a coin per pair, seeded by `seed` and the pair's chosen tokens)."""

  def columns(batch: dict) -> dict:
    extra = {}
    for side in ("chosen", "rejected"):
      rows = mismatched_rows(batch[f"{side}_tokens"], batch[f"{side}_last"], batch[f"{side}_response_len"], pad_id)
      extra.update(zip((f"kl_{side}_tokens", f"kl_{side}_last", f"kl_{side}_response_len"), rows))
    keep_chosen = np.ones(len(batch["weights"]), np.float32)
    if one_response_per_prompt:  # the coin of a pair is a function of its tokens: the same side at every epoch
      keep_chosen = np.asarray([np.random.default_rng([seed, zlib.crc32(row.tobytes())]).integers(2)
                                for row in batch["chosen_tokens"]], np.float32)
    extra["chosen_weights"] = batch["weights"] * keep_chosen
    extra["rejected_weights"] = batch["weights"] * (1.0 - keep_chosen if one_response_per_prompt else 1.0)
    return dict(batch, **extra)

  return columns


def kl_logps(model: TransformerLM, params: Any, batch: dict) -> jax.Array:
  """The summed response log-probs [2B] of the batch's mismatched rows, chosen side first."""
  tokens = jnp.concatenate([batch["kl_chosen_tokens"], batch["kl_rejected_tokens"]], axis=0)
  last = jnp.concatenate([batch["kl_chosen_last"], batch["kl_rejected_last"]], axis=0)
  lengths = jnp.concatenate([batch["kl_chosen_response_len"], batch["kl_rejected_response_len"]], axis=0)
  return sequence_logps(model, params, tokens, last, lengths)[0]


def reference_logps(model: TransformerLM, ref_params: Any, batch: dict) -> dict:
  """The frozen reference's columns: REFERENCE_KEYS, float32 [B] each."""
  ref_params = jax.lax.stop_gradient(ref_params)
  b = batch["chosen_tokens"].shape[0]
  logp, kl = pair_logps(model, ref_params, batch)[0], kl_logps(model, ref_params, batch)
  return dict(zip(REFERENCE_KEYS, (logp[:b], logp[b:], kl[:b], kl[b:])))


def make_kto_grad_fn(model: TransformerLM, settings: KTOConfig) -> GradFn:
  """grad_fn(params, aux, batch, rng) -> (grads, aux, metrics) of the KTO loss on one (micro-)batch of pairs split
  into 2B unpaired rows (module docstring); the mismatched rows' policy log-probs carry no gradient.
  metrics: those of `kto` and `num_pairs` (the pairs' weight, the step's weighting of micro-batches)."""
  kto_loss = get_loss("preference", "kto")
  use_dropout = model.config.dropout_rate > 0

  def loss_fn(params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
    b = batch["chosen_tokens"].shape[0]
    logp, _ = pair_logps(model, params, batch, rng if use_dropout else None)
    kl = kl_logps(model, jax.lax.stop_gradient(params), batch)
    ref = jnp.concatenate([batch["ref_chosen_logps"], batch["ref_rejected_logps"]])
    ref_kl = jnp.concatenate([batch["ref_kl_chosen_logps"], batch["ref_kl_rejected_logps"]])
    desirable = jnp.arange(2 * b) < b
    weights = jnp.concatenate([batch["chosen_weights"], batch["rejected_weights"]])
    loss, metrics = kto_loss(logp, ref, kl, ref_kl, desirable, settings.beta, settings.desirable_weight,
                             settings.undesirable_weight, weights)
    return loss, dict(metrics, num_pairs=jnp.sum(batch["weights"].astype(jnp.float32)))

  def grad_fn(params: Any, aux: Any, batch: dict, rng: jax.Array) -> tuple[Any, Any, dict]:
    grads, metrics = jax.grad(loss_fn, has_aux=True, allow_int=True)(params, batch, rng)  # QLoRA: int codes
    return grads, aux, metrics

  return grad_fn


def build(config: KTORunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (ConfigError naming the field), then builds the KTO run on the preference-trainer build that
  DPO uses (`jaxpt.trainers.dpo.build_reference_run`: data, policy, compiled step, reference, evaluator)."""
  config = from_section(KTORunConfig, config, "config")
  check_pairs_per_process(config.data.batch_size, jax.process_count())
  model = TransformerLM(config.model, lora=config.lora.spec())
  reference_model = reference_model_of(config)
  settings = config.kto
  return build_reference_run(
      "kto", config, workdir, model, make_kto_grad_fn(model, settings), settings.beta,
      lambda p, batch: reference_logps(reference_model, p, batch), REFERENCE_KEYS, "KTO implicit reward",
      columns=lambda data: kl_columns(data.tokenizer.pad_id, config.seed, settings.one_response_per_prompt))
