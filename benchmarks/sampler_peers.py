"""Persistent peer samplers for `benchmarks/sampler.py`: one process per peer, fed one command a line on stdin.

    PEER_PYTHON benchmarks/sampler_peers.py {hf,tunix_untied,tunix_tied} BATCH PROMPT NEW_TOKENS
    PEER_PYTHON benchmarks/sampler_peers.py {hf,tunix_untied,tunix_tied} --rows ROWS.npz

Run with the python of a venv holding the peer (it imports no jaxpt): `torch` + `transformers` for `hf`,
`google-tunix==0.1.7` for `tunix_*`. The model is the sampler benchmark's (d_model 512, 8 layers, 8 heads with
4 KV heads of 64, SwiGLU 2048, vocab 8192, fp32, random init); every call samples NEW_TOKENS tokens at temperature
1 over the full vocabulary for BATCH random prompts of PROMPT tokens, and no row stops early.

`--rows` (the realistic point of `benchmarks/sampler.py`): the rows come from ROWS.npz, written by the benchmark
from `benchmarks/realistic.py`'s rows, so every system gets the same token ids and lengths: `tokens` / `mask`
[R, P] (left-padded with 0, the trainer's layout of B prompts x G), `lengths` [R] (each row's answer length, its
EOS included), `eos`, `max_new` and `model` (d_model, layers, heads, KV heads, vocab). Each call samples all R rows
at once (up to `max_new` tokens, temperature 1) and each row's answer is forced to end at its length by
`force_lengths` through the peer's own logits (EOS's logit -inf before the length, every other -inf at it), so the
peer stops it by its own EOS handling; the call then checks every row's answer length against `lengths`.

- `hf`: transformers' Qwen2ForCausalLM (tied embeddings, its default attention), `generate(do_sample=True,
  top_k=0)` under `torch.inference_mode()` with the default dynamic cache (transformers documents the static cache
  as a speed-up with torch.compile on GPU, not on CPU): `min_new_tokens=max_new_tokens=N` at a fixed point; with
  `--rows` a `LogitsProcessor` (`forced_lengths_processor`) and `eos_token_id=pad_token_id=eos` on the left-padded
  rows and their attention mask: generate keeps stepping a finished row (with pad tokens) until every row has
  finished, then stops; the call checks it stopped at the longest length. torch runs with 1 or 2 intra-op
  threads, whichever was faster in a warm-up call each, or with `--torch-threads N` (`sampler.py --hf-threads`) N
  without that trial, which costs two whole calls (`sampler.py` readies the peers one at a time, before jaxpt
  compiles, so nothing else of the benchmark runs then): on this shared 2-core machine two OpenMP threads were up
  to 10x slower than one while other jobs held the cores (the benchmark also sets OMP_WAIT_POLICY=PASSIVE, which
  made two threads usable again there).
- `tunix_untied` / `tunix_tied`: tunix's Llama3 with `weight_tying` False (tunix's default: an untied
  [d_model, 8192] head) or True, and its `Sampler` (jitted prefill + while_loop decode; temperature 1 with
  top_p 1.0, its only sampling mode that is not greedy). tunix initialises the SwiGLU kernels to zeros: they get
  random values like every other weight. A minimal tokenizer maps space-separated ids to ids and back; its pad
  and EOS ids are -1 (never a token). With `--rows`: tunix 0.1.7's Sampler has no logits hook. Its EOS handling
  (read in tunix/generate/sampler.py): `_sample` marks a row done when it draws one of `eos_tokens`; the decode
  `while_loop` runs while any row is not done (and the buffer has room), stepping the whole batch, done rows
  included; it left-pads each prompt to max_prompt_length with the tokenizer's pad id and takes RoPE positions
  from the non-pad tokens (`build_positions_from_mask`: a row's first real token at 0, its answer token t at
  prompt length + t); the output cuts each row before its first EOS. So the lengths are forced the way a model's
  EOS would end them: the Llama3 runs inside `forced_lengths_model`, an nnx module that applies `force_lengths`
  to its last-position logits (row r's answer tokens so far = its last position - (prompt length - 1)), and the
  call passes `eos_tokens=[eos]`. This is exactly the work tunix does on rows that end by EOS at those lengths
  (prefill + max(lengths) - 1 decode steps of the whole batch), plus one `where` over [R, vocab] logits a step,
  as HF's processor adds.

Protocol: after building and an untimed warm-up call (compiles; with `--rows`, HF's is the rows' call with every
answer forced to end after 2 tokens: eager torch compiles nothing, and a whole call costs minutes at the realistic
point), the process prints `ready <params> [setting]`;
then each input line `run <seed>` makes one call and prints `seconds <wall time of that call>`; `quit` (or EOF)
ends it.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tunix_model import D_MODEL, HEADS, KV_HEADS, LAYERS, VOCAB, IdTokenizer, llama3  # beside this script


def qwen2(d_model: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS, kv_heads: int = KV_HEADS):
  """transformers' Qwen2ForCausalLM (by default 8 heads, 4 KV heads; SwiGLU 4 * d_model, vocab 8192, tied
  embeddings, its default attention), random init after `torch.manual_seed(0)`: ../shared/bench/hf_reference.py's
  model."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM

  torch.manual_seed(0)
  return Qwen2ForCausalLM(Qwen2Config(
      vocab_size=VOCAB, hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=layers,
      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
      tie_word_embeddings=True))


