"""HF transformers `generate` on a CUDA GPU as a persistent peer process (the protocol of `sampler_peers.py`).

    python benchmarks/torch_cuda_peer.py {eager,static} BATCH PROMPT NEW D_MODEL LAYERS HEADS KV_HEADS MLP VOCAB

Run with a python holding torch (CUDA) and transformers; it imports no jaxpt. The model is transformers'
LlamaForCausalLM (RMSNorm eps 1e-5, its default RoPE theta 10000, SwiGLU, no biases, tied embeddings: jaxpt's
Pre-Norm LM) in bfloat16 with random weights. Each call samples NEW tokens at temperature 1 over the whole
vocabulary for BATCH random prompts of PROMPT tokens (`min_new_tokens` = NEW: no row stops early), under
`torch.inference_mode()`.
- `eager`: the default dynamic cache and attention (SDPA);
- `static`: `cache_implementation="static"`, with which transformers' `generate` compiles the decoding forward
  with torch.compile (its documented fastest configuration on GPU); the warm-up call compiles.

Protocol: after building and two untimed warm-up calls, prints `ready <params> <setting>`; each input line
`run <seed>` makes one call and prints `seconds <wall time>` (the GPU synchronised); `quit` or EOF ends it.
"""

from __future__ import annotations

import sys

from sampler_peers import serve  # beside this script


def build(mode: str, batch: int, prompt: int, new: int, d_model: int, layers: int, heads: int, kv_heads: int,
          mlp: int, vocab: int):
  """-> (params, call(seed))."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  torch.manual_seed(0)
  config = LlamaConfig(vocab_size=vocab, hidden_size=d_model, intermediate_size=mlp, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=prompt + new,
                       rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
                       mlp_bias=False)
  model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
  prompts = torch.randint(0, vocab, (batch, prompt), device="cuda")
  extra = {"cache_implementation": "static"} if mode == "static" else {}

  def call(seed: int) -> None:
    torch.manual_seed(seed)
    with torch.inference_mode():
      out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                           temperature=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0, **extra)
    torch.cuda.synchronize()
    assert out.shape == (batch, prompt + new), out.shape

  return sum(p.numel() for p in model.parameters()), call


def main() -> None:
  mode = sys.argv[1]
  if mode not in ("eager", "static"):
    raise SystemExit(f"unknown mode {mode!r}: eager | static")
  params, call = build(mode, *map(int, sys.argv[2:11]))
  call(0)
  call(0)
  import torch
  import transformers
  serve(call, f"{params} mode={mode} torch={torch.__version__} transformers={transformers.__version__}")


if __name__ == "__main__":
  main()
