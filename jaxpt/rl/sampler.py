"""Batched autoregressive sampling with a preallocated KV cache: one prefill call, then a `lax.while_loop` decode.

Layout (shared with `jaxpt.rl.logprobs`, which recomputes the same log-probs by teacher forcing):
- Prompts are LEFT-padded: `prompt_tokens` int32 [B, P], `prompt_mask` [B, P] (1 on real tokens, the rightmost of
  each row). Segment ids are the mask (0: padding, never attended to by real tokens), positions count from 0 at
  the first real token of each row: pos = cumsum(mask) - 1 (0 on padding).
- Cache slot = column of the sequence prompt ++ response: slots 0..P-1 hold the prompt, response token t (which
  has position n_real + t) is fed at slot P + t. With `make_sampler`'s group_size G > 1 the prompts' slots are a
  shared prefix of the cache (`KVCache.prefix`, one row per distinct prompt) and each row's own buffers hold its
  response alone, token t at the row's slot t. All rows share each step's slot, so one in-place
  dynamic_update_slice writes the step's K/V for every layer.

Per step t (key fold_in(rng, t)), from the logits l of the last fed token (temperature tau):
    logprob_t = log_softmax(l / tau)[token_t]       full, unfiltered tempered distribution (tau = 1 when greedy)
    token_t   = argmax(l)                            greedy
              = categorical(top_p(top_k(l / tau)))   otherwise (filters in that order; see `filter_logits`)
A row stops at its first stop token, `eos_id` or one of `stop_ids` (kept, mask 1); later entries are pad_id with
mask 0 and logprob 0. The loop ends when every row has stopped or after max_new_tokens.

Speed (`benchmarks/sampler.py`, `benchmarks/shared_prefill.py`): the prefill runs once per distinct prompt (G > 1),
projects only the last prompt column onto the vocabulary and fills a cache of exactly the prompt's slots; the
decode loop runs in `cache_segments` consecutive while_loops, and before each the rows' own buffers grow
(`KVCache.grow`, one copy; a shared prefix is not copied) to the slots filled by that loop's end, so a step attends
over no slot beyond them (the same arithmetic as attending to the whole buffer: the slots left out are ones the
mask excludes).
`rollout_dtype="bfloat16"` decodes with bf16 weights, activations and KV cache: faster (half the bytes streamed per
step), but the log-probs are those of the bf16 policy, so a trainer needing the fp32 policy's log-probs recomputes
them by teacher forcing (`jaxpt.rl.logprobs`; the GRPO trainer does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from jaxpt.config import Section, at_least, fail, in_range, one_of
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache, unstack_layers
from jaxpt.nn.lora import QUANT_NAMES, LoRA
from jaxpt.parallel import MeshLayout


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Section):
  """How to sample `max_new_tokens` response tokens (top_k 0 and top_p 1 switch those filters off).

  Attributes:
    max_new_tokens: the longest response, in tokens.
    temperature: tau, logits / tau before sampling (> 0).
    top_k: sample among the k most likely tokens (0 = off).
    top_p: nucleus sampling: among the most likely tokens holding probability top_p (1 = off).
    greedy: argmax decoding instead of sampling (the GRPO trainer sets it: sampled rollouts, greedy eval).
    eos_id: a row stops at its first eos_id (None = never; the trainers set the tokenizer's).
    stop_ids: more ids a row stops at, as at eos_id (the trainers add the tokenizer's `stop_ids`: an HF
      checkpoint's generation_config.json eos_token_id list, e.g. an instruct model's end-of-turn token).
    pad_id: the token after a row's EOS (the trainers set the tokenizer's).
    return_hidden: also return the final-norm hidden states of the response (the GRPO trainer sets it for CLIPO).
    rollout_dtype: the dtype of the weights, activations and KV cache while sampling: float32 | bfloat16 (faster;
      its log-probs and hidden states are the bf16 policy's: GRPO recomputes old log-probs with the fp32 policy,
      CLIPO's representation uses the bf16 hidden states).
    cache_segments: the decode loop runs as this many while_loops, each with a cache of the slots filled by its end
      (1: every step reads a cache of all prompt + max_new_tokens - 1 slots); each compiles its own copy of the step.
    row_keys: draw token t of rollout b with its own key fold_in(fold_in(rng, b), t) (`make_sampler`'s row_keys),
      as the rollout engine (`jaxpt.rl.engine`, which ignores this field) always does: a run gives the same
      rollouts with the engine on or off; off: one key per step, fold_in(rng, t).
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  eos_id: int | None = None
  stop_ids: tuple[int, ...] = ()
  pad_id: int = 0
  return_hidden: bool = False
  rollout_dtype: str = "float32"
  cache_segments: int = 4
  row_keys: bool = False

  def check(self) -> None:
    at_least(self, "max_new_tokens", 1)
    at_least(self, "cache_segments", 1)
    one_of(self, "rollout_dtype", ("float32", "bfloat16"))
    if not self.temperature > 0:
      raise fail(self, "temperature", "must be positive (use greedy=True for argmax decoding)")
    if self.top_k < 0:
      raise fail(self, "top_k", "must be a non-negative integer (0 = off)")
    in_range(self, "top_p", 0.0, 1.0, low_open=True)
    if self.eos_id is not None and self.eos_id < 0:
      raise fail(self, "eos_id", "must be a non-negative token id or None")
    object.__setattr__(self, "stop_ids", tuple(self.stop_ids))  # a list given in Python: hashable, a cache key
    if any(i < 0 for i in self.stop_ids):
      raise fail(self, "stop_ids", "must be non-negative token ids")
    if self.pad_id < 0:
      raise fail(self, "pad_id", "must be a non-negative token id")


def stop_tokens(sampling: SamplingConfig) -> tuple[int, ...]:
  """The ids a row stops at: eos_id (if set) and stop_ids, each once."""
  return tuple(dict.fromkeys(([] if sampling.eos_id is None else [sampling.eos_id]) + list(sampling.stop_ids)))


def is_stop(tokens: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """bool, the shape of `tokens`: the token is one a row stops at (`stop_tokens`; all False when there is none)."""
  stops = stop_tokens(sampling)
  return jnp.isin(tokens, jnp.asarray(stops, tokens.dtype)) if stops else jnp.zeros(tokens.shape, bool)


@flax.struct.dataclass
class SampleOutput:
  """tokens int32 [B, T] (pad_id after a row's EOS); logprobs, mask float32 [B, T] (mask 1 up to and including
  EOS); lengths int32 [B] = sum(mask); hidden float32 [B, T, d_model] (the final-norm hidden state token t was
  sampled from, 0 on padding) or None."""

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  lengths: jax.Array
  hidden: jax.Array | None = None


def prompt_layout(prompt_mask):
  """Left-padded prompt_mask [B, P] -> (segment_ids int32 [B, P], positions int32 [B, P], lengths int32 [B])."""
  segment_ids = (jnp.asarray(prompt_mask) > 0).astype(jnp.int32)
  positions = jnp.maximum(jnp.cumsum(segment_ids, axis=1) - 1, 0)
  return segment_ids, positions, jnp.sum(segment_ids, axis=1)


def filter_logits(logits, top_k: int = 0, top_p: float = 1.0):
  """[..., vocab] -> same, with -inf outside the allowed set: the top_k largest (ties at the k-th kept), then the
  nucleus: the smallest set of most probable tokens whose probability (under softmax of the top-k-filtered
  logits) reaches top_p, always at least the most probable token (ties at the cut kept)."""
  if top_k > 0 and top_k < logits.shape[-1]:
    kth = lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  if top_p < 1.0:
    descending = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(descending, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # probability of the strictly more probable tokens
    cutoff = jnp.min(jnp.where(mass_before < top_p, descending, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
  return logits


def categorical(key, logits):
  """One draw per row from softmax(logits) `[..., vocab]` -> int32 `[...]`, by inverting the CDF with one uniform
  per row: token = #{j : cdf_j < u}, u in (0, cdf_last]. Tokens of probability 0 (logit -inf) are never drawn.
  (`jax.random.categorical` draws a Gumbel per vocabulary entry: measured 4x slower per decode step here.)"""
  cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
  u = (1.0 - jax.random.uniform(key, cdf.shape[:-1] + (1,))) * cdf[..., -1:]
  return jnp.sum(cdf < u, axis=-1).astype(jnp.int32)


def rollout_keys(rng, rows, t):
  """The key of token t of each rollout in `rows` int [B] (`make_sampler(row_keys=True)`, `jaxpt.rl.engine`):
  fold_in(fold_in(rng, row), t) -> keys [B]; rng: one key, or keys [B] (row b's from rng[b]); t: int scalar or
  int [B]."""
  rng = jnp.broadcast_to(rng, jnp.shape(rows) + jnp.shape(rng)[-1:])
  return jax.vmap(lambda key, row, step: jax.random.fold_in(jax.random.fold_in(key, row), step))(
      rng, rows, jnp.broadcast_to(t, jnp.shape(rows)))


def choose_tokens(logits, key, sampling: SamplingConfig):
  """logits float32 [B, vocab] -> (tokens int32 [B], logprobs float32 [B]) per the module doc. `key`: one key for
  the whole batch, or keys [B] (`rollout_keys`), one draw per row from its own key."""
  if sampling.greedy:
    tokens = jnp.argmax(logits, axis=-1)
    scaled = logits
  else:
    scaled = logits / sampling.temperature
    filtered = filter_logits(scaled, sampling.top_k, sampling.top_p)
    one_key = jnp.ndim(key) == (0 if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else 1)
    tokens = categorical(key, filtered) if one_key else jax.vmap(categorical)(key, filtered)
  logprobs = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens.astype(jnp.int32), logprobs


def decode_segments(steps: int, count: int) -> list[int]:
  """The ends (exclusive) of `count` (at most steps - 1) near-equal runs of decode steps t = 1 .. steps - 1."""
  runs = max(1, min(count, steps - 1))
  return [1 + ((steps - 1) * (i + 1)) // runs for i in range(runs)]


def decode_config_of(model_config: ModelConfig, sampling: SamplingConfig) -> ModelConfig:
  """The model config decoding runs: layers unrolled (the weights read in place, see transformer.py), in
  `sampling.rollout_dtype` (params and compute) when it is not float32."""
  decode_config = dataclasses.replace(model_config, scan_layers=False)
  if jnp.dtype(sampling.rollout_dtype) != jnp.float32:
    decode_config = dataclasses.replace(decode_config, dtype=sampling.rollout_dtype,
                                        param_dtype=sampling.rollout_dtype)
  return decode_config


def decode_params(params: Any, model_config: ModelConfig, decode_config: ModelConfig) -> Any:
  """`params` of `model_config` laid out for `decode_config` (`decode_config_of`): scanned layers unstacked, float
  leaves cast to the rollout dtype, but for a quantized base's scales (`kernel_scale`): kept float32, W~ = code x
  scale is computed in float32 and cast to the rollout dtype once, as the merged path's W~ is (a bf16 scale would
  add a second rounding shared by its whole block; benchmarks/qlora_bf16_rollouts.py)."""
  if model_config.scan_layers:
    params = unstack_layers(params, model_config.num_layers)
  dtype = jnp.dtype(decode_config.dtype)
  if dtype != jnp.float32:
    cast = lambda path, p: (p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating)
                            and getattr(path[-1], "key", None) != QUANT_NAMES[1] else p)
    params = jax.tree_util.tree_map_with_path(cast, params)
  return params


def codes_in_step(variables: Any, t: jax.Array) -> Any:
  """`variables` with the quantized kernels' codes (`kernel_q`) passed through an optimization barrier beside the
  decode loop's step t, so that they depend on the step: XLA's loop-invariant code motion would otherwise hoist
  their dequantization out of the while_loop and hold every kernel in float for the whole loop (measured: the
  compiled d64 sampler's temporaries grew by the float kernels' size). In the step each kernel is dequantized in
  its own matmul, one at a time, as in training."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(variables)
  at = [i for i, (path, _) in enumerate(leaves) if getattr(path[-1], "key", None) == QUANT_NAMES[0]]
  codes, _ = lax.optimization_barrier(([leaves[i][1] for i in at], t))
  values = [leaf for _, leaf in leaves]
  for i, leaf in zip(at, codes):
    values[i] = leaf
  return jax.tree_util.tree_unflatten(treedef, values)


def make_sampler(model_config: ModelConfig, sampling: SamplingConfig, prompt_len: int,
                 layout: MeshLayout | None = None, group_size: int = 1,
                 row_keys: bool = False, lora: LoRA | None = None) -> Callable[..., SampleOutput]:
  """-> jitted `sample(params, prompt_tokens [B, P], prompt_mask [B, P], rng[, budgets]) -> SampleOutput` for
  P = prompt_len.

  `budgets` (optional int [B], in 1 .. max_new_tokens): row b also stops after budgets[b] tokens (its token budget;
  a benchmark forces long-tailed lengths with it; as if the last were EOS, but it is kept as drawn).

  Keys: token t of every row is drawn with fold_in(rng, t) (one uniform per row from that key); with `row_keys`
  (or `sampling.row_keys`),
  token t of row b with its own key fold_in(fold_in(rng, b), t) (`rollout_keys`), the scheme of the rollout engine
  (`jaxpt.rl.engine`), under which a rollout's tokens do not depend on the other rows of the batch.

  Every row must hold at least one real prompt token. With a `layout`, it is compiled for that mesh: params laid
  out as `layout.params`, prompts and every output split by rows as `layout.batch` (each device decodes its rows;
  the KV cache is split the same way, KV heads over `tensor` under tp rules), traced under the activation rules.

  Shared-prompt prefill (`group_size` G, which must divide B): rows p*G .. p*G + G-1 are G rollouts of one prompt
  (the trainers' layout, `jaxpt.rl.rollouts.repeat_prompts`), and only the first row of each group is read: the
  prompts are prefilled once each ([B / G, P]) into a cache that the decode reads as a shared prefix
  (`KVCache.prefix`), while each row's own buffers hold its response alone ([B, kv_heads, <= max_new_tokens,
  head_dim]). Every row's first token is drawn from its prompt's logits repeated G times, with the same key
  schedule as G = 1, so the output equals that of the same rows prefilled one by one (to rounding: the attention
  adds the prompt's and the response's values in two sums). Why a shared block rather than a prefill of B / G rows
  broadcast into a [B, ...] cache: the broadcast saves the prefill's compute alone, while every decode step still
  reads each prompt's K/V G times; with the shared block a step reads a prompt's K/V once for its G rows (one
  batched matmul per group), the cache holds the prompt once, and the `cache_segments` growth copies only
  responses. Sharded, the row split keeps each device's groups whole when B / G is a multiple of the data-parallel
  size; otherwise (4 prompts on 8 devices) XLA's partitioner moves rows between devices, with the same results.
  With G = 1 (eval, `jaxpt.load(...).generate`) there is nothing to share and the prompt stays in each row's own
  buffers, response token t at slot P + t, as before.

  `lora` (`jaxpt.nn.lora.LoRA`): the params are a LoRA model's, unmerged (the adapters beside the base; with a
  quantized base its codes, dequantized inside each matmul as in training: no float copy of the base is made);
  adapter dropout is off. None: the plain model's params (a LoRA policy merged, W + s A B).
  """
  if prompt_len <= 0:
    raise ValueError(f"prompt_len={prompt_len}: must be positive")
  if group_size < 1:
    raise ValueError(f"group_size={group_size}: must be positive")
  row_keys = row_keys or sampling.row_keys
  decode_config = decode_config_of(model_config, sampling)
  model = TransformerLM(decode_config, lora=None if lora is None else dataclasses.replace(lora, dropout=0.0))
  in_step = codes_in_step if lora is not None and lora.quant is not None else lambda variables, t: variables
  steps = sampling.max_new_tokens
  segments = decode_segments(steps, sampling.cache_segments)

  def sample(params, prompt_tokens, prompt_mask, rng, budgets=None) -> SampleOutput:
    batch = prompt_tokens.shape[0]
    if prompt_tokens.shape[1] != prompt_len:
      raise ValueError(f"prompt_tokens has {prompt_tokens.shape[1]} columns, the sampler was built for "
                       f"prompt_len={prompt_len}")
    if batch % group_size:
      raise ValueError(f"group_size={group_size} does not divide the {batch} prompt rows")
    variables = {"params": decode_params(params, model_config, decode_config)}
    prompts = batch // group_size
    distinct_tokens, distinct_mask = prompt_tokens[::group_size], prompt_mask[::group_size]
    segment_ids, positions, prompt_lengths = prompt_layout(distinct_mask)
    logits, hidden, prompt_cache = model.apply(
        variables, distinct_tokens.astype(jnp.int32), positions, segment_ids, return_hidden=True,
        cache=init_cache(decode_config, prompts, prompt_len), cache_index=0, last_logits_only=True)
    rows = lambda x: jnp.repeat(x, group_size, axis=0)  # prompt p -> rows p*G .. p*G + G-1
    prompt_lengths = rows(prompt_lengths)
    if group_size == 1:  # nothing to share: the prompt stays in each row's own buffers, responses after it
      cache, first_slot = prompt_cache, prompt_len
    else:  # the prompts are the shared prefix; each row's own buffers will hold its response alone
      cache, first_slot = init_cache(decode_config, batch, 0).replace(prefix=prompt_cache), 0
    outputs = SampleOutput(
        tokens=jnp.full((batch, steps), sampling.pad_id, jnp.int32),
        logprobs=jnp.zeros((batch, steps), jnp.float32), mask=jnp.zeros((batch, steps), jnp.float32),
        lengths=jnp.zeros((batch,), jnp.int32),
        hidden=jnp.zeros((batch, steps, model_config.d_model), jnp.float32) if sampling.return_hidden else None)

    def record(t, outputs, done, logits, hidden):
      """Samples token t from `logits` [B, vocab] and writes it (pad once a row is done) into column t."""
      keys = rollout_keys(rng, jnp.arange(batch), t) if row_keys else jax.random.fold_in(rng, t)
      tokens, logprobs = choose_tokens(logits, keys, sampling)
      live = ~done
      tokens = jnp.where(live, tokens, sampling.pad_id)
      put = lambda buf, col: lax.dynamic_update_index_in_dim(buf, col.astype(buf.dtype), t, axis=1)
      outputs = outputs.replace(
          tokens=put(outputs.tokens, tokens), logprobs=put(outputs.logprobs, jnp.where(live, logprobs, 0.0)),
          mask=put(outputs.mask, live), lengths=outputs.lengths + live.astype(jnp.int32),
          hidden=None if outputs.hidden is None else put(outputs.hidden, jnp.where(live[:, None], hidden, 0.0)))
      done = done | is_stop(tokens, sampling)
      if budgets is not None:
        done = done | (t + 1 >= budgets)
      return tokens, outputs, done

    token, outputs, done = record(0, outputs, jnp.zeros((batch,), bool), rows(logits[:, -1]), rows(hidden[:, -1]))
    state = (jnp.int32(1), token, cache, outputs, done)
    for end in segments:  # steps t < end fill slots < first_slot + end - 1: the cache grows to that, no further
      def keep_going(state, end=end):
        t, _, _, _, done = state
        return (t < end) & ~jnp.all(done)

      def step(state):
        t, token, cache, outputs, done = state
        logits, hidden, cache = model.apply(in_step(variables, t), token[:, None], (prompt_lengths + t - 1)[:, None],
                                            return_hidden=True, cache=cache, cache_index=first_slot + t - 1)
        token, outputs, done = record(t, outputs, done, logits[:, 0], hidden[:, 0])
        return t + 1, token, cache, outputs, done

      t, token, cache, outputs, done = state
      grown = cache.grow(first_slot + max(end - 1, 1))  # (max_new_tokens 1: no step runs, its body is traced)
      state = lax.while_loop(keep_going, step, (t, token, grown, outputs, done))
    return state[3]

  if layout is None:
    return jax.jit(sample)
  rows = layout.batch
  outputs = SampleOutput(tokens=rows, logprobs=rows, mask=rows, lengths=rows,
                         hidden=rows if sampling.return_hidden else None)
  return layout.jit(sample, outputs, in_shardings=(layout.params, rows, rows, layout.replicated))