def force_lengths(xp, logits, generated, lengths, eos: int):
  """logits [R, V] of each row's next answer token, with the row forced to end at its length: where generated [R]
  (its answer tokens so far) + 1 >= lengths [R] every logit but EOS's is -inf (EOS's 0), before that EOS's is -inf;
  `xp` is numpy, torch or jax.numpy."""
  last = (generated + 1 >= lengths)[:, None]
  is_eos = xp.arange(logits.shape[-1]) == eos
  return xp.where(is_eos, xp.where(last, 0.0, -np.inf), xp.where(last, -np.inf, logits))


def forced_lengths_processor(lengths, prompt_len: int, eos: int):
  """-> a transformers `LogitsProcessor` forcing row r's answer to end at lengths[r] (torch int [R]) tokens after
  the prompt's prompt_len columns (`force_lengths`)."""
  import torch
  from transformers import LogitsProcessor

  class ForcedLengths(LogitsProcessor):
    def __call__(self, input_ids, scores):
      return force_lengths(torch, scores, torch.tensor(input_ids.shape[1] - prompt_len), lengths, eos)

  return ForcedLengths()


def forced_lengths_model(model, prompt_lengths, lengths, eos: int):
  """-> an nnx module calling tunix's `model` (tokens, positions, cache, attention_mask) whose last-position logits
  force row r's answer to end at lengths[r] (`force_lengths`; answer tokens so far = position - prompt_lengths[r]
  + 1); the lengths are static tuples, so the module's only variables are the model's."""
  import jax.numpy as jnp
  from flax import nnx

  class ForcedLengths(nnx.Module):
    def __init__(self):
      self.model, self.first, self.lengths = model, tuple(int(n) - 1 for n in prompt_lengths), tuple(map(int, lengths))

    def __call__(self, input_tokens, positions, cache, attention_mask):
      logits, cache = self.model(input_tokens, positions, cache, attention_mask)
      generated = positions[:, -1] - jnp.asarray(self.first)
      last = force_lengths(jnp, logits[:, -1], generated, jnp.asarray(self.lengths), eos)
      return logits.at[:, -1].set(last.astype(logits.dtype)), cache

    @property
    def num_embed(self) -> int:
      return self.model.num_embed

  return ForcedLengths()


def check_lengths(peer: str, got, lengths) -> None:
  """Fails the call unless every row's answer length `got` [R] is its forced length."""
  if not np.array_equal(np.asarray(got), lengths):
    raise AssertionError(f"{peer}: answer lengths {np.asarray(got).tolist()} are not the forced {lengths.tolist()}")


