"""Train-step throughput per residual scheme, side by side with the machine's own matmul rate and with PyTorch/HF
and tunix train steps timed in alternation.

    python -m benchmarks.train_step [--schemes pre,siamese_post_pre] [--dtype float32|bfloat16]
                                    [--hf-python /tmp/hfref/bin/python] [--tunix-python /tmp/tunix/bin/python]
    python -m benchmarks.train_step --schemes pre --lora 8 --repeats 9
    python -m benchmarks.train_step --memory-only --schemes pre,siamese_post_pre
    python -m benchmarks.train_step --schemes pre,hc:4,hc_dynamic:4,mhc:4,mhc_lite:4,pre+moe,mhc_lite:4+moe

A scheme is `norm_scheme[:n][+moe]`: n residual streams for the multi-stream schemes (`hc_streams`), `+moe` the
MLPs as 8 routed experts of half the width, top-2, dropless (`MOE`: the same active MLP FLOPs per token as the
dense model, 4x its MLP parameters).

Configuration (the issue's): d_model 512, 8 layers, 8 heads (4 KV), SwiGLU 2048, vocab 8192 (tied),
batch 8 x 256 tokens, AdamW, layers unrolled (`--scan` stacks them with nn.scan: on CPU the scan copies each
layer's saved activations into and out of stacked buffers, ~5% of the step here; on TPU it keeps compile times
flat in depth). `--dtype` is the model's compute dtype (default float32); parameters and AdamW state stay float32
(`param_dtype`), so bfloat16 is mixed precision, and the matmul rates are measured in it. Achieved FLOP/s count
6 * N * tokens per step (N = the active parameters: a token's k experts, not all of them).

What is timed: one train step (jitted, state donated and carried from call to call, compile and a warm-up step
excluded) per call, the median over `--repeats` rounds. Every round runs each scheme's step once and then each
reference's step once, so a machine-load swing reaches all of them alike; `ratios_vs_pre` gives each scheme's step
time and compiled peak memory over Pre-Norm's.

References (`--hf-python` / `--tunix-python`: the python of a venv holding torch + transformers, or
google-tunix 0.1.7): each runs in a persistent process (`benchmarks/train_peers.py`), started before jaxpt's
schemes compile (it builds and warms up meanwhile) and fed one step per round: `hf`, the train step of
../shared/bench/hf_reference.py (Qwen2, eager PyTorch, AdamW; with `--dtype bfloat16` under torch's CPU bf16
autocast, fp32 weights and AdamW state); `tunix`, tunix's Llama3 with an optax AdamW step (fp32 whatever
`--dtype` says). `{name}_reference` holds its median tokens/s and its setting (its dtype, versions, torch threads);
`pre_tokens_per_sec_vs_{name}` is the median over rounds of that round's reference seconds / Pre-Norm seconds.
With `--hf-python` and a `pre` scheme, `hf_dot_pass` times torch's GEMMs at Pre-Norm's own dot shapes in the
same rounds (`hf_dot_pass_report`): how much of the gap to HF the GEMM library explains. `round_seconds`: every
timed round's seconds of each scheme, dot pass and reference. Prints one JSON object; ratios are what to compare
across machines.

`--lora R` adds, per scheme, the same step with LoRA rank R on every projection (`scheme+loraR`: only the
adapters get gradients and AdamW state, the base frozen in float32), in the same rounds; `lora_vs_full` gives the
median over rounds of its seconds over the full fine-tune's in that round, and its compiled peak memory over the
full one's. `loadavg_1_5_15min`: the machine's load averages before and after the timed rounds.

`pre_dot_pass` (with a `pre` scheme): Pre-Norm's step's matmuls alone, timed in the same rounds. Every dot_general
of its forward and backward (the attention's included, read from the step's jaxpr: `common.traced_dots`), run at
their shapes on random operands as one jitted program with nothing else (`common.dot_pass`): `gflop` (the step's
true matmul FLOPs, against 6 N tokens), its rate, `fraction_of_matmul_rate` (what the step could reach were it
nothing but its matmuls), and `share_of_step`, the median over rounds of its seconds over the step's: the rest of
the step is what jaxpt (norms, attention's softmax, RoPE, the loss, AdamW) and XLA's layout copies add.
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import references
from benchmarks.common import (Peer, alternating_seconds, compiled_step, dot_pass, dots_json, machine_info,
                               matmul_gflops, median_ratio, ratios_vs_pre, ready_peers, traced_dots)
from jaxpt.models.config import ModelConfig
from jaxpt.nn.lora import LoRAConfig
from jaxpt.models.transformer import TransformerLM, init_params, param_count
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.engine.builder import lora_trainable
from jaxpt.engine.optim import OptimConfig, decay_mask, make_optimizer
from jaxpt.engine.state import TrainState, trainable_part
from jaxpt.engine.step import make_train_step

BATCH, SEQ = 8, 256
MODEL = dict(vocab_size=8192, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, mlp_dim=2048,
             max_seq_len=2048, tie_embeddings=True)
MOE = dict(num_experts=8, experts_per_token=2)  # the `+moe` suffix (expert width: mlp_dim / 2)
OPTIM = OptimConfig(learning_rate=1e-3, warmup_steps=10, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
                    weight_decay=0.1, grad_clip=1.0)
PEER_SCRIPT = pathlib.Path(__file__).resolve().parent / "train_peers.py"
HF_DOT_PASS = "hf_dot_pass"  # the peer that runs Pre-Norm's dots with torch (train_peers.py)


def random_batch(vocab_size: int) -> dict:
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab_size, (BATCH, SEQ + 1), dtype=np.int32)
  return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
          "weights": jnp.ones((BATCH, SEQ), jnp.float32)}


def scheme_fields(scheme: str) -> dict:
  """ModelConfig fields of a scheme spec `norm_scheme[:n][+moe]` (see the module docstring)."""
  name, _, extra = scheme.partition("+")
  norm_scheme, _, streams = name.partition(":")
  if extra not in ("", "moe"):
    raise ValueError(f"{scheme}: the only suffix is +moe")
  fields = dict(norm_scheme=norm_scheme)
  if streams:
    fields["hc_streams"] = int(streams)
  return dict(fields, **MOE) if extra else fields


def active_params(params, cfg: ModelConfig) -> int:
  """Parameters a token uses: all, less the (E - k) / E of the experts' weights it is not routed to."""
  unused = 0
  if cfg.num_experts:
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      if path[-1].key in ("wi_gate", "wi_up", "wi", "wo"):
        unused += leaf.size * (cfg.num_experts - cfg.experts_per_token) // cfg.num_experts
  return param_count(params) - unused


