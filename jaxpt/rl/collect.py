"""Rollout collection of an RL run: the compiled samplers, the tokenizer, the prompts and the verifier in one object.

`RolloutCollector.step_rollouts(params, batch, step, rng)`, for a batch of B prompts (rows p*G .. p*G + G-1 of every
[N = B*G, ...] array are prompt p's group, `jaxpt.rl.rollouts`):

    prompts [B, P] --repeat G--> [N, P] --sampler (KV cache)--> tokens, mask, old_logp [N, T], hidden [N, T, d]
      (the sampler prefills each of the B prompts once and decodes its G rows over that shared K/V, `group_size`)
      --decode + verifier (`reward_fn`)--> scores [N]; rewards = scores + DAPO's soft overlong punishment
      (+ DAPO dynamic sampling: all-equal groups dropped, refill prompts sampled, `jaxpt.rl.dapo`)
      (+ bf16 rollouts: old_logp recomputed by the fp32 policy, teacher forcing)

Where `rollout_engine` chooses it (the run config's `engine.enabled`, `jaxpt.rl.engine.EngineConfig`: by default on
CPU) the training rollouts, DAPO's refill rounds too, come from the rollout engine (continuous batching over a paged
KV cache; on a mesh one engine per data-parallel group) instead of the static sampler: the same `SampleOutput`,
hidden states (CLIPO) and bf16 rollouts included, each rollout drawn with its own keys (`rollout_keys`), so
`sampling.row_keys` makes the static sampler draw the same rollouts. With dynamic sampling (and
`engine.stream_rounds`, the default) a step's generation rounds stream through one engine (`round_drawer`,
`Engine.rounds`): all max_rounds rounds' prompts are read at the step's start (their positions are fixed), and while
round r's last rows finish, round r + 1's rows take the slots they leave free; whether round r + 1 is needed is
decided on the host from round r's verified rewards, as before, and a round not needed is dropped with the work its
early start did in otherwise idle slots. The eval (greedy accuracy, sampled pass@1) stays on the static sampler.

`contrastive_rewards` is CLIPO's head step and reward r_con [N] on those rollouts (`jaxpt.rl.clipo`); `evaluate`
the greedy accuracy and sampled pass@1 on held-out prompts. The update that trains on the rollouts is the trainer's
(`jaxpt.trainers.grpo`). On a mesh (`layout`) the sampler and the log-probs are compiled for it; each process reads
and verifies only its own prompts' rows, and the per-rollout host numbers (scores, rewards, lengths: [N] each) are
all-gathered, so that group statistics and DAPO's choices are the same on every process. The run config
(`jaxpt.trainers.grpo.GRPORunConfig`, `jaxpt.trainers.ppo_config.PPORunConfig`) is read for `task`, `seed`,
`data`, `sampling`, `group_size` (rollouts per prompt), `dapo`, `model` and `clipo` (a run config without that
section has CLIPO off: `clipo_of`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt import parallel
from jaxpt.config import ConfigError
from jaxpt.data import order, text_bias
from jaxpt.data.math_task import PromptData
from jaxpt.progress import say
from jaxpt.rl import clipo, dapo
from jaxpt.rl.engine import Engine, EngineConfig, engine_groups, page_counts
from jaxpt.rl.logprobs import response_logprobs
from jaxpt.rl.rewards import math_reward
from jaxpt.rl.rollouts import RewardFn, repeat_prompts, response_texts, verifier_rewards
from jaxpt.rl.sampler import SamplingConfig, make_sampler

TRAIN_REWARDS = "train_rewards"  # a round's reward as the run trains on it, when its `score` hook gives one
BIAS_PREFIX = "bias_"  # the rollouts' per-row flags of each text_bias detector: bias_<name> bool [N]


def clipo_of(config: Any) -> clipo.CLIPOConfig:
  """The run's `clipo` section; off (the defaults) for an RL run config without one (PPO)."""
  return getattr(config, "clipo", None) or clipo.CLIPOConfig()


def engine_of(config: Any) -> EngineConfig:
  """The run's `engine` section; off for a run config without one."""
  return getattr(config, "engine", None) or EngineConfig(enabled=False)


