"""`tools/device_check`'s model sections: the train step at ~350M and ~1B parameters (tokens/s, MFU), the sampler
and one GRPO step, each beside its peer (HF `generate` on torch CUDA, persistent processes timed in alternation)."""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Peer, alternating_seconds, compiled_step, matmul_gflops, median_ratio
from benchmarks.sampler import sampler_run, timed
from benchmarks.train_step import OPTIM
import jaxpt
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params, param_count
from jaxpt.nn.attention import cudnn_attention_applies
from jaxpt.trainers.lm import make_lm_loss_fn
from jaxpt.engine.optim import make_optimizer
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import make_train_step
from tools.device_traces import perfetto_trace, trace_kernel_times

if TYPE_CHECKING:
  from tools.device_check import Budget, Sizes

TORCH_PEER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "torch_cuda_peer.py")
PEAK_BF16_TFLOPS = {  # device_kind substring -> dense bf16 peak, TFLOP/s (vendor figures)
    "H200": 989.4, "H100": 989.4, "A100": 312.0, "L4": 121.0, "TPU v6": 918.0, "TPU v5p": 459.0,
    "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v4": 275.0,
}
LM = dict(num_kv_heads=None, tie_embeddings=True, dtype="bfloat16", param_dtype="float32", max_seq_len=2048)


def device_peak(table: dict) -> float | None:
  kind = jax.devices()[0].device_kind
  return next((v for name, v in table.items() if name in kind), None)

# --- train step ------------------------------------------------------------------------------------------------

TRAIN_VARIANTS = {"pre": dict(norm_scheme="pre"),  # attention_impl="auto": cuDNN's fused attention on a GPU
                  "pre_jaxpt_attention": dict(norm_scheme="pre", attention_impl="jaxpt"),
                  "siamese_post_pre": dict(norm_scheme="siamese_post_pre", kernel="reference"),
                  "siamese_post_pre_pallas": dict(norm_scheme="siamese_post_pre", kernel="pallas")}
TRACED_VARIANTS = ("pre", "siamese_post_pre")  # traced at the first size: SiameseNorm's extra time, op by op


def lm_config(fields: dict, **extra) -> ModelConfig:
  fields = {**LM, **fields, **extra}
  fields["num_kv_heads"] = fields["num_kv_heads"] or fields["num_heads"]
  return ModelConfig(**fields)


def build_train_step(cfg: ModelConfig, batch: int, seq: int) -> tuple[dict, Callable[[], jax.Array]]:
  """(facts, run) of a jitted, donated AdamW train step on a fixed random batch."""
  model = TransformerLM(cfg)
  params = init_params(cfg, jax.random.PRNGKey(0))
  optimizer, schedule = make_optimizer(OPTIM, total_steps=1000)
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(1))
  step = jax.jit(make_train_step(make_lm_loss_fn(model), optimizer, schedule), donate_argnums=0)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1), dtype=np.int32)
  data = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
          "weights": jnp.ones((batch, seq), jnp.float32)}
  start = time.perf_counter()
  memory, run = compiled_step(step, state, data)
  return {"params": param_count(params), "compile_s": round(time.perf_counter() - start, 1), "memory": memory}, run


def train_step(sizes: Sizes, budget: Budget) -> dict:
  batch, seq = sizes.train_batch
  peak = device_peak(PEAK_BF16_TFLOPS)
  report = {"batch": batch, "seq": seq, "compute": "bfloat16 compute, float32 params and AdamW state",
            "peak_bf16_tflops": peak, "models": {}, "skipped": []}
  if not budget.spent():
    n = 8192 if sizes.peers else 256
    report["matmul_bf16_tflops_measured"] = round(matmul_gflops(n, n, n, dtype=jnp.bfloat16) / 1e3, 1)
  for name, fields in sizes.train_models.items():
    try:
      report["models"][name] = train_model(fields, sizes, budget, peak, report["skipped"], name)
    except Exception:  # noqa: BLE001 -- e.g. out of memory: recorded, and the next size runs
      gc.collect()
      report["models"][name] = {"error": traceback.format_exc().strip().splitlines()[-1][:2000]}
  return report


def resolved(cfg: ModelConfig) -> ModelConfig:
  """`cfg` with `attention_impl="auto"` replaced by what it resolves to on this device for the train step's
  unpacked rows (`jaxpt` where cuDNN's fused attention does not apply: the same program)."""
  if cfg.attention_impl == "auto" and not cudnn_attention_applies(cfg.dtype, packed=False):
    return dataclasses.replace(cfg, attention_impl="jaxpt")
  return cfg