def build_scheme(scheme: str, lora_rank: int = 0, **overrides) -> tuple[dict, Callable, TrainState, dict]:
  """(facts, step, state, batch) of `scheme`'s train step, not compiled: `step` jitted (state donated), `state`
  its initial TrainState, `batch` a fixed random batch. `lora_rank` > 0: LoRA of that rank on every projection
  (`jaxpt.nn.lora`, float32 base): only the adapters get gradients and AdamW state, as
  `jaxpt.engine.builder.build_training` sets it up."""
  fields = {**MODEL, **overrides, **scheme_fields(scheme)}
  if fields.get("num_experts"):  # experts of 1/k the dense width: the dense model's active MLP FLOPs per token
    fields["mlp_dim"] //= fields["experts_per_token"]
  cfg = ModelConfig(**fields)
  model = TransformerLM(cfg, lora=LoRAConfig(rank=lora_rank).spec())
  params = init_params(cfg, jax.random.PRNGKey(0), model=model)
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  trainable = lora_trainable(boxed) if lora_rank else None
  optimizer, schedule = make_optimizer(OPTIM, total_steps=1000,
                                       mask=None if trainable is None else trainable_part(decay_mask(boxed), trainable))
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(1), trainable=trainable)
  step = jax.jit(make_train_step(make_lm_loss_fn(model), optimizer, schedule, trainable=trainable), donate_argnums=0)
  facts = {"params": param_count(params), "active_params": active_params(params, cfg)}
  if trainable is not None:
    facts["trainable_params"] = param_count(trainable_part(params, trainable))
  return facts, step, state, random_batch(cfg.vocab_size)


