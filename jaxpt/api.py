"""The Python surface for notebooks and scripts: `jaxpt.load(path)` -> `Model`.

    model = jaxpt.load("/tmp/jaxpt-tiny")               # a jaxpt run's workdir: its latest checkpoint (or step=N)
                                                         # (a PPO run's: its policy; the critic is not loaded)
    model = jaxpt.load("hf:/models/Qwen2.5-0.5B")       # a Hugging Face checkpoint directory (jaxpt.models.hf)
    model = jaxpt.load("hf:/models/Qwen2.5-0.5B", adapter="/adapters/x")  # with PEFT LoRA adapters (merged)
    model.config, model.params, model.tokenizer          # ModelConfig, the param tree, encode / decode
    model.logits(ids)                                    # int [batch, seq] -> float32 [batch, seq, vocab]
    model.generate(["2 + 3 ="], max_new_tokens=8)        # -> list[str], through the KV-cache sampler
                                                         # (engine=True: the rollout engine, jaxpt.rl.engine)
    model.score(prompts, responses)                      # reward models: float32 [n]
    model.save_hf("/tmp/export")                         # config.json + safetensors (jaxpt.models.hf_export)
                                                         # (a reward model: transformers' ...ForSequenceClassification)
    model.save_adapters("/tmp/adapters")                 # a LoRA run's (or adapter=) adapters in PEFT's format

With `mesh=` (a `jax.sharding.Mesh`) the params are created in the logical-axis rules' sharding (`rules=`, default
fsdp_tp) and every call runs on that mesh; without it they live on the first device.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from jaxpt.config import ConfigError
from jaxpt.data.preference_batches import response_sequences
from jaxpt.data.tokenizer import chat_prompt, encode_prompts_as_trained
from jaxpt.models import hf, hf_config, hf_export, hf_peft
from jaxpt.models.config import ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.lora import LoRAConfig
from jaxpt.parallel.rules import get_rules
from jaxpt.parallel.sharding import param_shardings
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.sampler import SamplingConfig, make_sampler
from jaxpt.engine.record import recorded_config
from jaxpt.engine.trainers import recorded_trainer
from jaxpt.engine.saved_model import LOADABLE, load_run, loadable_model, maybe_tokenizer

PROMPT_BUCKET = 16  # prompt lengths are padded up to a multiple of this, so nearby lengths share one compiled sampler


@dataclasses.dataclass(eq=False)
class Model:
  """A loaded model: `TransformerLM` params (kind 'lm') or `RewardModel` params (kind 'reward'), its tokenizer
  (jaxpt's sentencepiece `Tokenizer` or an `HFTokenizer`; None when the checkpoint has none) and where it came from.
  """

  config: ModelConfig
  params: Any
  tokenizer: Any
  kind: str = "lm"
  num_scores: int = 1
  source: str = ""
  tokenizer_dir: str | None = None
  prompt_format: str = "plain"  # how the run it came from formatted prompts: 'plain' | 'chat' (its chat template)
  special_ids: dict | None = None  # config.json's bos/eos/pad_token_id of the HF checkpoint it came from
  lora: LoRAConfig | None = None  # a LoRA model's lora section: `params` hold W + s A B, `adapters` A and B
  adapters: Any = None  # its adapters (`jaxpt.nn.lora.adapter_params`, unmerged); None without LoRA
  base_model: str | None = None  # the HF checkpoint directory the adapters belong to, if known
  _samplers: dict = dataclasses.field(default_factory=dict, repr=False)

  # -- language models --------------------------------------------------------------------------------------------

  def logits(self, token_ids) -> jax.Array:
    """token_ids int [batch, seq] (right-padded rows are fine: causal) -> float32 logits [batch, seq, vocab]."""
    self._need("lm", "logits")
    token_ids = np.asarray(token_ids)
    if not isinstance(token_ids, jax.core.Tracer) and getattr(token_ids, "is_fully_addressable", True):
      self._check_ids("logits", token_ids, "token_ids")  # not inside jit / grad, nor on another host's shards
    return self._forward(self.params, jnp.asarray(token_ids, jnp.int32))

  @functools.cached_property
  def _forward(self):
    model = TransformerLM(self.config)
    return jax.jit(lambda params, tokens: model.apply({"params": params}, tokens).astype(jnp.float32))

  def generate(self, prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0, chat: bool | None = None,
               engine: EngineConfig | bool | None = None) -> list[str]:
    """The continuation of each prompt (decoded, special tokens dropped): greedy when temperature is 0, else sampled at
    `temperature` with the top-k / top-p filters (0 / 1 = off) from `jax.random.PRNGKey(seed)`. A row stops at the
    tokenizer's EOS or another of its `stop_ids` (an HF checkpoint's generation_config.json eos_token_id list, e.g.
    an instruct model's end-of-turn), as transformers' generate does. chat: each prompt as one user turn of the
    tokenizer's chat template (default: as the run this model came from formatted its prompts). Prompts are
    tokenized as the trainers tokenize them (`encode_prompts_as_trained`) and left-padded into one batch; prompt +
    response must fit config.max_seq_len. engine: an `EngineConfig` (or True: its defaults) decodes through the
    rollout engine (`jaxpt.rl.engine`: continuous batching over a paged KV cache, for many prompts of spread-out
    lengths), which draws row b's token t with key fold_in(fold_in(PRNGKey(seed), b), t): greedy output as the
    static sampler's, sampled output as the static sampler's with `SamplingConfig.row_keys`."""
    self._need("lm", "generate")
    if temperature < 0:
      raise ValueError(f"generate: temperature={temperature}: must be >= 0 (0 = greedy)")
    tokenizer = self._need_tokenizer("generate")
    rows = self._prompt_ids(prompts, self.prompt_format == "chat" if chat is None else chat)
    if not rows:
      return []
    if min(map(len, rows)) == 0:
      raise ValueError("generate: an empty prompt (every prompt needs at least one token)")
    self._check_ids("generate", rows, "the prompts' token ids")
    prompt_len = -(-max(map(len, rows)) // PROMPT_BUCKET) * PROMPT_BUCKET
    if max(map(len, rows)) + max_new_tokens > self.config.max_seq_len:
      raise ValueError(f"generate: the longest prompt ({max(map(len, rows))} tokens) + max_new_tokens="
                       f"{max_new_tokens} exceeds config.max_seq_len={self.config.max_seq_len}")
    prompt_len = min(prompt_len, self.config.max_seq_len - max_new_tokens)
    pad_id = _pad_id(tokenizer)
    tokens = np.full((len(rows), prompt_len), pad_id, np.int32)
    mask = np.zeros((len(rows), prompt_len), np.int32)
    for i, ids in enumerate(rows):
      tokens[i, prompt_len - len(ids):], mask[i, prompt_len - len(ids):] = ids, 1
    sampling = SamplingConfig(max_new_tokens, temperature=temperature if temperature > 0 else 1.0, top_k=top_k,
                              top_p=top_p, greedy=temperature == 0, eos_id=tokenizer.eos_id,
                              stop_ids=tokenizer.stop_ids, pad_id=pad_id)
    engine = EngineConfig() if engine is True else engine or None
    if engine is not None:
      engine = engine.for_rows(len(tokens))
    out = self._sampler(sampling, prompt_len, engine)(self.params, tokens, mask, jax.random.PRNGKey(seed))
    out_tokens, out_mask = np.asarray(out.tokens), np.asarray(out.mask)
    return [tokenizer.decode(row[row_mask > 0]) for row, row_mask in zip(out_tokens, out_mask)]

  def _sampler(self, sampling: SamplingConfig, prompt_len: int, engine: EngineConfig | None = None):
    """The jitted sampler (or rollout engine) for these settings (built once per settings and prompt length)."""
    key = (sampling, prompt_len, engine)
    if key not in self._samplers:
      self._samplers[key] = (jax.jit(make_sampler(self.config, sampling, prompt_len)) if engine is None
                             else Engine(self.config, sampling, prompt_len, engine))
    return self._samplers[key]

  def _prompt_ids(self, texts: Sequence[str], chat: bool) -> list[list[int]]:
    """Prompt ids as the trainers make them: plain text, or one user turn of the chat template when `chat`."""
    if chat:
      texts = [chat_prompt(self.tokenizer, text, "chat") for text in texts]
    return [list(ids) for ids in encode_prompts_as_trained(self.tokenizer, list(texts), chat)]

  # -- reward models ----------------------------------------------------------------------------------------------

  def score(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
    """Reward of each (prompt, response): the score head on the last token of prompt + response + EOS, built as the
    reward-model trainer builds its pairs (its data.prompt_format included), left-truncated to
    config.max_seq_len: float32 [n] ([n, 2] for ODIN: quality, length)."""
    self._need("reward", "score")
    tokenizer = self._need_tokenizer("score")
    if len(prompts) != len(responses):
      raise ValueError(f"score: {len(prompts)} prompts but {len(responses)} responses")
    prompt_ids = self._prompt_ids(prompts, self.prompt_format == "chat")
    response_ids = [list(tokenizer.encode(r)) for r in responses]
    if not prompt_ids:
      return np.zeros((0,) if self.num_scores == 1 else (0, self.num_scores), np.float32)
    longest = max(len(p) + len(r) + 1 for p, r in zip(prompt_ids, response_ids))
    seq_len = min(self.config.max_seq_len, -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET)
    end = tokenizer.eos_id if tokenizer.eos_id is not None else _pad_id(tokenizer)
    self._check_ids("score", [p + r + [end] for p, r in zip(prompt_ids, response_ids)],
                    "the prompt + response + EOS token ids")
    tokens, last = response_sequences(prompt_ids, response_ids, seq_len, _pad_id(tokenizer), end)
    return np.asarray(self._score(self.params, tokens, last))

  @functools.cached_property
  def _score(self):
    model = RewardModel(self.config, num_scores=self.num_scores)
    return jax.jit(lambda params, tokens, last: model.apply({"params": params}, tokens, last)[0])

  # -- export -----------------------------------------------------------------------------------------------------

  def save_hf(self, out_dir: str, format: str = "auto", overwrite: bool = False) -> str:
    """Writes the model as a Hugging Face checkpoint directory (jaxpt.models.hf_export.save_hf) with its tokenizer
    files; returns the format: 'transformers' (pre-scheme models) or 'jaxpt' (native, e.g. SiameseNorm). A reward
    model is written as a sequence classifier (transformers' `...ForSequenceClassification`, or jaxpt's own) with
    its number of scores and prompt format, so that `load("hf:" + out_dir).score` scores as this model does."""
    reward = (dict(num_scores=self.num_scores, prompt_format=self.prompt_format) if self.kind == "reward" else
              None)
    special = self.special_ids  # an HF checkpoint's as it had them, else its tokenizer's
    if special is None and self.tokenizer is not None:
      special = dict(bos_token_id=self.tokenizer.bos_id, eos_token_id=self.tokenizer.eos_id,
                     pad_token_id=self.tokenizer.configured_pad_id)  # pad_id falls back to EOS: not a pad token
    return hf_export.save_hf(self.params, self.config, out_dir, format=format, special_ids=special,
                             tokenizer_dir=self.tokenizer_dir if self.tokenizer is not None else None,
                             overwrite=overwrite, reward=reward)

  def save_adapters(self, out_dir: str, overwrite: bool = False) -> None:
    """Writes the LoRA adapters alone in PEFT's format (adapter_config.json + adapter_model.safetensors,
    `jaxpt.models.hf_peft`), which `peft.PeftModel.from_pretrained` loads on the transformers model of the base.
    ValueError for a model without adapters or a reward model; ConfigError for a model transformers has no class
    for; FileExistsError as save_hf (`overwrite` replaces a previous export)."""
    if self.adapters is None:
      raise ValueError(f"save_adapters: {self.source} has no LoRA adapters (a LoRA run's model, or "
                       "load('hf:BASE', adapter=DIR), has them)")
    if self.kind != "lm":
      raise ValueError(f"save_adapters: {self.source} is a reward model (its score head is no adapter); save_hf "
                       "writes it with the adapters merged")
    hf_peft.save_adapters(self.adapters, self.config, self.lora, out_dir, base_model=self.base_model,
                          overwrite=overwrite)

  # -- checks -----------------------------------------------------------------------------------------------------

  def _need(self, kind: str, what: str) -> None:
    if self.kind != kind:
      is_reward = self.kind == "reward"
      raise ValueError(f"{what}: {self.source} is a {'reward' if is_reward else 'language'} model (use "
                       f"{'score' if is_reward else 'logits / generate'})")

  def _check_ids(self, what: str, rows: Sequence[Sequence[int]] | np.ndarray, name: str) -> None:
    """A one-line ValueError naming the first token id of `rows` (row i: `name` of input i) outside [0,
    config.vocab_size) and its position (i, j); on the host, before the jitted call, where such an id is no error
    (the embedding gather fills or clamps it) and gives a plausible-looking answer."""
    vocab = self.config.vocab_size
    if isinstance(rows, np.ndarray) and (rows.size == 0 or (rows.min() >= 0 and rows.max() < vocab)):
      return  # the common case in one pass
    for i, row in enumerate(rows):
      ids = np.asarray(row)
      outside = np.flatnonzero((ids < 0) | (ids >= vocab))
      if outside.size:
        j = int(outside[0])
        raise ValueError(f"{what}: token id {ids.flat[j]} at position ({i}, {j}) of {name} is outside the model's "
                         f"vocabulary [0, {vocab}) (config.vocab_size={vocab})")

  def _need_tokenizer(self, what: str):
    if self.tokenizer is None:
      raise ValueError(f"{what}: {self.source} has no tokenizer (pass token ids to logits instead)")
    return self.tokenizer


def _pad_id(tokenizer) -> int:
  """The tokenizer's pad id, or 0 for one without pad and EOS tokens (padding is masked out either way)."""
  return tokenizer.pad_id if tokenizer.pad_id is not None else 0


