"""Persistent peer samplers for `benchmarks/sampler.py`: one process per peer, fed one command a line on stdin.

    PEER_PYTHON benchmarks/sampler_peers.py {hf,tunix_untied,tunix_tied} BATCH PROMPT NEW_TOKENS

Run with the python of a venv holding the peer (it imports no jaxpt): `torch` + `transformers` for `hf`,
`google-tunix==0.1.7` for `tunix_*`. The model is the sampler benchmark's (d_model 512, 8 layers, 8 heads with
4 KV heads of 64, SwiGLU 2048, vocab 8192, fp32, random init); every call samples NEW_TOKENS tokens at temperature
1 over the full vocabulary for BATCH random prompts of PROMPT tokens, and no row stops early.

- `hf`: transformers' Qwen2ForCausalLM (tied embeddings, its default attention), `generate(do_sample=True,
  top_k=0, min_new_tokens=N, max_new_tokens=N)` under `torch.inference_mode()` with the default dynamic cache
  (transformers documents the static cache as a speed-up with torch.compile on GPU, not on CPU). torch runs
  with 1 or 2 intra-op threads, whichever was faster in a warm-up call each: on this shared 2-core machine two
  OpenMP threads were up to 10x slower than one while other jobs held the cores (the benchmark also sets
  OMP_WAIT_POLICY=PASSIVE, which made two threads usable again there).
- `tunix_untied` / `tunix_tied`: tunix's Llama3 with `weight_tying` False (tunix's default: an untied
  [512, 8192] head) or True, and its `Sampler` (jitted prefill + while_loop decode; temperature 1 with
  top_p 1.0, its only sampling mode that is not greedy). tunix initialises the SwiGLU kernels to zeros: they get
  random values like every other weight. A minimal tokenizer maps space-separated ids to ids and back; its pad
  and EOS ids are -1 (never a token).

Protocol: after building and an untimed warm-up call (compiles), the process prints `ready <params> [setting]`;
then each input line `run <seed>` makes one call and prints `seconds <wall time of that call>`; `quit` (or EOF)
ends it.
"""

from __future__ import annotations

import sys
import time

from tunix_model import D_MODEL, HEADS, KV_HEADS, LAYERS, VOCAB, IdTokenizer, llama3  # beside this script


def qwen2(d_model: int = D_MODEL, layers: int = LAYERS):
  """transformers' Qwen2ForCausalLM (8 heads, 4 KV heads, SwiGLU 4 * d_model, vocab 8192, tied embeddings, its
  default attention), random init after `torch.manual_seed(0)`: ../shared/bench/hf_reference.py's model."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM

  torch.manual_seed(0)
  return Qwen2ForCausalLM(Qwen2Config(
      vocab_size=VOCAB, hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=layers,
      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
      tie_word_embeddings=True))


def fastest_torch_threads(call) -> str:
  """Sets torch's intra-op threads to 1 or 2, whichever ran one `call(0)` faster (each timed once); -> the
  setting's words for the ready line."""
  import torch

  seconds = {}
  for threads in (1, 2):
    torch.set_num_threads(threads)
    start = time.perf_counter()
    call(0)
    seconds[threads] = time.perf_counter() - start
  torch.set_num_threads(min(seconds, key=seconds.get))
  return f"torch_threads={torch.get_num_threads()} ({', '.join(f'{n}: {s:.2f} s' for n, s in seconds.items())})"


def hf_peer(batch: int, prompt: int, new: int):
  """-> (params, call(seed)) for transformers' generate."""
  import torch

  model = qwen2().eval()
  prompts = torch.randint(0, VOCAB, (batch, prompt))

  def call(seed: int) -> None:
    torch.manual_seed(seed)
    with torch.inference_mode():
      out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                           temperature=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    assert out.shape == (batch, prompt + new), out.shape

  return sum(p.numel() for p in model.parameters()), call


def tunix_peer(batch: int, prompt: int, new: int, tied: bool):
  """-> (params, call(seed)) for tunix 0.1.7's Sampler."""
  import numpy as np
  from tunix.generate.sampler import CacheConfig, Sampler

  model, params = llama3(tied)

  sampler = Sampler(model, IdTokenizer(), CacheConfig(cache_size=prompt + new, num_layers=LAYERS,
                                                       num_kv_heads=KV_HEADS, head_dim=D_MODEL // HEADS))
  texts = [" ".join(map(str, row)) for row in np.random.default_rng(1).integers(0, VOCAB, (batch, prompt))]

  def call(seed: int) -> None:
    out = sampler(texts, max_generation_steps=new, max_prompt_length=prompt, temperature=1.0, top_p=1.0, seed=seed)
    assert all(len(row) == new for row in out.tokens), [len(row) for row in out.tokens]

  return params, call


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
  peer, batch, prompt, new = sys.argv[1], *map(int, sys.argv[2:5])
  if peer == "hf":
    params, call = hf_peer(batch, prompt, new)
  elif peer in ("tunix_untied", "tunix_tied"):
    params, call = tunix_peer(batch, prompt, new, tied=peer == "tunix_tied")
  else:
    raise SystemExit(f"unknown peer {peer!r}")
  call(0)
  serve(call, f"{params} {fastest_torch_threads(call)}" if peer == "hf" else str(params))


if __name__ == "__main__":
  main()