def rollout_engine(config: Any, groups: int, platform: str) -> EngineConfig | None:
  """The engine config the run's training rollouts go through on `groups` data-parallel engines (`engine_groups`)
  of `platform` devices ('cpu', 'gpu', 'tpu'), its slots capped at one engine's rows; None: the static sampler.
  `engine.enabled` None (auto) chooses the engine on CPU where it can take the run (see `EngineConfig.enabled`);
  True asks for it, and prompts that do not split over the groups are then a ConfigError."""
  engine, lora = engine_of(config), getattr(config, "lora", None)
  splits = config.data.prompts_per_step % groups == 0
  if engine.enabled is None:
    if not (platform == "cpu" and splits and not (lora is not None and lora.samples_unmerged)):
      return None
  elif not engine.enabled:
    return None
  elif not splits:
    raise ConfigError("data.prompts_per_step", f"must be divisible by the {groups} data-parallel groups of the "
                      "mesh, each running its own rollout engine (config.engine.enabled)", config.data.prompts_per_step)
  return engine.for_rows(config.data.prompts_per_step * config.group_size // groups)


def check_config(config: Any) -> None:
  """The run config's checks across the sections collection reads (ConfigError naming the field): prompt +
  response within the model's max_seq_len, DAPO's overlong buffer within the response cap, no overlong
  filtering with an in-loss CLIPO term (which reads the loss mask the filtering empties), and with the engine on a
  page pool that holds one rollout (`jaxpt.rl.engine.page_counts`)."""
  prompt_len, new_tokens = config.data.max_prompt_len, config.sampling.max_new_tokens
  if prompt_len + new_tokens > config.model.max_seq_len:
    raise ConfigError("sampling.max_new_tokens", f"prompt ({prompt_len}) + response longer than "
                      f"config.model.max_seq_len={config.model.max_seq_len}", new_tokens)
  if config.dapo.overlong_buffer > new_tokens:
    raise ConfigError("dapo.overlong_buffer", f"must be <= config.sampling.max_new_tokens={new_tokens}",
                      config.dapo.overlong_buffer)
  if config.dapo.overlong_filtering and clipo_of(config).enabled and clipo_of(config).in_loss_coef > 0:
    raise ConfigError("dapo.overlong_filtering", "cannot be combined with config.clipo.in_loss_coef > 0 (the "
                      "in-loss CLIPO term reads the loss mask it empties)", True)
  engine = engine_of(config)
  lora = getattr(config, "lora", None)
  if engine.enabled and lora is not None and lora.samples_unmerged:  # (auto takes the static sampler there)
    raise ConfigError("lora.rollouts", "the rollout engine (config.engine.enabled) decodes merged params only: set "
                      "config.lora.rollouts=merged (a quantized base's float copy) or turn the engine off",
                      lora.rollouts)
  _, rollout_pages, pool = page_counts(engine, prompt_len, new_tokens)
  if engine.enabled is not False and pool < rollout_pages:
    raise ConfigError("engine.num_pages", f"holds less than one rollout: a config.data.max_prompt_len={prompt_len} "
                      f"prompt and {new_tokens} new tokens need {rollout_pages} pages of "
                      f"config.engine.page_size={engine.page_size} slots", engine.num_pages)


def first_problems(prompts: PromptData, count: int) -> dict[str, list[dict]]:
  """Each held-out set's prompt batches, cut to the batches that hold its first `count` problems."""
  size = prompts.batch_size
  return {name: batches[:-(-count // size)] for name, batches in prompts.eval_sets().items()} if count else {}


def run_stop_ids(tokenizer: Any, sampling: SamplingConfig) -> tuple[int, ...]:
  """The ids an RL run's rollouts stop at: the tokenizer's `stop_ids` (EOS first) and then `sampling.stop_ids` (the
  config's own, added: e.g. a token that ends an answer); left out of the decoded text the verifier reads."""
  return tuple(dict.fromkeys((*tokenizer.stop_ids, *sampling.stop_ids)))


@dataclasses.dataclass
class RolloutCollector:
  """Samples, decodes and verifies an RL run's rollouts (see the module docstring); built once by `create`."""

  config: Any  # the run config (GRPORunConfig, PPORunConfig): task, seed, data, sampling, group_size, dapo, model
  layout: parallel.MeshLayout  # the run's mesh: params' and batch shardings
  tokenizer: Any  # jaxpt's sentencepiece Tokenizer, or an HFTokenizer (init_from='hf:DIR')
  prompts: PromptData
  sample: Callable  # (params, prompt_tokens, prompt_mask, rng) -> SampleOutput, sampled, [N, P] (G rows a prompt):
  # the static sampler, or the rollout engine (`jaxpt.rl.engine.Engine`) where `rollout_engine` chooses it
  sample_greedy: Callable  # the same, greedy, for eval batches of `eval_batch_size` prompts
  sample_eval: Callable  # the same as `sample`, for eval batches (sampled pass@1, data.eval_samples)
  logprobs: Callable  # response_logprobs(params, prompt_tokens, prompt_mask, tokens, mask), compiled on the mesh
  take_rows: Callable  # (pytree of global [M, ...] arrays, rows int [n]) -> the rows, split like a batch
  clipo_step: Callable  # (head state, hidden, mask, labels, group_ids, rng) -> (head state, r_con [N], metrics)
  eval_sets: dict  # name -> the prompt batches holding its first `data.eval_prompts` problems (encoded once)
  process_slice: tuple[int, int] = (0, 1)  # this process reads prompt block `index` of `count` of each batch
  reward_fn: RewardFn = math_reward  # the verifier: (response text, answer) -> score (replace for another task)
  sampler_memory: dict = dataclasses.field(default_factory=dict)  # compiled per-device memory of `sample` (MiB)
  engine: Engine | None = None  # with the engine and stream_rounds: DAPO's refill rounds stream through it

  @classmethod
  def create(cls, config: Any, model: Any, layout: parallel.MeshLayout, abstract_params: Any, tokenizer: Any,
             data_dir: str) -> "RolloutCollector":
    """Encodes the task's prompts (`PromptData.create`, TFDS data under `data_dir`) and compiles the samplers, the
    teacher-forced log-probs and the row gather for `layout`; `abstract_params`: the policy's params as shapes
    (jax.eval_shape), those `model` reads (a LoRA `model.lora`: unmerged, the samplers read them as it does).
    ConfigError when the processes cannot split the prompts."""
    prompts = PromptData.create(config.task, tokenizer, batch_size=config.data.prompts_per_step,
                                prompt_len=config.data.max_prompt_len, seed=config.seed, data_dir=data_dir)

    def settings(greedy: bool) -> SamplingConfig:
      return dataclasses.replace(config.sampling, greedy=greedy, eos_id=tokenizer.eos_id,
                                 stop_ids=run_stop_ids(tokenizer, config.sampling),
                                 pad_id=tokenizer.pad_id, return_hidden=clipo_of(config).enabled)

    def sampler(greedy: bool, group_size: int = 1) -> Callable:
      return make_sampler(config.model, settings(greedy), config.data.max_prompt_len, layout, group_size,
                          lora=model.lora)

    rows = config.data.prompts_per_step * config.group_size
    index, count = parallel.process_batch_slice(layout.batch, rows)
    if config.data.prompts_per_step % count:
      raise ConfigError("data.prompts_per_step", f"must be divisible by the {count} processes that read distinct "
                        "prompts", config.data.prompts_per_step)
    params = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), abstract_params,
                          layout.params)
    prompts_abstract = jax.ShapeDtypeStruct((rows, config.data.max_prompt_len), jnp.int32, sharding=layout.batch)
    rng_abstract = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=layout.replicated)
    engine_config = rollout_engine(config, engine_groups(layout), layout.mesh.devices.flat[0].platform)
    if engine_config is not None:  # training rollouts (and DAPO's refills) through the engine; eval stays static
      engine = Engine(config.model, settings(False), config.data.max_prompt_len, engine_config, config.group_size,
                      layout)
      say(f"compiling the rollout engine ({engine_config.num_slots} slots) ...")
      if config.dapo.dynamic_sampling and engine_config.stream_rounds:  # a step's rounds through one stream
        sample, compiled = engine, engine.compile_rounds(params, prompts_abstract, rng_abstract,
                                                         config.dapo.max_rounds)
      else:
        sample, compiled = engine, engine.compile(params, prompts_abstract, prompts_abstract, rng_abstract)
        engine = None  # one call per round (`sample`): no stream
    else:
      engine = None
      say("compiling the rollout sampler ...")
      sample = compiled = sampler(False, config.group_size).lower(params, prompts_abstract, prompts_abstract,
                                                                  rng_abstract).compile()
    temperature = config.sampling.temperature
    logprobs = layout.jit(lambda params, *arrays: response_logprobs(model, params, *arrays, temperature=temperature),
                          layout.batch, in_shardings=(layout.params,) + (layout.batch,) * 4)
    take_rows = layout.jit(lambda tree, rows: jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree), layout.batch)

    def clipo_step(head, hidden, mask, labels, group_ids, rng):
      reps = clipo.rollout_representation(hidden, mask)
      return clipo.head_step(clipo_of(config), head, reps, labels, group_ids, rng)

    return cls(config=config, layout=layout, tokenizer=tokenizer, prompts=prompts, sample=sample,
               sample_greedy=sampler(True), sample_eval=sampler(False), logprobs=logprobs, take_rows=take_rows,
               clipo_step=layout.jit(clipo_step, layout.replicated),
               eval_sets=first_problems(prompts, config.data.eval_prompts), process_slice=(index, count),
               sampler_memory=parallel.compiled_memory(compiled), engine=engine)

  @property
  def rollout_rows(self) -> int:
    """N = prompts_per_step x group_size: rollouts sampled per generation round."""
    return self.config.data.prompts_per_step * self.config.group_size

  @property
  def eval_batch_size(self) -> int:
    """Prompts per eval batch: prompts_per_step rounded up to a multiple of the data-parallel devices."""
    dp = parallel.data_parallel_size(self.layout.mesh)
    return -(-self.config.data.prompts_per_step // dp) * dp

  def batches(self, start: int) -> Iterator[dict]:
    """This process's prompts of steps start, start + 1, ... (host arrays, block `process_slice` of each)."""
    index, count = self.process_slice
    return order.step_batches(self.prompts.batch, self.prompts.batch_size, start, index, count)

  def verify(self, out: Any, answers: list[str], group_size: int) -> dict[str, np.ndarray]:
    """Decodes and verifies this process's rows of a sampler output (global [M, T]; `answers` are its prompts'
    answers, G rows each) -> every process's {scores float32, lengths int32, truncated bool, bias_<name> bool (each
    `jaxpt.data.text_bias` detector's flag of the decoded text)} [M], whole. Every process must get here: one whose
    decode or reward_fn raises leaves the others waiting in the all-gather."""
    tokens, mask = parallel.process_rows(out.tokens), parallel.process_rows(out.mask)
    lengths = parallel.process_rows(out.lengths)
    stops = run_stop_ids(self.tokenizer, self.config.sampling)
    texts = response_texts(self.tokenizer.decode, tokens, mask, stops, self.tokenizer.vocab_size)
    local = {"scores": verifier_rewards(texts, answers, group_size, self.reward_fn), "lengths": lengths,
             "truncated": dapo.truncated(lengths, tokens[:, -1], self.config.sampling.max_new_tokens,
                                         stops),
             **{f"{BIAS_PREFIX}{name}": flagged for name, flagged in text_bias.flags(texts).items()}}
    return parallel.all_rows(local, self.layout.batch, out.tokens.shape[0])

  def rollouts(self, params: Any, batch: dict, rng: jax.Array) -> dict:
    """Samples G responses per prompt of the global batch whose process block is `batch` and scores them.

    Device arrays (global, rows split like a batch): prompt_tokens, prompt_mask [N, P], tokens, mask, old_logp
    [N, T] (the sampler's log-probs), hidden [N, T, d] (None without CLIPO). Host arrays, whole on every process:
    scores, rewards (+ the overlong punishment), labels, truncated, lengths, group_ids [N].
    """
    prompts = self.round_prompts(batch)
    return self.scored_rollouts(batch, prompts, self.sample(params, prompts["prompt_tokens"],
                                                            prompts["prompt_mask"], rng))

  def round_prompts(self, batch: dict) -> dict:
    """The global prompt_tokens, prompt_mask [N, P] of the batch whose process block is `batch`, G rows each."""
    tokens, mask, _ = repeat_prompts(batch["prompt_tokens"], batch["prompt_mask"], self.config.group_size)
    return parallel.global_batch({"prompt_tokens": tokens, "prompt_mask": mask}, self.layout.batch,
                                 self.rollout_rows)

  def scored_rollouts(self, batch: dict, prompts: dict, out: Any) -> dict:
    """`rollouts`' dict of the sampler output `out` of `prompts` (`round_prompts(batch)`)."""
    g = self.config.group_size
    host = self.verify(out, batch["answers"], g)
    settings = self.config.dapo
    rewards = host["scores"] + dapo.overlong_penalty(host["lengths"], self.config.sampling.max_new_tokens,
                                                     settings.overlong_buffer, settings.overlong_penalty_factor)
    return {**prompts, "tokens": out.tokens, "mask": out.mask, "old_logp": out.logprobs, "hidden": out.hidden,
            **host, "rewards": rewards, "labels": (host["scores"] > 0).astype(np.int32),
            "group_ids": np.repeat(np.arange(self.config.data.prompts_per_step, dtype=np.int32), g)}

  def step_rollouts(self, params: Any, batch: dict, step: int, rng: jax.Array,
                    score: Callable[[dict, dict], dict] | None = None) -> tuple[dict, dict]:
    """The rollouts trained on at `step` (`rollouts` of `batch`, key `rng`), and their DAPO metrics; with
    `dapo.dynamic_sampling`, round r >= 1 samples `prompts.refill_batch(step * (max_rounds - 1) + r - 1)` with
    key fold_in(rng, r) until the batch holds data.prompts_per_step informative groups (`jaxpt.rl.dapo`).
    score(round, its prompt batch) -> {name: host array [N]}: added to every generation round's rollouts before the
    filter reads them (a trainer's reward-model scores, so each round is scored once); its `TRAIN_REWARDS` array,
    the reward the run trains on before normalisation, is what filter_metric 'reward' reads (else the collector's
    `rewards`).
    With bf16 rollouts (`sampling.rollout_dtype`) the trained rows' old_logp are then recomputed by the fp32 policy
    (teacher forcing), once, after any refills; CLIPO's hidden states stay the sampler's.
    Metrics: truncated_frac, overlong_penalty_mean, bias_<name>_share (the share of responses each
    `jaxpt.data.text_bias` detector flags) of the trained batch; with dynamic sampling dapo_rounds,
    dapo_groups_drawn / _informative / _filled and dapo_step_accuracy (the step's own prompts: comparable across
    runs, where the loop's `accuracy` is the trained batch's, which dynamic sampling biases)."""
    settings = self.config.dapo
    scored = lambda ro, prompts: {**ro, **score(ro, prompts)} if score is not None else ro
    draw = self.round_drawer(params, batch, step, rng, scored)
    first = draw(0)
    ro, metrics = first, {}
    if settings.dynamic_sampling:
      key = "scores" if settings.filter_metric == "score" else TRAIN_REWARDS if TRAIN_REWARDS in first else "rewards"
      ro, metrics = dapo.dynamic_sampling(draw, self.config.data.prompts_per_step, self.config.group_size,
                                          settings.max_rounds, settings.at_cap, key, take=self.take_rows,
                                          min_std=settings.filter_min_std)
      metrics["dapo_step_accuracy"] = float(first["scores"].mean())
    if self.config.sampling.rollout_dtype != "float32":  # the bf16 sampler's log-probs -> the fp32 policy's
      ro["old_logp"] = self.logprobs(params, *(ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")))
    metrics["truncated_frac"] = float(ro["truncated"].mean())
    metrics.update(text_bias.shares({k[len(BIAS_PREFIX):]: v for k, v in ro.items() if k.startswith(BIAS_PREFIX)}))
    if settings.overlong_buffer:
      metrics["overlong_penalty_mean"] = float(np.mean(ro["rewards"] - ro["scores"]))
    return ro, metrics

  def round_drawer(self, params: Any, batch: dict, step: int, rng: jax.Array, scored: Callable[[dict, dict], dict]
                   ) -> Callable[[int], dict]:
    """draw(r) -> generation round r's scored rollouts (r = 0, 1, ... in order, each drawn once): round 0 samples
    `batch` with `rng`, round r >= 1 `prompts.refill_batch(step (max_rounds - 1) + r - 1)` with fold_in(rng, r).
    With dynamic sampling and the engine streaming rounds (`engine.stream_rounds`) every round streams through one
    engine (`Engine.rounds`: round r + 1's rollouts start in the slots round r's tail leaves free; the same rollouts
    as a call per round)."""
    settings = self.config.dapo
    batches = {0: batch}  # round r's prompt batch (this process's block), made once

    def batch_of(r: int) -> dict:
      if r not in batches:
        batches[r] = self.prompts.refill_batch(step * (settings.max_rounds - 1) + r - 1, *self.process_slice)
      return batches[r]

    key_of = lambda r: rng if r == 0 else jax.random.fold_in(rng, r)
    if settings.dynamic_sampling and self.engine is not None:
      prompts = [self.round_prompts(batch_of(r)) for r in range(settings.max_rounds)]
      stream = self.engine.rounds(params, [p["prompt_tokens"] for p in prompts],
                                  [p["prompt_mask"] for p in prompts], [key_of(r) for r in range(settings.max_rounds)])
      sample = lambda r: self.scored_rollouts(batch_of(r), prompts[r], next(stream)[0])
    else:
      sample = lambda r: self.rollouts(params, batch_of(r), key_of(r))
    drawn = []

    def draw(r: int) -> dict:
      while len(drawn) <= r:
        drawn.append(scored(sample(len(drawn)), batch_of(len(drawn))))
      return drawn[r]

    return draw

  def contrastive_rewards(self, head: Any, ro: dict, rng: jax.Array) -> tuple[Any, np.ndarray, dict]:
    """CLIPO on rollouts `ro`: one step of the contrastive head on their hidden states -> (the new head state,
    r_con float32 [N] on the host, the head's scalar metrics as clipo_<name>)."""
    head, contrastive, metrics = self.clipo_step(head, ro["hidden"], ro["mask"], ro["labels"], ro["group_ids"], rng)
    return head, np.asarray(contrastive), {f"clipo_{k}": float(v) for k, v in metrics.items() if jnp.ndim(v) == 0}

  def evaluate(self, params: Any) -> dict:
    """Greedy accuracy on the first `data.eval_prompts` problems of each held-out set (`eval_accuracy_<name>`),
    and with data.eval_samples = k the sampled pass@1 (`eval_pass1_<name>`, sample j of batch b drawn with the
    fixed key fold_in(fold_in(PRNGKey(1), b), j)). Every process holds each eval batch whole (padded to
    `eval_batch_size` with copies of its last prompt) and verifies the rows its devices decoded."""
    size, samples = self.eval_batch_size, self.config.data.eval_samples
    index, count = parallel.process_batch_slice(self.layout.batch, size)
    mine = slice(index * size // count, (index + 1) * size // count)
    results = {}
    for name, batches in self.eval_sets.items():
      greedy, sampled = [], [[] for _ in range(samples)]
      for b, batch in enumerate(batches):
        real = len(batch["answers"])
        pad = lambda x: np.concatenate([x, np.repeat(x[-1:], size - real, axis=0)])
        prompts = parallel.full_batch({k: pad(np.asarray(batch[k])) for k in ("prompt_tokens", "prompt_mask")},
                                      self.layout.batch)
        answers = (list(batch["answers"]) + [batch["answers"][-1]] * (size - real))[mine]
        out = self.sample_greedy(params, prompts["prompt_tokens"], prompts["prompt_mask"], jax.random.PRNGKey(0))
        greedy.extend(self.verify(out, answers, 1)["scores"][:real])
        for j in range(samples):
          key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(1), b), j)
          out = self.sample_eval(params, prompts["prompt_tokens"], prompts["prompt_mask"], key)
          sampled[j].extend(self.verify(out, answers, 1)["scores"][:real])
      first = self.config.data.eval_prompts
      results[f"eval_accuracy_{name}"] = float(np.mean(greedy[:first]))
      if samples:
        results[f"eval_pass1_{name}"] = float(np.mean([scores[:first] for scores in sampled]))
    return results