def _shardings(abstract: Any, mesh: Mesh | None, rules: str) -> Any:
  if mesh is None:
    return None
  return param_shardings(abstract, mesh, get_rules(rules))


def _load_hf(directory: str, mesh: Mesh | None, rules: str, overrides: dict, adapter: str | None = None) -> Model:
  source, special = f"{hf.HF_PREFIX}{directory}", hf_config.special_ids(directory)
  if hf_config.is_reward_model(hf_config.read_hf_json(directory)):  # a reward-model export (or classifier)
    if adapter is not None:
      raise ConfigError("adapter", f"{source} is a reward model; PEFT adapters load over a language model", adapter)
    config, params, record = hf.load_reward(directory, mesh=mesh, rules=rules, **overrides)
    return Model(config, params, maybe_tokenizer(directory), kind="reward", num_scores=record["num_scores"],
                 source=source, tokenizer_dir=directory, prompt_format=record["prompt_format"], special_ids=special)
  config = hf_config.read_config(directory, **overrides)
  lora = None
  if adapter is not None:  # checked against the model before any array is read
    lora = hf_peft.adapter_lora(adapter)
    hf_peft.check_adapter(adapter, config, lora, "adapter")
  params = hf.load_params(directory, config, mesh, rules=rules)
  adapters = None
  if lora is not None:
    params, adapters = _with_peft_adapters(config, params, lora, mesh, rules)
  return Model(config, params, maybe_tokenizer(directory), source=source, tokenizer_dir=directory,
               special_ids=special, lora=lora, adapters=adapters, base_model=directory if lora else None)