def train_model(fields: dict, sizes: Sizes, budget: Budget, peak: float | None, skipped: list, name: str) -> dict:
  """One model size's variants, compiled, then timed in alternation; a variant whose program is an earlier one's on
  this device (`pre` and `pre_jaxpt_attention` off cuDNN: `resolved`) reuses its step (`same_program_as`)."""
  batch, seq = sizes.train_batch
  runs, facts, built = {}, {}, {}
  for variant, extra in TRAIN_VARIANTS.items():
    if budget.spent():
      skipped.append(f"{name} {variant}")
      continue
    cfg = lm_config(fields, **extra)
    same = built.setdefault(resolved(cfg), variant)
    if same != variant:
      facts[variant], runs[variant] = dict(facts[same], same_program_as=same), runs[same]
      continue
    facts[variant], runs[variant] = build_train_step(cfg, batch, seq)
    facts[variant]["flops_per_token"] = 6 * facts[variant]["params"] + 6 * cfg.num_layers * cfg.d_model * seq
  model = {"config": {**fields, "num_kv_heads": fields["num_heads"]}, "variants": {}}
  if not runs:
    return model
  times = alternating_seconds(runs, sizes.train_repeats)
  for variant in TRACED_VARIANTS:  # one step of each, first size only: where the time goes, and SiameseNorm's extra
    if sizes.trace_dir and name == next(iter(sizes.train_models)) and variant in runs and not budget.spent():
      trace = os.path.join(sizes.trace_dir, f"train_{variant}_trace.json.gz")
      model.setdefault("traces", {})[variant] = {"file": perfetto_trace(runs[variant], trace),
                                                 "device_ops_top30": trace_kernel_times(trace, top=30)}
  del runs
  gc.collect()
  for variant, f in facts.items():
    seconds = statistics.median(times[variant])
    entry = dict(f, step_ms=round(seconds * 1e3, 1), tokens_per_sec=round(batch * seq / seconds))
    tflops = f["flops_per_token"] * batch * seq / seconds / 1e12
    entry["model_tflops"] = round(tflops, 1)
    if peak:
      entry["mfu"] = round(tflops / peak, 3)
    model["variants"][variant] = entry
  if "pre" in facts:
    model["step_time_vs_pre"] = {v: round(e["step_ms"] / model["variants"]["pre"]["step_ms"], 3)
                                 for v, e in model["variants"].items() if v != "pre"}
  return model


# --- sampler and GRPO step beside HF generate ------------------------------------------------------------------------

def start_peers(sizes: Sizes, cfg_fields: dict, batch: int, prompt: int, new: int, log_dir: str) -> list[Peer]:
  """The torch CUDA `generate` peers (eager, static cache) as persistent processes, building while jaxpt compiles."""
  if not sizes.peers:
    return []
  dims = [cfg_fields["d_model"], cfg_fields["num_layers"], cfg_fields["num_heads"],
          cfg_fields.get("num_kv_heads") or cfg_fields["num_heads"], cfg_fields["mlp_dim"], cfg_fields["vocab_size"]]
  peers = []
  for mode in ("eager", "static"):
    name = f"hf_{mode}"
    stderr = open(os.path.join(log_dir, f"{name}.log"), "w")  # noqa: SIM115 -- kept open for the process
    peers.append(Peer(name, [sys.executable, TORCH_PEER, mode, *map(str, [batch, prompt, new, *dims])],
                      stderr=stderr))
  return peers


def peers_ready_within(peers: list[Peer], timeout: float, errors: dict, log_dir: str) -> list[Peer]:
  """The peers that printed `ready` within `timeout` seconds; the rest are killed, their reason and the tail of
  their stderr (`log_dir/<name>.log`) in `errors`."""
  ready = []
  for peer in peers:
    outcome = {}
    waiter = threading.Thread(target=lambda p=peer: outcome.setdefault("error", _ready_error(p)))
    waiter.start()
    waiter.join(max(1.0, timeout))
    if waiter.is_alive():
      peer.proc.kill()
      waiter.join()
      outcome["error"] = f"not ready within {timeout:.0f} s"
    if not outcome["error"]:
      ready.append(peer)
      continue
    with open(os.path.join(log_dir, f"{peer.name}.log")) as f:
      errors[peer.name] = outcome["error"] + " | " + f.read()[-1500:]
  return ready