def fastest_torch_threads(call, fixed: int = 0) -> str:
  """Sets torch's intra-op threads to 1 or 2, whichever ran one `call(0)` faster (each timed once), or to `fixed`
  (> 0: no trial calls); -> the setting's words for the ready line."""
  import torch

  if fixed:
    torch.set_num_threads(fixed)
    return f"torch_threads={fixed} (fixed: --torch-threads)"
  seconds = {}
  for threads in (1, 2):
    torch.set_num_threads(threads)
    start = time.perf_counter()
    call(0)
    seconds[threads] = time.perf_counter() - start
  torch.set_num_threads(min(seconds, key=seconds.get))
  return f"torch_threads={torch.get_num_threads()} ({', '.join(f'{n}: {s:.2f} s' for n, s in seconds.items())})"


def hf_sampler(model, tokens, mask, **generate_kwargs):
  """-> sample(seed): `model.generate` (transformers) of tokens / mask (torch int [R, P]) at temperature 1 over
  the full vocabulary (do_sample, top_k 0) under `torch.inference_mode()`, torch seeded with `seed`, with
  `generate_kwargs`; returns its tokens [R, P + new]."""
  import torch

  def sample(seed: int):
    torch.manual_seed(seed)
    with torch.inference_mode():
      return model.generate(tokens, attention_mask=mask, do_sample=True, top_k=0, temperature=1.0, **generate_kwargs)

  return sample