def _with_peft_adapters(config: ModelConfig, params: Any, lora: LoRAConfig, mesh: Mesh | None,
                        rules: str) -> tuple[Any, Any]:
  """(params with the adapters of `lora.init_adapter` merged in, W + s A B; those adapters), laid out like the
  params (on `mesh` by `rules`, else on the first device)."""
  model = TransformerLM(config, lora=lora.spec())
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32)))["params"]
  abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), nn.meta.unbox(boxed))
  shardings = _shardings(boxed, mesh, rules)
  if shardings is None:
    shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract)
  template = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), abstract,
                          shardings)
  adapters = hf_peft.load_adapters(lora.init_adapter, template, "adapter")
  full = lora_lib.with_adapters(params, lora_lib.replace_adapters(template, adapters))
  merged = jax.jit(functools.partial(lora_lib.merge_params, scale=lora.scale),
                   out_shardings=lora_lib.base_params(shardings))(full)
  return merged, adapters


def _load_run(workdir: str, step: int | None, mesh: Mesh | None, rules: str, overrides: dict) -> Model:
  saved = load_run(workdir, step, mesh, rules, overrides)
  return Model(saved.config, saved.params, saved.tokenizer, kind=saved.kind, num_scores=saved.num_scores,
               source=workdir, tokenizer_dir=saved.tokenizer_dir, prompt_format=saved.prompt_format,
               lora=saved.lora, adapters=saved.adapters, base_model=saved.base_model)


