"""Persistent peer train steps for `benchmarks/train_step.py`: one process per peer, fed one command a line on stdin.

    PEER_PYTHON benchmarks/train_peers.py {hf,tunix} D_MODEL LAYERS [float32|bfloat16]
    PEER_PYTHON benchmarks/train_peers.py hf_dot_pass D_MODEL LAYERS {float32|bfloat16} DOTS_JSON

Run with the python of a venv holding the peer (it imports no jaxpt): `torch` + `transformers` for `hf`,
`google-tunix==0.1.7` for `tunix`. The model is train_step's at D_MODEL and LAYERS: 8 heads with 4 KV heads,
SwiGLU 4 * D_MODEL, vocab 8192, tied embeddings, random init. One call = one train step on a fixed random batch
of 8 x 256 tokens (next-token cross-entropy, then an AdamW update), the weights and optimizer state carried from
call to call; its time is the step's wall time.

- `hf`: ../shared/bench/hf_reference.py's step: transformers' Qwen2ForCausalLM (eager PyTorch, its default
  attention), `torch.optim.AdamW(lr=1e-3)`, `m(input_ids=x, labels=x)`, `loss.backward()`, `step()`,
  `zero_grad()`. `bfloat16`: the forward (and loss) under `torch.autocast(device_type="cpu",
  dtype=torch.bfloat16)`, torch's CPU mixed precision (fp32 weights, gradients and AdamW state, bf16 matmuls),
  the backward outside it as torch documents. torch runs with 1 or 2 intra-op threads, whichever was faster in a
  warm-up step each (`sampler_peers.fastest_torch_threads`; the ready line says which, with both times).
- `tunix`: tunix's Llama3 (`tunix_model.llama3`, tied) and the train step of `tunix_reference.py`
  (`tunix_model.train_step`: one jitted optax AdamW step with global-norm clipping). fp32 only.
- `hf_dot_pass`: torch's GEMMs at jaxpt's own matmul shapes, the peer of train_step.py's `pre_dot_pass`. DOTS_JSON
  (written by train_step.py, `common.dots_json`) lists every dot_general of jaxpt's step as [lhs shape, rhs shape,
  [[lhs contracting, rhs contracting], [lhs batch, rhs batch]], [lhs dtype, rhs dtype]]; one call computes each
  once with `torch.einsum` (`einsum_spec`) on random operands of those dtypes (a float32 x bfloat16 dot, which XLA
  computes in float32, in float32; bf16 x bf16: torch's bf16 GEMM, AMX where the CPU has it), under
  `torch.inference_mode()`, threads chosen as for `hf`. So how much faster torch's GEMM library is at the step's
  shapes is measured in the same rounds, not assumed. The dtype argument only names the run.

Protocol (`sampler_peers.serve`): after building and untimed warm-up steps (tunix: one, which compiles; hf: one,
then the thread choice's two), prints `ready <params> <setting>`; each input line `run <seed>` makes one step
(the seed is unused: the batch is fixed) and prints `seconds <wall time>`; `quit` or EOF ends it.
"""

from __future__ import annotations

import json
import string
import sys

from sampler_peers import fastest_torch_threads, qwen2, serve  # beside this script
from tunix_model import VOCAB, llama3, train_step

BATCH, SEQ = 8, 256
PEERS = {"hf": ("float32", "bfloat16"), "tunix": ("float32",), "hf_dot_pass": ("float32", "bfloat16")}  # dtypes


def hf_peer(d_model: int, layers: int, dtype: str):
  """-> (params, call(seed), setting) for one transformers train step."""
  import contextlib

  import torch
  import transformers

  model = qwen2(d_model, layers)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
  x = torch.randint(0, VOCAB, (BATCH, SEQ))
  autocast = dtype == "bfloat16"

  def call(seed: int) -> None:
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
      loss = model(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

  compute = "bf16 autocast (fp32 weights and AdamW state)" if autocast else "fp32"
  return (sum(p.numel() for p in model.parameters()), call,
          f"torch={torch.__version__} transformers={transformers.__version__} {compute}")


def tunix_peer(d_model: int, layers: int):
  """-> (params, call(seed), setting) for one tunix (optax) train step."""
  from importlib.metadata import version

  model, params = llama3(tied=True, d_model=d_model, layers=layers)
  step = train_step(model, BATCH, SEQ)
  return params, lambda seed: step(), f"tunix={version('google-tunix')} jax={version('jax')} fp32"


def einsum_spec(lhs_ndim: int, rhs_ndim: int, dimension_numbers) -> str:
  """The einsum equation of `jax.lax.dot_general(lhs, rhs, dimension_numbers)`: contracted and batch axes share a
  letter; the output is batch axes (in lhs order), then lhs's free axes, then rhs's, as dot_general orders it."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  letters = iter(string.ascii_letters)
  lhs = [next(letters) for _ in range(lhs_ndim)]
  rhs = [None] * rhs_ndim
  for l, r in [*zip(lhs_contract, rhs_contract), *zip(lhs_batch, rhs_batch)]:
    rhs[r] = lhs[l]
  rhs = [axis or next(letters) for axis in rhs]
  out = [lhs[d] for d in lhs_batch]
  out += [a for d, a in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch)]
  out += [a for d, a in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch)]
  return f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}"


def hf_dot_pass_peer(path: str, dtype: str):
  """-> (number of dots, call(seed), setting): every dot of DOTS_JSON at `path` as `torch.einsum`, once a call."""
  import torch

  with open(path) as f:
    dots = json.load(f)
  generator = torch.Generator().manual_seed(0)
  pool = {}

  def operand(shape, dtype_name):
    key = (tuple(shape), dtype_name)
    if key not in pool:
      pool[key] = torch.randn(*shape, generator=generator).to(getattr(torch, dtype_name))
    return pool[key]

  work = []
  for lhs, rhs, dims, (lhs_dtype, rhs_dtype) in dots:
    common = lhs_dtype if lhs_dtype == rhs_dtype else "float32"  # XLA computes a mixed dot in float32
    work.append((einsum_spec(len(lhs), len(rhs), dims), operand(lhs, common), operand(rhs, common)))

  def call(seed: int) -> None:
    with torch.inference_mode():
      for spec, a, b in work:
        torch.einsum(spec, a, b)

  mixed = sum(a != b for *_, (a, b) in dots)
  return len(dots), call, f"torch={torch.__version__} einsum {dtype}, {mixed} mixed dots in float32"


def main(argv: list[str]) -> None:
  peer, dtype = argv[0], argv[3] if len(argv) > 3 else "float32"
  if peer not in PEERS:
    raise SystemExit(f"unknown peer {peer!r}: {' | '.join(PEERS)}")
  if dtype not in PEERS[peer]:
    raise SystemExit(f"peer {peer!r} runs {' | '.join(PEERS[peer])}, not {dtype!r}")
  d_model, layers = int(argv[1]), int(argv[2])
  if peer == "hf":
    params, call, setting = hf_peer(d_model, layers, dtype)
  elif peer == "hf_dot_pass":
    if len(argv) < 5:
      raise SystemExit("hf_dot_pass needs DOTS_JSON after the dtype")
    params, call, setting = hf_dot_pass_peer(argv[4], dtype)
  else:
    params, call, setting = tunix_peer(d_model, layers)
  call(0)
  if peer.startswith("hf"):
    setting += " " + fastest_torch_threads(call)
  serve(call, f"{params} {setting}")


if __name__ == "__main__":
  main(sys.argv[1:])
