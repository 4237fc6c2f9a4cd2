"""The rollout engine: continuous batching of rollouts through a fixed number of decode slots over a paged KV cache.

Input and output are the static sampler's (`jaxpt.rl.sampler.make_sampler`, its module doc): left-padded prompts
[B, P], rows p*G .. p*G + G-1 the G rollouts of prompt p, and a `SampleOutput` [B, max_new_tokens] in the rows'
order, so a trainer reads it unchanged. Token t of rollout b is drawn with key fold_in(fold_in(rng, b), t)
(`rollout_keys`): which slot a rollout lands in, and which rollouts share a step with it, cannot change its tokens;
the static sampler with `row_keys=True` draws the same tokens.

Memory (`jaxpt.nn.paged_cache`): one pool of `num_pages` pages of `page_size` (ps) slots per layer. A prompt of n
real tokens is prefilled once for its G rollouts, when its first rollout is admitted, into ceil(n / ps) pages (freed
when the group's last row finishes). Each row holds its tokens contiguously, token j (prompt j < n, response token
t at j = n + t) at slot j % ps of its table's entry j // ps: the prompt's n // ps full pages are shared (every row
of the group names them), and each row's own pages follow, taken from the free list one page at a time as its tokens
reach them and given back when the row stops; the first of them, when n % ps > 0, starts with a copy of the
prompt's partly filled last page (made when the row is admitted). So a row's new token at position n + t reads its
first n + t + 1 slots in table order, the layout JAX's Pallas paged attention kernel reads in place. A table has
ceil((P + T - 1) / ps) entries (T = max_new_tokens); a row owns at most KR = ceil((ps - 1 + T - 1) / ps) pages.

Each iteration of the decode loop:
1. admit: while a slot is free and rollouts are pending (in row order), take the next one unless the pool is short
   (its prompt's pages, if it is its group's first, and with `reserve_pages` the worst case of every admitted row:
   then it waits for rows to finish); a group's first rollout prefills the prompt and draws the group's G first
   tokens from its last logits (a rollout whose first token is a stop token (EOS or one of `stop_ids`), or whose
   budget is 1 token, is done without a slot);
2. page: each active slot whose next token starts a new page takes one from the free list, in slot order, while it
   lasts; a slot left without one waits this step (only without `reserve_pages`);
3. decode one token for every slot that has its page (the others compute into the sink page, discarded), draw and
   record token t + 1 of each stepping rollout; a row that drew a stop token or its last token frees its slot and
   pages.
The decode step's attention (`EngineConfig.attention`): by default the pure-JAX gather path, for which a slot needs
its first (n + t) // ps + 1 table entries: the slots run through the model sorted by that need, in ATTENTION_CHUNKS
chunks that each gather only the smallest of WIDTH_BUCKETS table widths holding their longest row
(`jaxpt.nn.attention.paged_chunk_attention`, a `lax.switch` per chunk and layer); logits and hidden states are put
back in slot order. With `attention` = pallas_tpu or pallas_gpu, JAX's Pallas kernel for that chip reads each slot's
first n + t + 1 slots in place instead (`jaxpt.nn.attention.pallas_paged_attention`).
Slot-steps lost to the pool are counted in `EngineStats.waits`. Without `reserve_pages`, if no slot can step with
rollouts left (every active slot waits for a page only they could free), the loop stops and the call raises
(`EngineStats.stuck`); with it (the default) that cannot happen, and a pool smaller than one rollout's most pages
(`page_counts`) is refused before compiling.

Why one `lax.while_loop` with the refills inside it rather than a host loop over compiled chunks of K steps: the
loop never leaves the device (no host round trip, no dispatch per chunk, no wasted steps between a row's end and
the chunk's), and the admission is itself a while_loop inside it, cheap when nothing is admitted. (The host-chunk
variant was not built or measured in this increment.) Static shapes throughout: [num_slots] decode batches, fixed
page tables, masked pops and pushes (`jaxpt.nn.paged_cache.FreeList`).

Speed, measured on a 2-core CPU shared with other jobs (load averages in each JSON). Profile of one decode step
(small model, 64 slots, pool of 3072 pages, load ~1): 36 ms gathering 1 table entry per slot, 55 ms at 16, 98 ms
at the whole table of 48, so the attention's gather of whole tables was most of a step; the prefill is not where
time goes (`prefill` in the JSONs: 0.5% of an engine call at the realistic point; 8 prompts a call were 0.6x as
fast as one at a time there, 1.6x at the fixed point, 13% of its call), so prefills stay one prompt a call.
- Realistic point, quiet (`python -m benchmarks.engine --model small --rounds 3 --whole-tables`,
  `benchmarks/results_engine_realistic_small_cpu.json`, each row's tokens contiguous in its pages): medians of the
  rounds' ratios, engine 1.92x the static sampler and 1.42x the whole-table engine (`Engine.attention_chunks =
  width_buckets = 1`); calls 27.3-32.0 s against 41.5-42.3 s and 54.0-61.5 s. Useful slot-steps 61.5% against
  28.5%; compiled peak 249 MiB (whole tables 286) against 632 MiB; prefill 1.9% of an engine call. (At 5f00bac,
  before the contiguous layout: 1.85x and 1.23x.)
- Earlier runs reported a slow first timed call (157.9 s against 27-28 s at 5f00bac; 708 s against 298 s for the
  whole-table engine in a one-round loaded run; the d512 run's "calls differed several-fold" below): the benchmarks
  dispatched their untimed warm-up calls without blocking on them, so those ran inside the first timed call. Fixed
  (the warm-ups are finished before the clock starts); the one-round loaded figures and the d512 run below carry
  that fault.
- Ad-hoc checks, the engine alone (chunked against whole tables, `benchmarks.engine.realistic_rows`, 64 slots,
  answers median 100 max 512, 2 alternated rounds, load 15-17): 64 rollouts (8 prompts x G = 8) 29.0 / 24.1 s
  against 67.7 / 60.9 s a call (2.3-2.5x); the realistic point's 256 rollouts 41.9 / 40.1 s against 57.3 / 63.2 s
  (1.37-1.58x).
- Realistic point at d512 against tunix and HF `generate` (`benchmarks/results_sampler_realistic_cpu.json`, quiet,
  2 rounds, code of 4ba8c1d): median of the rounds' ratios 4.30x tunix tied, 7.42x HF, 1.34x the static sampler;
  the first round's engine call also ran the warm-ups (above), so the engine's figures there are understated.
- Fixed point (batch 8, prompt 32, 128 new tokens, no EOS spread, d512 `issue` model, 5 rounds, load ~20,
  `benchmarks/results_engine_fixed_issue_cpu.json`): engine 1.33x the static sampler, 1.36x the whole-table engine.

Generation rounds (`Engine.rounds`, DAPO's refill rounds): R rounds of B rows in one engine, rows admitted in
order, round-major; the call for round r runs until every row of rounds <= r has finished and admits rows of
rounds <= r + 1, so once round r's rows are all admitted its tail's free slots decode round r + 1 (no round-r row
waits for them: they are admitted only into free slots, their worst-case pages reserved like any row's). The
state (pools, slots, outputs) stays on the device between the calls (donated to the next); a round's rows draw
with its own key, so each round's rollouts are those of a call of its own. A round not asked for is dropped.
Measured (`benchmarks/results_engine_rounds_realistic_small_cpu.json`, d256, two realistic rounds, quiet): both
rounds 1.15x faster than a call each (1478 decode steps against 1842), but round 0 alone 1.17x slower when round 1
is then dropped (the early start's prefills and the tail's busier attention reads are not free on a CPU).

Where it runs: the RL trainers' training rollouts, by default on CPU (the run config's `engine.enabled`,
`EngineConfig.enabled`, `jaxpt.rl.collect.rollout_engine`; with DAPO's dynamic sampling a step's rounds through
`rounds`), and `jaxpt.load(...).generate(..., engine=...)`. On a mesh (`layout`, `Engine.sharded`) each
data-parallel group runs its own engine under `jax.shard_map`: its B / dp rows (whole groups of G), its own slots
and page pool, the params gathered whole onto each device (a group's devices along `tensor` run the same engine: no
collective inside the loop, whose trip count differs between groups); row b's keys are those of its global row, so
the rollouts equal one engine's on one device.

The kernels are JAX's decode-only `paged_attention` for TPU and for GPU (pools [kv_heads, pages, page_size, D], this
engine's layout), checked on CPU in Pallas's interpret modes (tests/test_rl_engine.py) and exported from it for TPU
and CUDA, lowered to Mosaic and Triton calls (tests/test_kernels_lowering.py). The GPU kernel ran on an
H200 (`benchmarks/results_device_h200/at_8070afa/`: 0.72 s against the gather path's 1.40 s and the static
sampler's 0.35 s at the realistic point, bf16, medians of 3 rounds); the TPU one has not run on a TPU. JAX's
`ragged_paged_attention` (K and V interleaved in one pool) does not run in interpret mode in jax 0.10.2, so it is
not used. Not yet (issue 29):
batched prefills (not faster where measured, above); the eval's greedy and pass@1 decodes (they stay on the static
sampler); tensor-parallel params inside a group (they are gathered whole).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from jaxpt.config import Section, at_least, fail, one_of
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_cache
from jaxpt.nn.attention import PAGED_KERNELS, chunk_bounds
from jaxpt.nn.paged_cache import FreeList, PagedKVCache
from jaxpt.parallel import MeshLayout
from jaxpt.rl.sampler import (SampleOutput, SamplingConfig, choose_tokens, decode_config_of, decode_params, is_stop,
                              prompt_layout, rollout_keys)


ATTENTION_KERNELS = PAGED_KERNELS


@dataclasses.dataclass(frozen=True)
class EngineConfig(Section):
  """The engine's slots and page pool.

  Attributes:
    enabled: the RL trainers' training rollouts come from the engine (the run configs' `engine` section, read by
      `jaxpt.rl.collect.rollout_engine`; False: the static sampler, `jaxpt.rl.sampler`). None (the default): where
      it was measured faster, that is on CPU (a GRPO step at the realistic point 1.35x, its rollouts 1.87x; d512
      rollouts 2.15x), unless the run samples through unmerged LoRA adapters (the engine decodes merged params) or
      its prompts do not split over the mesh's data-parallel groups; on GPU and TPU the static sampler (on an H200
      at the realistic point the 64-slot engine took 1.40 s, 0.72 s with the Pallas kernel, against the static
      sampler's 0.35 s; no TPU has run it). `Engine` itself ignores it.
    num_slots: rollouts decoded together (the decode batch); on a mesh, by each data-parallel group. The trainers and
      `jaxpt.load(...).generate` cap it at the rows one engine is given (`for_rows`): a slot more decodes nothing.
      64 is the realistic point's (256 rollouts, long-tailed lengths): fewer slots waste fewer slot-steps on rows
      already done but take more steps; when every row runs about as long, a slot per row is best.
    page_size: KV slots per page.
    num_pages: pages in each layer's pool, on a mesh each data-parallel group's (0: every slot can hold a whole
      rollout at its most pages, `page_counts`); at least one rollout's (see the module doc).
    reserve_pages: admit a rollout only while the free pages cover the rest of every admitted rollout's worst case
      (`own_pages` each): pages are still taken as the responses grow, but no row ever waits for one
      mid-response and the loop cannot get stuck. False: admit whenever the prompt fits (more rows at once in a
      small pool, but rows may wait mid-response and, if all wait, the call fails).
    attention: how a decode step attends over the pages: "gather" (the pure-JAX gather path, chunked by need),
      "pallas_tpu" / "pallas_gpu" (JAX's Pallas paged attention kernel for TPU / GPU, reading the pages in place;
      off its platform in Pallas's interpret mode, for tests only: slow; pallas_gpu needs a power-of-two
      page_size). Gather is the default on every platform until the kernels have run on their chips (they are
      checked here in interpret mode only; the device check times pallas_gpu on a GPU).
    stream_rounds: with DAPO's dynamic sampling, a step's generation rounds stream through one engine call
      (`Engine.rounds`: round r + 1's rollouts start in the slots round r's tail leaves free, before round r's
      rewards say whether it is needed); off: one engine call per round, started once it is needed. The stream
      saves time when refills are frequent and costs it when they are rare (`benchmarks/engine_rounds.py`,
      `benchmarks/results_engine_rounds_realistic_small_cpu.json`: two rounds 1.15x faster than a call each; a
      step that needs no refill 1.17x slower), so it pays when more than about half the steps refill. Read by
      `jaxpt.rl.collect.RolloutCollector`; `Engine` itself ignores it.
  """

  enabled: bool | None = None
  num_slots: int = 64
  page_size: int = 16
  num_pages: int = 0
  reserve_pages: bool = True
  attention: str = "gather"
  stream_rounds: bool = True

  def for_rows(self, rows: int) -> "EngineConfig":
    """This config with at most `rows` slots (the rows one engine is given)."""
    return dataclasses.replace(self, num_slots=max(1, min(self.num_slots, rows)))

  def check(self) -> None:
    at_least(self, "num_slots", 1)
    at_least(self, "page_size", 1)
    at_least(self, "num_pages", 0)
    one_of(self, "attention", ATTENTION_KERNELS)
    if self.attention == "pallas_gpu" and self.page_size & (self.page_size - 1):
      raise fail(self, "page_size", "must be a power of two with attention='pallas_gpu' (Triton loads "
                 "power-of-two blocks of pages)")


@flax.struct.dataclass
class EngineStats:
  """steps: decode iterations; useful: slot-steps that decoded a token of a rollout (of steps * num_slots);
  waits: slot-steps lost to the page pool (a slot left empty with rollouts pending, or a row waiting for its next
  page); peak_pages: most pool pages in use at once; stuck: the loop
  stopped with rollouts left because no slot could get a page."""

  steps: jax.Array
  useful: jax.Array
  waits: jax.Array
  peak_pages: jax.Array
  stuck: jax.Array


@flax.struct.dataclass
class Slots:
  """Per slot [S]: active, rollout (its row), group, prompt length n, t (response index of `token`, the next token
  fed, at position n + t), token; table int32 [S, table width] (its pages in token order, see the module doc)."""

  active: jax.Array
  rollout: jax.Array
  group: jax.Array
  length: jax.Array
  t: jax.Array
  token: jax.Array
  table: jax.Array


@flax.struct.dataclass
class State:
  cache: PagedKVCache
  free: FreeList
  slots: Slots
  group_pages: jax.Array  # int32 [B / G, KP]
  group_rows: jax.Array  # int32 [B / G]: the group's rows not yet finished
  first_token: jax.Array  # int32 [B]
  first_done: jax.Array  # bool [B]
  next_row: jax.Array
  row_done: jax.Array  # bool [B]: the row has finished (its EOS or budget)
  outputs: SampleOutput
  stats: EngineStats


def batch_axes(layout: MeshLayout) -> tuple[str, ...]:
  """The mesh axes `layout.batch` splits the rows over (data, fsdp; `expert` under the ep presets)."""
  axes = layout.batch.spec[0] if layout.batch.spec else None
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def engine_groups(layout: MeshLayout | None) -> int:
  """Engines running side by side on `layout`: the data-parallel size of its batch split (1 without a layout)."""
  return 1 if layout is None else int(np.prod([layout.mesh.shape[a] for a in batch_axes(layout)]))


def combined_stats(stats: EngineStats, total: Callable, most: Callable) -> EngineStats:
  """Data-parallel engines' stats as one: `total` (a sum over the groups) of useful and waits, `most` (a maximum) of
  steps, peak_pages and stuck."""
  return EngineStats(steps=most(stats.steps), useful=total(stats.useful), waits=total(stats.waits),
                     peak_pages=most(stats.peak_pages), stuck=most(stats.stuck.astype(jnp.int32)) > 0)


def own_pages(prompt_length, max_new_tokens: int, page_size: int):
  """The most pages a row with `prompt_length` prompt tokens owns: its prompt's partly filled last page (copied),
  then its response's K/V (the last token's is never written): ceil((n % ps + T - 1) / ps) (ints or arrays)."""
  return -(-(prompt_length % page_size + max_new_tokens - 1) // page_size)


def page_counts(engine: EngineConfig, prompt_len: int, max_new_tokens: int) -> tuple[int, int, int]:
  """-> (KP: a prompt's most pages, one rollout's most pages (its prompt's and its own), pool pages) per the
  module doc; the default pool holds every slot's rollout at that most."""
  ps = engine.page_size
  prompt_pages = -(-prompt_len // ps)
  rollout = max(-(-n // ps) + own_pages(n, max_new_tokens, ps) for n in range(max(1, prompt_len - ps + 1),
                                                                                prompt_len + 1))
  return prompt_pages, rollout, engine.num_pages or engine.num_slots * rollout


ATTENTION_CHUNKS = 4  # a decode step's slots, sorted by the pages they read, attend in this many chunks
WIDTH_BUCKETS = 6  # each chunk gathers the smallest of this many table widths that holds its rows' pages


def attention_widths(pages: int, buckets: int = WIDTH_BUCKETS) -> tuple[int, ...]:
  """The table widths a chunk of slots may gather: `buckets` steps up to a whole table of `pages` entries."""
  buckets = min(pages, buckets)
  return tuple(sorted({-(-pages * (i + 1) // buckets) for i in range(buckets)}))


class Engine:
  """`Engine(model_config, sampling, prompt_len, engine, group_size, layout)(params, prompt_tokens [B, P],
  prompt_mask [B, P], rng[, budgets]) -> SampleOutput` (see the module doc); `run` also returns the `EngineStats`.
  G = group_size must divide B; every row needs at least one real prompt token; `budgets` (int [B] in 1 ..
  max_new_tokens, default all max_new_tokens): row b also stops after budgets[b] tokens, as the static sampler's.
  Checks its inputs before compiling.

  With a `layout` (`jaxpt.parallel.MeshLayout`) each data-parallel group runs its own engine (`sharded`): the rows
  split over the batch's mesh axes as `layout.batch` splits them (B / (dp G) whole groups each, its own slots and
  page pool), the params taken as `layout.params` lays them out and gathered whole onto each device, and the
  rollouts equal to those of one engine on one device (a rollout's keys name its global row)."""

  attention_chunks, width_buckets = ATTENTION_CHUNKS, WIDTH_BUCKETS  # (1, 1: every slot gathers its whole table)

  def __init__(self, model_config: ModelConfig, sampling: SamplingConfig, prompt_len: int,
               engine: EngineConfig = EngineConfig(), group_size: int = 1, layout: MeshLayout | None = None):
    if prompt_len <= 0:
      raise ValueError(f"prompt_len={prompt_len}: must be positive")
    if group_size < 1:
      raise ValueError(f"group_size={group_size}: must be positive")
    self.prompt_pages, need, self.num_pages = page_counts(engine, prompt_len, sampling.max_new_tokens)
    self.table_width = -(-(prompt_len + sampling.max_new_tokens - 1) // engine.page_size)
    if self.num_pages < need:
      raise fail(engine, "num_pages", f"holds less than one rollout: a {prompt_len}-token prompt and "
                 f"{sampling.max_new_tokens} new tokens need {need} pages of {engine.page_size} slots")
    head_dim = model_config.resolved_head_dim
    if engine.attention == "pallas_gpu" and head_dim & (head_dim - 1):
      raise ValueError(f"engine.attention='pallas_gpu': the model's head_dim={head_dim} must be a power of two "
                       "(Triton loads power-of-two blocks)")
    self.model_config, self.sampling, self.prompt_len, self.engine = model_config, sampling, prompt_len, engine
    self.group_size, self.layout = group_size, layout
    self.decode_config = decode_config_of(model_config, sampling)
    self.jitted = jax.jit(self.generate) if layout is None else self.sharded(layout)
    self._rounds_programs = {}

  @property
  def groups(self) -> int:
    """Engines running side by side: the data-parallel size of the layout's batch split (1 without a layout)."""
    return engine_groups(self.layout)

  def __call__(self, params, prompt_tokens, prompt_mask, rng, budgets=None) -> SampleOutput:
    return self.run(params, prompt_tokens, prompt_mask, rng, budgets)[0]

  def check_rows(self, rows: int, columns: int) -> None:
    """ValueError unless prompts of [rows, columns] fit: columns == prompt_len, rows whole groups on each engine."""
    if columns != self.prompt_len:
      raise ValueError(f"prompt_tokens has {columns} columns, the engine was built for prompt_len={self.prompt_len}")
    if rows % self.group_size:
      raise ValueError(f"group_size={self.group_size} does not divide the {rows} prompt rows")
    if rows % (self.group_size * self.groups):
      raise ValueError(f"the {rows // self.group_size} prompts (of {self.group_size} rows each) do not split into "
                       f"whole groups over the {self.groups} data-parallel engines of the mesh")

  def compile(self, params, prompt_tokens, prompt_mask, rng):
    """AOT-compiles the engine for these arguments (`jax.ShapeDtypeStruct`s, with their shardings on a mesh), the
    only ones later calls may pass (without budgets) -> the compiled program (its `memory_analysis()`)."""
    self.check_rows(*prompt_tokens.shape)
    budgets = jax.ShapeDtypeStruct(prompt_tokens.shape[:1], jnp.int32,
                                   sharding=getattr(prompt_tokens, "sharding", None))
    self.jitted = self.jitted.lower(params, prompt_tokens, prompt_mask, rng, budgets).compile()
    return self.jitted

  def run(self, params, prompt_tokens, prompt_mask, rng, budgets=None) -> tuple[SampleOutput, EngineStats]:
    rows, columns = jnp.shape(prompt_tokens)
    self.check_rows(rows, columns)
    budgets = self.checked_budgets(budgets, rows)
    if self.layout is not None:
      budgets = jax.device_put(budgets, self.layout.batch)
    outputs, stats = self.jitted(params, prompt_tokens, prompt_mask, rng, budgets)
    self.raise_if_stuck(stats)
    return outputs, stats

  def checked_budgets(self, budgets, rows: int) -> np.ndarray:
    """budgets int [rows] in 1 .. max_new_tokens (None: all max_new_tokens), else ValueError."""
    steps = self.sampling.max_new_tokens
    if budgets is None:
      return np.full((rows,), steps, np.int32)
    if np.shape(budgets) != (rows,) or not 1 <= np.min(budgets) <= np.max(budgets) <= steps:
      raise ValueError(f"budgets: must be {rows} token budgets in 1 .. max_new_tokens={steps}")
    return np.asarray(budgets, np.int32)

  def raise_if_stuck(self, stats: EngineStats) -> None:
    if bool(stats.stuck):
      raise RuntimeError(
          f"engine.num_pages={self.num_pages}: the page pool ran out with every active slot waiting for a page "
          f"that only those slots could free; give it more pages or use fewer than num_slots="
          f"{self.engine.num_slots}")

  def rounds(self, params, prompt_tokens, prompt_mask, rngs, budgets=None
             ) -> Iterator[tuple[SampleOutput, EngineStats]]:
    """Generation rounds through one engine (DAPO's refill rounds, `jaxpt.rl.collect`): prompt_tokens, prompt_mask
    R arrays [B, P] (round r's rows, laid out as for a call), rngs R keys, budgets None or R arrays [B].

    Yields round r's (SampleOutput [B, T], the engine's stats so far) once all its rows have finished, each row
    as `run(params, prompt_tokens[r], prompt_mask[r], rngs[r], budgets[r])` draws it (its keys are the same).
    While round r's last rows finish, round r + 1's rows take the slots they leave free (continuous batching
    across rounds), so the next round is part done when it is asked for; stop iterating to drop the rest (the
    work spent on it came from slots that would have idled, and its prefills)."""
    R, B = len(prompt_tokens), jnp.shape(prompt_tokens[0])[0]
    for tokens in prompt_tokens:
      self.check_rows(*jnp.shape(tokens))
      if jnp.shape(tokens)[0] != B:
        raise ValueError(f"prompt_tokens: every round must have the same rows ({B}), not {jnp.shape(tokens)[0]}")
    budgets = np.stack([self.checked_budgets(None if budgets is None else budgets[r], B) for r in range(R)])
    program = self.rounds_program(R, B)
    tokens, mask = program.stack(*prompt_tokens), program.stack(*prompt_mask)
    rngs, budgets = jnp.stack(rngs), jax.device_put(budgets, program.rows_sharding)

    def stream():
      state = program.start()
      for r in range(R):
        state = program.advance(params, tokens, mask, rngs, budgets, state, np.int32(r))
        stats = program.stats(state.stats)
        self.raise_if_stuck(stats)
        yield program.round_output(state.outputs, r), stats

    return stream()

  def compile_rounds(self, params, prompt_tokens, rng, rounds: int):
    """AOT-compiles `rounds` for R = `rounds` rounds of prompts like `prompt_tokens` (`jax.ShapeDtypeStruct`s, as
    `compile` takes them) -> the compiled advance (its `memory_analysis()`)."""
    rows, columns = prompt_tokens.shape
    self.check_rows(rows, columns)
    program = self.rounds_program(rounds, rows)
    stacked = jax.ShapeDtypeStruct((rounds, rows, columns), jnp.int32, sharding=program.rows_sharding)
    budgets = jax.ShapeDtypeStruct((rounds, rows), jnp.int32, sharding=program.rows_sharding)
    rngs = jax.ShapeDtypeStruct((rounds,) + rng.shape, rng.dtype, sharding=getattr(rng, "sharding", None))
    state = jax.eval_shape(program.start)
    until = jax.ShapeDtypeStruct((), jnp.int32)
    compiled = program.advance.lower(params, stacked, stacked, rngs, budgets, state, until).compile()
    self._rounds_programs[(rounds, rows)] = dataclasses.replace(program, advance=compiled)
    return compiled

  def rounds_program(self, rounds: int, rows: int) -> "RoundsProgram":
    """The compiled pieces of `rounds` for R rounds of B rows (built once per (R, B))."""
    key = (rounds, rows)
    if key not in self._rounds_programs:
      self._rounds_programs[key] = RoundsProgram.build(self, rounds, rows)
    return self._rounds_programs[key]

  def sharded(self, layout: MeshLayout):
    """`generate` under `jax.shard_map`, manual over every mesh axis: each group (a block of the batch's mesh axes)
    runs its engine on its rows, first row axis_index * rows / dp, with the whole params on each device (the
    devices of a group along the other axes, e.g. `tensor`, run the same engine); jitted with the layout's
    shardings. The stats are summed over the groups (useful, waits) or their maximum (steps, peak_pages, stuck).

    Why not manual over the batch axes alone, the others (`tensor`) left to XLA inside: the groups leave the
    data-dependent decode loop at different steps, and a collective XLA puts inside it (a collective-permute there
    rendezvoused across all 8 CPU devices) then waits for groups that already left: it deadlocked (CPU, 8
    simulated devices, data 2 x fsdp 2 x tensor 2)."""
    axes = batch_axes(layout)
    rows_spec = PartitionSpec(axes)

    def local(params, prompt_tokens, prompt_mask, rng, budgets):
      first_row = lax.axis_index(axes) * prompt_tokens.shape[0]
      outputs, stats = self.generate(params, prompt_tokens, prompt_mask, rng, budgets, first_row)
      return outputs, combined_stats(stats, lambda x: lax.psum(x, axes), lambda x: lax.pmax(x, axes))

    outputs = SampleOutput(tokens=rows_spec, logprobs=rows_spec, mask=rows_spec, lengths=rows_spec,
                           hidden=rows_spec if self.sampling.return_hidden else None)
    mapped = jax.shard_map(local, mesh=layout.mesh, in_specs=(PartitionSpec(), rows_spec, rows_spec, PartitionSpec(),
                                                              rows_spec),
                           out_specs=(outputs, PartitionSpec()), check_vma=False)
    batch, replicated = layout.batch, layout.replicated
    out_shardings = (jax.tree.map(lambda _: batch, outputs, is_leaf=lambda x: isinstance(x, PartitionSpec)),
                     replicated)
    return jax.jit(mapped, in_shardings=(layout.params, batch, batch, replicated, batch), out_shardings=out_shardings)

  def generate(self, params, prompt_tokens, prompt_mask, rng, budgets, first_row=0) -> tuple[SampleOutput,
                                                                                              EngineStats]:
    """One engine on rows [B, ...] (the global rows first_row .. first_row + B - 1: their keys)."""
    state = self.advance(params, prompt_tokens, prompt_mask, rng[None], budgets,
                         self.start(prompt_tokens.shape[0]), 0, first_row)
    return state.outputs, state.stats

  def start(self, rows: int) -> State:
    """An empty engine for `rows` rollouts: every page free, no slot active, nothing admitted."""
    sampling, T, S = self.sampling, self.sampling.max_new_tokens, self.engine.num_slots
    cfg = self.decode_config
    zeros = lambda *shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
    return State(
        cache=PagedKVCache.create(cfg.num_layers, self.num_pages, self.engine.page_size, cfg.num_kv_heads,
                                  cfg.resolved_head_dim, jnp.dtype(cfg.dtype), self.engine.attention),
        free=FreeList.full(self.num_pages),
        slots=Slots(active=zeros(S, dtype=bool), rollout=zeros(S), group=zeros(S), length=zeros(S), t=zeros(S),
                    token=zeros(S), table=zeros(S, self.table_width)),
        group_pages=zeros(rows // self.group_size, self.prompt_pages), group_rows=zeros(rows // self.group_size),
        first_token=zeros(rows), first_done=zeros(rows, dtype=bool), next_row=jnp.int32(0),
        row_done=zeros(rows, dtype=bool),
        outputs=SampleOutput(
            tokens=jnp.full((rows, T), sampling.pad_id, jnp.int32), logprobs=zeros(rows, T, dtype=jnp.float32),
            mask=zeros(rows, T, dtype=jnp.float32), lengths=zeros(rows),
            hidden=zeros(rows, T, self.model_config.d_model, dtype=jnp.float32) if sampling.return_hidden else None),
        stats=EngineStats(steps=jnp.int32(0), useful=jnp.int32(0), waits=jnp.int32(0), peak_pages=jnp.int32(0),
                          stuck=jnp.bool_(False)))

  def advance(self, params, prompt_tokens, prompt_mask, rngs, budgets, state: State, until, first_row=0) -> State:
    """Runs the engine `state` on R rounds of n rows each (prompt_tokens, prompt_mask [R n, P] and budgets [R n],
    round-major; rngs [R] keys) until every row of rounds 0 .. `until` (int, traced) has finished, admitting rows
    (in order) of rounds up to until + 1. Row i is row i % n of round r = i // n, its keys those of the global
    row first_row + i % n under rngs[r] (`rollout_keys`). One round (R = 1, until 0) is a whole call."""
    cfg, sampling, G = self.decode_config, self.sampling, self.group_size
    S, ps, KP, W = self.engine.num_slots, self.engine.page_size, self.prompt_pages, self.table_width
    rows, prompts = prompt_tokens.shape[0], prompt_tokens.shape[0] // G
    per_round = rows // rngs.shape[0]
    admit_end = jnp.minimum((until + 2) * per_round, rows)  # the rows pending admission: rounds <= until + 1
    target = jnp.arange(rows) < (until + 1) * per_round  # the rows that must finish: rounds <= until
    keys = lambda row, t: rollout_keys(rngs[row // per_round], first_row + row % per_round, t)
    model = TransformerLM(cfg)
    variables = {"params": decode_params(params, self.model_config, cfg)}
    prompt_tokens, prompt_mask = prompt_tokens.astype(jnp.int32), prompt_mask[::G]
    prompt_lengths = jnp.sum(prompt_mask > 0, axis=1).astype(jnp.int32)
    widths, chunks = attention_widths(W, self.width_buckets), min(S, self.attention_chunks)
    own_most = lambda n: own_pages(n, sampling.max_new_tokens, ps)

    def prefill(state: State, group):
      """Prefills prompt `group` into pages and draws its G rows' first tokens."""
      tokens, mask = lax.dynamic_index_in_dim(prompt_tokens, group * G), lax.dynamic_index_in_dim(prompt_mask, group)
      segment_ids, positions, _ = prompt_layout(mask)
      logits, hidden, cache = model.apply(variables, tokens, positions, segment_ids, return_hidden=True,
                                          cache=init_cache(cfg, 1, self.prompt_len), cache_index=0,
                                          last_logits_only=True)
      n = prompt_lengths[group]
      ids, free = state.free.pop(jnp.arange(KP) < -(-n // ps))
      slots = jnp.clip(self.prompt_len - n + jnp.arange(KP * ps), 0, self.prompt_len - 1)  # left-aligned

      def to_pages(buffer):  # [1, H_kv, P, D] -> [KP, H_kv, ps, D], real token i at page i // ps, slot i % ps
        kv = buffer[0][:, slots].reshape(buffer.shape[1], KP, ps, buffer.shape[3])
        return kv.swapaxes(0, 1)

      kv_cache = state.cache.write_pages(ids, [to_pages(k) for k in cache.key], [to_pages(v) for v in cache.value])
      group_rows = group * G + jnp.arange(G)
      first, logprobs = choose_tokens(jnp.repeat(logits[:, -1], G, axis=0), keys(group_rows, 0), sampling)
      done = lax.dynamic_slice_in_dim(budgets, group * G, G) <= 1
      done = done | is_stop(first, sampling)
      live = G - jnp.sum(done.astype(jnp.int32))
      free = free.push(ids, (jnp.arange(KP) < -(-n // ps)) & (live == 0))  # every row already done
      put = lambda buf, first_column, fill=0: lax.dynamic_update_slice_in_dim(  # the group's rows: column 0 only
          buf, jnp.full((G,) + buf.shape[1:], fill, buf.dtype).at[:, 0].set(first_column.astype(buf.dtype)),
          group * G, axis=0)
      out = state.outputs
      out = out.replace(
          tokens=put(out.tokens, first, sampling.pad_id),
          logprobs=put(out.logprobs, logprobs), mask=put(out.mask, jnp.ones((G,))),
          lengths=lax.dynamic_update_slice_in_dim(out.lengths, jnp.ones((G,), jnp.int32), group * G, axis=0),
          hidden=None if out.hidden is None else put(out.hidden, jnp.repeat(hidden[:, -1], G, axis=0)))
      return state.replace(
          cache=kv_cache, free=free, outputs=out, group_pages=state.group_pages.at[group].set(ids),
          group_rows=state.group_rows.at[group].set(live),
          first_token=lax.dynamic_update_slice_in_dim(state.first_token, first, group * G, axis=0),
          first_done=lax.dynamic_update_slice_in_dim(state.first_done, done, group * G, axis=0),
          row_done=lax.dynamic_update_slice_in_dim(state.row_done, done, group * G, axis=0))

    def blocked(state: State):
      """Whether the next pending rollout cannot be admitted for want of pages (see `reserve_pages`)."""
      row, s = state.next_row, state.slots
      n = prompt_lengths[jnp.minimum(row // G, prompts - 1)]
      prompt = jnp.where(row % G == 0, -(-n // ps), 0) + (n % ps > 0)  # (+ its copy of the partial page)
      if not self.engine.reserve_pages:
        return state.free.count < prompt
      held = jnp.sum(s.table > 0, axis=1) - s.length // ps  # the pages a row owns
      owed = jnp.sum(jnp.where(s.active, own_most(s.length) - held, 0))  # the admitted rows' worst case to come
      return state.free.count - prompt < owed + own_most(n) - (n % ps > 0)

    def can_admit(state: State):
      return (state.next_row < admit_end) & ~jnp.all(state.slots.active) & ~blocked(state)

    def admit(state: State):
      row = state.next_row
      group = row // G
      state = lax.cond(row % G == 0, prefill, lambda s, g: s, state, group)
      slot = jnp.argmin(state.slots.active)  # the first free one
      take = ~state.first_done[row]
      n = prompt_lengths[group]
      full, copies = n // ps, take & (n % ps > 0)  # the shared full pages; the partly filled one is copied
      own, free = state.free.pop(copies[None])
      prompt = state.group_pages[group]
      cache = state.cache.copy_page(prompt[jnp.minimum(full, KP - 1)], own[0])  # page 0 (no copy): the sink
      row_table = jnp.where(jnp.arange(W) < full, jnp.pad(prompt, (0, W - KP)), 0).at[full].set(own[0], mode="drop")
      s = state.slots
      at = lambda x, value: x.at[slot].set(jnp.where(take, value, x[slot]))
      slots = Slots(active=at(s.active, True), rollout=at(s.rollout, row), group=at(s.group, group),
                    length=at(s.length, n), t=at(s.t, 0), token=at(s.token, state.first_token[row]),
                    table=at(s.table, row_table))
      return state.replace(cache=cache, free=free, slots=slots, next_row=row + 1)

    def step(state: State):
      state = lax.while_loop(can_admit, admit, state)
      s, free = state.slots, state.free
      idle = jnp.where(state.next_row < admit_end, jnp.sum(~s.active), 0)  # free slots while rollouts wait for pages
      position = s.length + s.t  # of the token fed: its K/V go to slot position % ps of table entry position // ps
      column = position // ps
      page = jnp.take_along_axis(s.table, column[:, None], axis=1)[:, 0]
      needs = s.active & (page == 0)
      granted = needs & (jnp.cumsum(needs.astype(jnp.int32)) <= free.count)
      new_pages, free = free.pop(granted)
      used = free.in_use()  # the step's peak: pages are given back only after it
      page = jnp.where(granted, new_pages, page)
      table = s.table.at[jnp.arange(S), column].set(jnp.where(granted, new_pages, s.table[jnp.arange(S), column]))
      stepping = s.active & ~(needs & ~granted)
      need = jnp.where(stepping, column + 1, 1)  # the table entries a slot reads (others: slot 0, discarded)
      order = jnp.argsort(need)  # slots by the pages they read: each chunk gathers its longest row's width
      chunk_need = need[order][np.asarray(chunk_bounds(S, chunks)[1:]) - 1]
      cache = state.cache.replace(
          page_table=table[order], write_page=jnp.where(stepping, page, 0)[order],
          write_offset=jnp.where(stepping, position % ps, 0)[order],
          lengths=jnp.where(stepping, position + 1, 1)[order],
          buckets=jnp.searchsorted(jnp.asarray(widths), chunk_need).astype(jnp.int32), widths=widths)
      logits, hidden, cache = model.apply(variables, s.token[order][:, None], position[order][:, None],
                                          return_hidden=True, cache=cache)
      unsort = jnp.argsort(order)
      logits, hidden = logits[unsort], hidden[unsort]
      cache = cache.replace(page_table=None, write_page=None, write_offset=None, lengths=None, buckets=None,
                            widths=())
      t = s.t + 1
      tokens, logprobs = choose_tokens(logits[:, 0], keys(s.rollout, t), sampling)
      done = stepping & (t >= budgets[s.rollout] - 1)
      done = done | (stepping & is_stop(tokens, sampling))
      out = state.outputs
      row = jnp.where(stepping, s.rollout, rows)  # out of range: dropped
      put = lambda buf, new: buf.at[row, t].set(new.astype(buf.dtype), mode="drop")
      out = out.replace(tokens=put(out.tokens, tokens), logprobs=put(out.logprobs, logprobs),
                        mask=put(out.mask, jnp.ones((S,))), lengths=out.lengths.at[row].add(1, mode="drop"),
                        hidden=None if out.hidden is None else put(out.hidden, hidden[:, 0]))
      # rows that stopped give back their own pages (the prompt's copied partial page, the response's), and the
      # last row of a group its prompt's pages
      group_rows = state.group_rows.at[jnp.where(done, s.group, prompts)].add(-1, mode="drop")
      same_group_before = (s.group[:, None] == s.group[None, :]) & done[None, :] & (
          jnp.arange(S)[None, :] < jnp.arange(S)[:, None])
      frees_prompt = done & (group_rows[s.group] == 0) & ~jnp.any(same_group_before, axis=1)
      owned = (jnp.arange(W)[None, :] >= (s.length // ps)[:, None]) & (table > 0)  # past the shared full pages
      free = free.push(table, done[:, None] & owned)
      prompt_pages = state.group_pages[s.group]
      free = free.push(prompt_pages, frees_prompt[:, None] & (prompt_pages > 0))
      slots = s.replace(active=s.active & ~done, t=jnp.where(stepping, t, s.t),
                        token=jnp.where(stepping, tokens, s.token),
                        table=jnp.where(done[:, None], jnp.zeros_like(table), table))
      row_done = state.row_done.at[jnp.where(done, s.rollout, rows)].set(True, mode="drop")
      stats = state.stats
      stats = stats.replace(
          steps=stats.steps + 1, useful=stats.useful + jnp.sum(stepping), waits=stats.waits + idle + jnp.sum(
              s.active & ~stepping), peak_pages=jnp.maximum(stats.peak_pages, used),
          stuck=~jnp.any(stepping) & unfinished(state))
      return state.replace(cache=cache, free=free, slots=slots, group_rows=group_rows, outputs=out, stats=stats,
                           row_done=row_done)

    def unfinished(state: State):
      return jnp.any(target & ~state.row_done)

    return lax.while_loop(lambda s: unfinished(s) & ~s.stats.stuck, step, state)


@dataclasses.dataclass(frozen=True)
class RoundsProgram:
  """`Engine.rounds`'s jitted pieces for R rounds of B rows: stack(*R arrays [B, ...]) -> [R, B, ...]; start() -> an
  empty engine state for R B rows; advance(params, tokens, mask [R, B, P], rngs [R], budgets [R, B], state, r) ->
  the state once rounds <= r have finished (`Engine.advance`, the state donated); round_output(outputs, r) -> round
  r's SampleOutput [B, T]; stats(state.stats) -> the run's `EngineStats` on the host (the state's own buffers go to
  the next advance). On a mesh each data-parallel group runs its engine on its B / dp rows of each round, its state
  a block of the leading [dp] axis (as `Engine.sharded`)."""

  stack: Callable
  start: Callable
  advance: Callable
  round_output: Callable
  stats: Callable
  rows_sharding: Any  # of [R, B] arrays

  @classmethod
  def build(cls, engine: Engine, rounds: int, rows: int) -> "RoundsProgram":
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # [R, n, ...] -> [R n, ...], round-major
    if engine.layout is None:
      def advance(params, tokens, mask, rngs, budgets, state, until):
        return engine.advance(params, flat(tokens), flat(mask), rngs, flat(budgets), state, until)

      return cls(stack=jax.jit(lambda *xs: jnp.stack(xs)), start=jax.jit(lambda: engine.start(rounds * rows)),
                 advance=jax.jit(advance, donate_argnames="state"),
                 round_output=jax.jit(lambda outputs, r: jax.tree.map(
                     lambda x: lax.dynamic_slice_in_dim(x, r * rows, rows), outputs)),
                 stats=jax.device_get, rows_sharding=None)
    layout, axes, dp = engine.layout, batch_axes(engine.layout), engine.groups
    n = rows // dp
    blocks = PartitionSpec(axes)  # a state leaf [dp, ...]: each group's own
    rows_spec = PartitionSpec(None, axes)  # a rounds array [R, B, ...]: each group's rows of every round
    shapes = jax.eval_shape(lambda: engine.start(rounds * n))
    state_specs = jax.tree.map(lambda _: blocks, shapes)
    sharding = lambda spec: jax.sharding.NamedSharding(layout.mesh, spec)
    state_shardings = jax.tree.map(lambda _: sharding(blocks), shapes)

    def local(params, tokens, mask, rngs, budgets, state, until):
      first_row = lax.axis_index(axes) * tokens.shape[1]
      state = engine.advance(params, flat(tokens), flat(mask), rngs, flat(budgets),
                             jax.tree.map(lambda x: x[0], state), until, first_row)
      return jax.tree.map(lambda x: x[None], state)

    mapped = jax.shard_map(local, mesh=layout.mesh, in_specs=(PartitionSpec(), rows_spec, rows_spec, PartitionSpec(),
                                                              rows_spec, state_specs, PartitionSpec()),
                           out_specs=state_specs, check_vma=False)
    rounds_rows = sharding(rows_spec)
    advance = jax.jit(mapped, in_shardings=(layout.params, rounds_rows, rounds_rows, layout.replicated, rounds_rows,
                                            state_shardings, layout.replicated),
                      out_shardings=state_shardings, donate_argnames="state")
    start = jax.jit(lambda: jax.tree.map(lambda x: jnp.broadcast_to(x, (dp,) + x.shape), engine.start(rounds * n)),
                    out_shardings=state_shardings)

    def round_output(outputs, r):  # [dp, R n, ...] -> round r's [dp n, ...], rows in the batch's order
      return jax.tree.map(lambda x: flat(lax.dynamic_slice_in_dim(x, r * n, n, axis=1)), outputs)

    stats = jax.jit(lambda s: combined_stats(s, jnp.sum, jnp.max))  # the groups' [dp] figures as one

    return cls(stack=jax.jit(lambda *xs: jnp.stack(xs), out_shardings=rounds_rows), start=start, advance=advance,
               round_output=jax.jit(round_output, out_shardings=layout.batch),
               stats=lambda s: jax.device_get(stats(s)), rows_sharding=rounds_rows)