def load(path: str, *, step: int | None = None, mesh: Mesh | None = None, rules: str = "fsdp_tp",
         kind: str | None = None, adapter: str | None = None, **model_overrides: Any) -> Model:
  """A `Model` from `path`: `hf:DIR` (a Hugging Face checkpoint directory, or a jaxpt export: a reward model's
  loads as one), or the workdir of a jaxpt run whose checkpoints hold a language model or a reward model
  (`Trainer.model` in `jaxpt.engine.trainers.TRAINERS`) at its latest checkpoint or `step`. A PPO run loads as its
  policy (kind 'lm'; its critic is not part of the Model, and `save_hf` / `jaxpt export-hf` write the policy only).

  kind: 'lm' or 'reward' to refuse anything else (a ConfigError naming the path), checked before the params load.
  adapter: with `hf:DIR`, a PEFT LoRA adapter directory (`jaxpt.models.hf_peft`) over that base: the params are
  the merged W + s A B, `Model.adapters` the adapters (ConfigError naming `adapter` for adapters that do not fit).
  model_overrides: ModelConfig fields that change how the model runs (dtype, param_dtype, max_seq_len, remat,
  scan_layers, ...); one that contradicts the checkpoint's architecture is a ConfigError naming both values.
  """
  if kind is not None and kind not in LOADABLE:
    raise ConfigError("kind", f"must be one of {', '.join(LOADABLE)}", kind)
  if path.startswith(hf.HF_PREFIX):
    directory = os.path.expanduser(path[len(hf.HF_PREFIX):])
    if kind is not None:
      _check_kind(path, kind, "reward" if hf_config.is_reward_model(hf_config.read_hf_json(directory)) else "lm")
    return _load_hf(directory, mesh, rules, model_overrides, None if adapter is None else os.path.expanduser(adapter))
  if adapter is not None:
    raise ConfigError("adapter", f"takes an hf:BASE path (the base the PEFT adapters belong to), not {path!r}",
                      adapter)
  workdir = os.path.expanduser(path)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"{path}: no such directory (a jaxpt workdir, or hf:DIR for a Hugging Face checkpoint)")
  config_file = os.path.join(workdir, hf_config.CONFIG_FILE)
  if not os.path.isdir(os.path.join(workdir, "checkpoints")) and os.path.isfile(config_file):
    if "model_type" in hf_config.read_hf_json(workdir):
      raise ConfigError("path", f"is a Hugging Face checkpoint directory: load it as 'hf:{path}'", path)
  if kind is not None:
    _check_kind(path, kind, loadable_model(workdir, recorded_trainer(recorded_config(workdir))))
  return _load_run(workdir, step, mesh, rules, model_overrides)