def compile_scheme(scheme: str, lora_rank: int = 0, compiler_options: dict | None = None,
                   **overrides) -> tuple[dict, Callable[[], jax.Array]]:
  """(facts, run): `run()` does one train step of `scheme` (`build_scheme`) on a fixed batch (the state carried
  between calls). `compiler_options`: XLA's, for this step's compile alone."""
  facts, step, state, batch = build_scheme(scheme, lora_rank, **overrides)
  facts["memory"], run = compiled_step(step, state, batch, compiler_options)
  return facts, run


def scheme_dots(scheme: str, **overrides) -> list:
  """Every dot_general of `scheme`'s train step, forward and backward (`common.traced_dots`; traced, not
  compiled)."""
  _, step, state, batch = build_scheme(scheme, **overrides)
  return traced_dots(step, state, batch)


def page_faults(run: Callable[[], jax.Array]) -> int:
  """Minor page faults of one `run()`."""
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  jax.block_until_ready(run())
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def peer_dtype(name: str, dtype: str) -> str:
  """The dtype reference `name` runs in for jaxpt's --dtype: hf follows it (bfloat16: torch's CPU autocast, fp32
  weights and AdamW state); tunix runs float32 only."""
  return dtype if name == "hf" else "float32"


def start_peers(args: argparse.Namespace, dots_file: str | None = None) -> list[Peer]:
  """The reference train steps given a python (`references.add_arguments`), each a persistent `train_peers.py`
  process, ready one after the other before jaxpt compiles (`ready_peers`: each warms up, and HF picks its torch
  threads, on a machine this benchmark leaves otherwise idle); with `dots_file` (`common.dots_json` of Pre-Norm's
  step) and an HF python, also `hf_dot_pass`, torch's GEMMs at those shapes."""
  argvs = {name: [getattr(args, f"{name}_python"), str(PEER_SCRIPT), name, str(MODEL["d_model"]),
                  str(MODEL["num_layers"]), peer_dtype(name, args.dtype)]
           for name in references.VENVS if getattr(args, f"{name}_python")}
  if dots_file and "hf" in argvs:
    argvs[HF_DOT_PASS] = [*argvs["hf"][:2], HF_DOT_PASS, *argvs["hf"][3:5], args.dtype, dots_file]
  return ready_peers(argvs, stderr=None)


def hf_dot_pass_report(times: dict[str, list[float]], gflop: float, setting: str) -> dict:
  """torch's einsums at Pre-Norm's dot shapes (`hf_dot_pass`) beside jaxpt's `pre_dot_pass`, from the same rounds:
  its time and rate; `speed_vs_pre_dot_pass`, the median over rounds of XLA's dot-pass seconds over torch's (> 1:
  torch's GEMMs are faster at these shapes); `pre_vs_hf_with_hf_dots`, the median over rounds of HF's step seconds
  over (Pre-Norm's step - its dot pass + torch's dot pass): what `pre_tokens_per_sec_vs_hf` would be were jaxpt's
  matmuls as fast as torch's, all else equal, i.e. how much of the gap to HF the GEMM library explains."""
  seconds = statistics.median(times[HF_DOT_PASS])
  with_hf_dots = [pre - xla + hf for pre, xla, hf in zip(times["pre"], times["pre_dot_pass"], times[HF_DOT_PASS])]
  report = {"ms": round(seconds * 1e3, 1), "gflops_per_sec": round(gflop / seconds, 1), "setting": setting,
            "speed_vs_pre_dot_pass": round(median_ratio(times["pre_dot_pass"], times[HF_DOT_PASS]), 3)}
  if "hf" in times:
    report["pre_vs_hf_with_hf_dots"] = round(median_ratio(times["hf"], with_hf_dots), 3)
  return report