def tunix_sampler(tied: bool, prompt: int, new: int, dims=(D_MODEL, LAYERS, HEADS, KV_HEADS), wrap=lambda m: m):
  """-> (params, sample(texts, seed, **kwargs)): tunix 0.1.7's Sampler of `wrap(model)`, model = `llama3(tied,
  *dims)` (dims: d_model, layers, heads, KV heads), with a cache of prompt + new slots; `sample` calls it at
  temperature 1, top_p 1.0, up to `new` tokens after prompts left-padded to `prompt`."""
  from tunix.generate.sampler import CacheConfig, Sampler

  d_model, layers, heads, kv_heads = dims
  model, params = llama3(tied, *dims)
  sampler = Sampler(wrap(model), IdTokenizer(), CacheConfig(cache_size=prompt + new, num_layers=layers,
                                                             num_kv_heads=kv_heads, head_dim=d_model // heads))

  def sample(texts: list[str], seed: int, **kwargs):
    return sampler(texts, max_generation_steps=new, max_prompt_length=prompt, temperature=1.0, top_p=1.0, seed=seed,
                   **kwargs)

  return params, sample


def hf_peer(batch: int, prompt: int, new: int):
  """-> (params, call(seed)) for transformers' generate."""
  import torch

  model = qwen2().eval()
  prompts = torch.randint(0, VOCAB, (batch, prompt))
  sample = hf_sampler(model, prompts, torch.ones_like(prompts), max_new_tokens=new, min_new_tokens=new,
                      pad_token_id=0)

  def call(seed: int) -> None:
    out = sample(seed)
    assert out.shape == (batch, prompt + new), out.shape

  return sum(p.numel() for p in model.parameters()), call


def tunix_peer(batch: int, prompt: int, new: int, tied: bool):
  """-> (params, call(seed)) for tunix 0.1.7's Sampler."""
  params, sample = tunix_sampler(tied, prompt, new)
  texts = [" ".join(map(str, row)) for row in np.random.default_rng(1).integers(0, VOCAB, (batch, prompt))]

  def call(seed: int) -> None:
    out = sample(texts, seed)
    assert all(len(row) == new for row in out.tokens), [len(row) for row in out.tokens]

  return params, call


def hf_rows_peer(rows: dict):
  """-> (params, call(seed), warm_up(seed)) for transformers' generate on the rows of ROWS.npz (see the module
  doc); warm_up samples the same rows with every answer forced to end after 2 tokens."""
  import torch
  from transformers import LogitsProcessorList

  model = qwen2(*model_dims(rows)).eval()
  tokens, mask = torch.from_numpy(rows["tokens"].astype(np.int64)), torch.from_numpy(rows["mask"].astype(np.int64))
  prompt, lengths, eos = tokens.shape[1], rows["lengths"], int(rows["eos"])

  def forced_call(forced: np.ndarray):
    processors = LogitsProcessorList([forced_lengths_processor(torch.from_numpy(forced.astype(np.int64)), prompt,
                                                               eos)])
    sample = hf_sampler(model, tokens, mask, max_new_tokens=int(rows["max_new"]), eos_token_id=eos,
                        pad_token_id=eos, logits_processor=processors)

    def call(seed: int) -> None:
      answers = sample(seed)[:, prompt:].numpy() == eos
      assert answers.shape[1] == forced.max() and answers.any(axis=1).all(), answers.shape
      check_lengths("hf", np.argmax(answers, axis=1) + 1, forced)

    return call

  # eager torch compiles nothing: a warm-up of the same rows ended after 2 tokens (prefill + one decode step) meets
  # every kernel shape a whole call does but the growing cache's
  return sum(p.numel() for p in model.parameters()), forced_call(lengths), forced_call(np.full_like(lengths, 2))


def tunix_rows_peer(rows: dict, tied: bool):
  """-> (params, call(seed), warm_up(seed)) for tunix 0.1.7's Sampler on the rows of ROWS.npz (see the module
  doc); warm_up is call: the lengths are static in the compiled loop, so only a whole call compiles it."""
  tokens, mask, lengths, eos = rows["tokens"], rows["mask"], rows["lengths"], int(rows["eos"])
  params, sample = tunix_sampler(tied, tokens.shape[1], int(rows["max_new"]), model_dims(rows),
                                 wrap=lambda model: forced_lengths_model(model, mask.sum(axis=1), lengths, eos))
  texts = [" ".join(map(str, row[keep == 1])) for row, keep in zip(tokens, mask)]

  def call(seed: int) -> None:
    out = sample(texts, seed, eos_tokens=[eos])
    check_lengths("tunix", [len(row) + 1 for row in out.tokens], lengths)  # tunix cuts each row before its EOS

  return params, call, call


def model_dims(rows: dict) -> tuple[int, int, int, int]:
  """ROWS.npz's model: (d_model, layers, heads, KV heads)."""
  return tuple(map(int, rows["model"][:4]))


def read_rows(path: str) -> dict:
  """ROWS.npz's arrays (see the module doc); a model of another vocabulary than the peers' is refused."""
  with np.load(path) as data:
    rows = dict(data)
  if int(rows["model"][4]) != VOCAB:
    raise SystemExit(f"{path}: model vocab {int(rows['model'][4])}, the peers build {VOCAB}")
  return rows


def serve(call, ready: str) -> None:
  """The protocol: prints `ready <ready>`, then answers each `run <seed>` line with `seconds <wall time of
  call(seed)>` until `quit` or EOF."""
  print(f"ready {ready}", flush=True)
  for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
      break
    start = time.perf_counter()
    call(int(words[1]))
    print("seconds", time.perf_counter() - start, flush=True)


def main() -> None:
  argv, threads = sys.argv[1:], 0
  if "--torch-threads" in argv:  # hf: torch's intra-op threads, instead of the trial
    at = argv.index("--torch-threads")
    threads = int(argv[at + 1])
    del argv[at:at + 2]
  peer = argv[0]
  if peer not in ("hf", "tunix_untied", "tunix_tied"):
    raise SystemExit(f"unknown peer {peer!r}")
  if argv[1] == "--rows":
    rows = read_rows(argv[2])
    params, call, warm_up = hf_rows_peer(rows) if peer == "hf" else tunix_rows_peer(rows, tied=peer == "tunix_tied")
  else:
    batch, prompt, new = map(int, argv[1:4])
    params, call = (hf_peer(batch, prompt, new) if peer == "hf"
                    else tunix_peer(batch, prompt, new, tied=peer == "tunix_tied"))
    warm_up = call
  warm_up(0)
  serve(call, f"{params} {fastest_torch_threads(call, threads)}" if peer == "hf" else str(params))


if __name__ == "__main__":
  main()