def _ready_error(peer: Peer) -> str:
  try:
    peer.wait_ready()
    return ""
  except RuntimeError as e:
    return str(e)


def sampler(sizes: Sizes, budget: Budget) -> dict:
  batch, prompt, new = sizes.sampler
  fields = next(iter(sizes.train_models.values()))
  report = {"batch": batch, "prompt": prompt, "new_tokens": new, "model": fields,
            "rollout_dtype": "bfloat16", "sampling": "temperature 1, no top-k/top-p, no EOS", "peer_errors": {}}
  if budget.spent():
    return dict(report, skipped=["the fixed-length sampler vs HF generate"])
  with tempfile.TemporaryDirectory() as logs:
    peers = start_peers(sizes, fields, batch, prompt, new, logs)
    cfg = lm_config(fields, norm_scheme="pre")
    params = init_params(cfg, jax.random.PRNGKey(0))
    runs = {"call": sampler_run(cfg, params, batch, prompt, new, "bfloat16"),
            "prefill": sampler_run(cfg, params, batch, prompt, 1, "bfloat16")}
    for fn in runs.values():
      jax.block_until_ready(fn())
    peers = peers_ready_within(peers, min(240.0, budget.left()), report["peer_errors"], logs)
    times = collections.defaultdict(list)
    for r in range(sizes.rounds):
      for key, fn in runs.items():
        times[key].append(timed(fn))
      for peer in peers:
        times[peer.name].append(peer.seconds(r + 1))
    for peer in peers:
      report.setdefault("peer_settings", {})[peer.name] = peer.setting
      peer.close()
  med = {k: statistics.median(v) for k, v in times.items()}
  step = (med["call"] - med["prefill"]) / max(new - 1, 1)
  report["jaxpt"] = {"params": param_count(params), "call_ms": round(med["call"] * 1e3, 1),
                     "prefill_ms": round(med["prefill"] * 1e3, 1), "decode_step_ms": round(step * 1e3, 3),
                     "new_tokens_per_sec": round(batch * new / med["call"])}
  report["peers"] = {p: {"call_ms": round(med[p] * 1e3, 1), "new_tokens_per_sec": round(batch * new / med[p]),
                         "speedup_jaxpt_over_peer": round(median_ratio(times[p], times["call"]), 2)}
                     for p in med if p.startswith("hf_")}
  return report


def grpo_step(sizes: Sizes, budget: Budget) -> dict:
  """`benchmarks/grpo_step.py`'s measurement (bf16 and fp32 rollouts) with HF generate of the same rollouts."""
  from benchmarks import grpo_step as grpo_bench  # the GRPO trainer imports tensorflow_datasets (carried wheels)
  if budget.spent():
    return {"skipped": ["all"]}
  config = grpo_bench.grpo_config("pre")
  config.update_from_flattened_dict(sizes.grpo_overrides)
  report = {"config": config.to_dict(), "peer_errors": {}}
  rows = config.data.prompts_per_step * config.grpo.group_size
  with tempfile.TemporaryDirectory() as workdir:
    peers = start_peers(sizes, config.model.to_dict(), rows, config.data.max_prompt_len, config.sampling.max_new_tokens,
                        workdir)
    base = jaxpt.build("grpo", config, os.path.join(workdir, "run"))
    state, batch = base.init_state(), base.hooks.collector.prompts.batch(0)
    clock = collections.Counter()
    trainers = {dtype: grpo_bench.timed_trainer(base, clock, dtype) for dtype in ("bfloat16", "float32")}
    for trainer in trainers.values():  # compiles
      trainer.train_step(grpo_bench.fresh(state), batch)
    peers = peers_ready_within(peers, min(240.0, budget.left()), report["peer_errors"], workdir)
    results = collections.defaultdict(list)
    for r in range(sizes.rounds):
      for dtype, trainer in trainers.items():
        results[dtype].append(grpo_bench.timed_step(trainer, clock, state, batch))
      for peer in peers:
        results[peer.name].append({"rollout": peer.seconds(r + 1)})
    for peer in peers:
      peer.close()
  for key, rs in results.items():  # jaxpt's trainers: the step split; the peers: their rollout seconds
    report[key] = grpo_bench.step_summary(rs) if "step" in rs[0] else {
        "rollout_s": round(statistics.median(r["rollout"] for r in rs), 3)}
  for peer in (k for k in results if k.startswith("hf_")):
    report[f"rollout_bfloat16_vs_{peer}"] = round(report[peer]["rollout_s"] / report["bfloat16"]["rollout_s"], 2)
  return report