def bench_schemes(compiled: dict[str, tuple[dict, Callable[[], jax.Array]]], repeats: int, peers: Sequence[Peer] = (),
                  others: dict[str, Callable[[], object]] | None = None) -> tuple[dict, dict[str, list[float]]]:
  """(results, times): every compiled scheme's step (`compile_scheme`), every run of `others` (e.g. a dot pass)
  and every (ready) peer's step, timed round-robin (`alternating_seconds`) so all see the same machine load;
  times[name][r]: round r's seconds of scheme, other or peer `name`."""
  times = alternating_seconds({**{scheme: run for scheme, (_, run) in compiled.items()}, **(others or {})}, repeats,
                              peers={peer.name: peer.seconds for peer in peers})
  results = {}
  for scheme, (facts, run) in compiled.items():
    seconds = statistics.median(times[scheme])
    flops = 6.0 * facts["active_params"] * BATCH * SEQ
    results[scheme] = dict(facts, step_ms=round(seconds * 1e3, 1), tokens_per_sec=round(BATCH * SEQ / seconds, 1),
                           gflops_per_sec=round(flops / seconds / 1e9, 1),
                           minor_page_faults_per_step=page_faults(run))
  return results, times


def reference_report(peer: Peer, times: dict[str, list[float]], dtype: str) -> tuple[dict, float | None]:
  """(`{name}_reference`, `pre_tokens_per_sec_vs_{name}` or None without a `pre` scheme) of one peer run for
  jaxpt's `dtype`: its median step and tokens/s, and the median over rounds of its seconds / Pre-Norm's seconds
  in the same round."""
  seconds = statistics.median(times[peer.name])
  reference = {"train_tokens_per_sec": round(BATCH * SEQ / seconds, 1), "step_ms": round(seconds * 1e3, 1),
               "dtype": peer_dtype(peer.name, dtype), "params": peer.params, "setting": peer.setting}
  vs_pre = round(median_ratio(times[peer.name], times["pre"]), 3) if "pre" in times else None
  return reference, vs_pre