def _check_kind(path: str, wanted: str, found: str) -> None:
  if found != wanted:
    names = {"lm": "a language model", "reward": "a reward model"}
    raise ConfigError("path", f"holds {names[found]}, not {names[wanted]}", path)


def adapter_caveats(model: Model) -> list[str]:
  """What a user loading `model`'s exported adapters must know: a base that is no HF checkpoint, a quantized one."""
  caveats = []
  if model.base_model is None:
    caveats.append("base_model_name_or_path is null: the run's base is no Hugging Face checkpoint (export the run it "
                   "started from with export-hf, and load the adapters over that)")
  if model.lora.base_quant != "none":
    caveats.append(f"trained over a {model.lora.base_quant}-quantized base (lora.base_quant): over a float base the "
                   "outputs differ by the quantization error")
  return caveats


def run_export_hf(workdir: str, step: int | None, out: str, format: str = "auto", overwrite: bool = False,
                  merge: bool = False, adapters: bool = False) -> int:
  """`jaxpt export-hf`: loads the run (or `hf:DIR`) at `step` and writes it to `out` (Model.save_hf); one line on
  stdout naming what was written; exit code 0, or 2 with one line on stderr (no such run or checkpoint, an `out`
  that exists, a model the format cannot hold). A LoRA run needs `merge` (the full model with W + s A B in place
  of each adapted kernel) or `adapters` (the adapters alone in PEFT's format, Model.save_adapters)."""
  from jaxpt.progress import say

  out = os.path.abspath(os.path.expanduser(out))
  try:
    if step is not None and workdir.startswith(hf.HF_PREFIX):
      raise ValueError(f"--step={step}: a Hugging Face checkpoint ({workdir}) has no steps")
    if merge and adapters:
      raise ValueError("--merge and --adapters: choose one (the merged full model, or the adapters alone)")
    if adapters and format != "auto":
      raise ValueError(f"--format={format}: --adapters writes PEFT's format (--format is for full models)")
    say(f"loading {workdir}{'' if step is None else f' at step {step}'} ...")
    model = load(workdir, step=step)
    if model.lora is None and (merge or adapters):
      raise ValueError(f"--{'merge' if merge else 'adapters'}: {model.source} is not a LoRA run (no adapters)")
    if model.lora is not None and not (merge or adapters):
      raise ValueError(f"{model.source} is a LoRA run: --merge writes the full model with its adapters merged "
                       "(W + s A B), --adapters the adapters alone in PEFT's format")
    say(f"writing {out} ...")
    if adapters:
      model.save_adapters(out, overwrite=overwrite)
    else:
      written = model.save_hf(out, format=format, overwrite=overwrite)
  except (FileNotFoundError, FileExistsError, ValueError) as e:  # ConfigError and DataError are ValueErrors
    print(f"jaxpt export-hf: {e}", file=sys.stderr)
    return 2
  if jax.process_index() != 0:
    return 0
  size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".safetensors"))
  if adapters:
    print(f"jaxpt export-hf: wrote the LoRA adapters of {model.source} (rank {model.lora.rank}, targets "
          f"{model.lora.targets}) in PEFT's format to {out} ({size / 2**10:.1f} KiB of safetensors)", flush=True)
    for caveat in adapter_caveats(model):
      print(f"jaxpt export-hf: note: {caveat}", flush=True)
    return 0
  what = f"{written}-format {'reward-model ' if model.kind == 'reward' else ''}checkpoint"
  merged = ", its LoRA adapters merged," if merge else ""
  print(f"jaxpt export-hf: wrote {model.source}{merged} as a {what} to {out} ({size / 2**20:.1f} MiB "
        f"of safetensors{', and its tokenizer' if model.tokenizer is not None else ''})", flush=True)
  return 0