def print_memory(args: argparse.Namespace) -> None:
  """`--memory-only`: each scheme's compiled memory (`jaxpt.parallel.compiled_memory`) and peak over Pre-Norm's."""
  memory = {scheme: compile_scheme(scheme, remat=args.remat, scan_layers=args.scan, dtype=args.dtype,
                                   param_dtype="float32")[0]["memory"] for scheme in args.schemes.split(",")}
  report = {"benchmark": "train_step --memory-only",
            "config": dict(MODEL, batch=BATCH, seq=SEQ, dtype=args.dtype, param_dtype="float32", remat=args.remat,
                           scan_layers=args.scan),
            **machine_info(), "memory_mib": memory}
  if "pre" in memory:
    report["peak_memory_vs_pre"] = {s: round(m["peak_mib"] / memory["pre"]["peak_mib"], 3) for s, m in memory.items()}
  json.dump(report, sys.stdout, indent=2)
  print()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--schemes", default="pre,post,hybrid,siamese_post_pre,siamese_hybrid_pre")
  parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
  parser.add_argument("--remat", default="none")
  parser.add_argument("--scan", action="store_true", help="stack the layers with nn.scan instead of unrolling")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="compute dtype (params and AdamW state stay float32); hf runs under bf16 autocast")
  parser.add_argument("--lora", type=int, default=0, help="also each scheme with LoRA of this rank on every "
                      "projection, timed in alternation with its full fine-tune (`lora_vs_full`)")
  parser.add_argument("--memory-only", action="store_true", help="compile each scheme and print its compiled "
                      "memory and peak over Pre-Norm's; nothing timed, no references (deterministic: any load)")
  references.add_arguments(parser)
  args = parser.parse_args(argv)
  if args.memory_only:
    return print_memory(args)

  overrides = dict(remat=args.remat, scan_layers=args.scan, dtype=args.dtype, param_dtype="float32")
  dots = scheme_dots("pre", **overrides) if "pre" in args.schemes.split(",") else None
  scratch, dots_file, peers = tempfile.TemporaryDirectory(), None, []  # the hf_dot_pass peer's DOTS_JSON
  try:
    if dots and args.hf_python:
      dots_file = os.path.join(scratch.name, "dots.json")
      with open(dots_file, "w") as f:
        json.dump(dots_json(dots), f)
    peers = start_peers(args, dots_file)
    compiled = {}
    for scheme in args.schemes.split(","):
      for rank in (0, args.lora) if args.lora else (0,):
        compiled[scheme + (f"+lora{rank}" if rank else "")] = compile_scheme(scheme, lora_rank=rank, **overrides)
    others = {}
    if dots:
      dot_gflop, others["pre_dot_pass"] = dot_pass(dots)
    matmul = {f"{m}x{k}x{n}": round(matmul_gflops(m, k, n, dtype=jnp.dtype(args.dtype)), 1)  # peers idle now
              for m, k, n in [(2048, 2048, 2048), (BATCH * SEQ, 512, 2048), (BATCH * SEQ, 512, 8192)]}
    load_before = os.getloadavg()
    schemes, times = bench_schemes(compiled, args.repeats, peers, others)
    load_after = os.getloadavg()
  finally:
    for peer in peers:
      peer.close()
    scratch.cleanup()
  peak_matmul = max(matmul.values())
  for result in schemes.values():
    result["fraction_of_matmul_rate"] = round(result["gflops_per_sec"] / peak_matmul, 3)
  report = {"benchmark": "train_step", "config": dict(MODEL, batch=BATCH, seq=SEQ, dtype=args.dtype,
                                                      param_dtype="float32", remat=args.remat, scan_layers=args.scan,
                                                      rounds=args.repeats, host_allocator_reuse=allocator_reuse),
            **machine_info(), "matmul_gflops_per_sec": matmul, "schemes": schemes}
  report["loadavg_1_5_15min"] = {"before_timing": load_before, "after_timing": load_after}
  report["round_seconds"] = {name: [round(t, 4) for t in ts] for name, ts in times.items()}
  if others:
    seconds = statistics.median(times["pre_dot_pass"])
    report["pre_dot_pass"] = {"gflop": round(dot_gflop, 1), "ms": round(seconds * 1e3, 1),
                              "gflops_per_sec": round(dot_gflop / seconds, 1),
                              "fraction_of_matmul_rate": round(dot_gflop / seconds / peak_matmul, 3),
                              "share_of_step": round(median_ratio(times["pre_dot_pass"], times["pre"]), 3)}
  if "pre" in schemes:
    report["ratios_vs_pre"] = ratios_vs_pre({s: r for s, r in schemes.items() if "+lora" not in s})
  if args.lora:
    report["lora_vs_full"] = {
        scheme: {"step_time": round(median_ratio(times[f"{scheme}+lora{args.lora}"], times[scheme]), 3),
                 "peak_memory": round(schemes[f"{scheme}+lora{args.lora}"]["memory"]["peak_mib"]
                                      / schemes[scheme]["memory"]["peak_mib"], 3)}
        for scheme in args.schemes.split(",")}
  for peer in peers:
    if peer.name == HF_DOT_PASS:
      report[HF_DOT_PASS] = hf_dot_pass_report(times, dot_gflop, peer.setting)
      continue
    report[f"{peer.name}_reference"], vs_pre = reference_report(peer, times, args.dtype)
    if vs_pre is not None:
      report[f"pre_tokens_per_sec_vs_{peer.name}"] = vs_pre
  json.dump(report, sys.stdout, indent=2)
  print()


if __name__ == "__main__":
  main()
