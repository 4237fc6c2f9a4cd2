"""`jaxpt plan` tables for Qwen2.5 shapes, and the plan against compiled and measured peaks of steps this machine runs.

    python -m benchmarks.plan_tables [--part tables|peaks|all] [--sizes tiny,d256,d512] [--trainers sft,dpo,grpo]
        [--accum 1,4]

`tables`: `jaxpt.trainers.plan.plan_memory` (the analytic account, nothing compiled) for Qwen2.5-0.5B, 1.5B and 7B
(their config.json alone, `tests/assets/qwen2_5_*_shape`; no weights) on 1 x 16 GiB and 8 x 16 GiB (8: the plan's
own fsdp advice, `mesh.fsdp=8`, rules fsdp), for SFT, DPO and GRPO steps at the `experiments/configs/*_hf.py`
recipes' sizes (`WORKLOADS`: bfloat16 compute, float32 params, remat full), each as a full fine-tune, LoRA (rank 8
on every projection, the frozen base in bfloat16) and QLoRA (the same with `lora.base_quant` int8 | nf4). Each cell
gives the plan's per-device GiB by component, `fits` and its `advice`; where a cell does not fit, `advised` is the
plan of the advice's `together:` overrides (its first concrete way to fit, if any).

`peaks`: at small sizes (`SIZES`: sft_tiny's model, a d256 and the d512 train-step benchmark model; float32, remat
full) for SFT, DPO and GRPO (`--trainers`), full and LoRA rank 8, with each of the `--accum` optim.grad_accum_steps
(the same 8 rows per update split into that many micro-batches), in a fresh process each: the analytic account
(`plan.account`), XLA's memory analysis of the same real train step (`plan.step_training`, the state donated as
on an accelerator) and the measured peak of one step on the CPU: the state (and a reference copy where the plan
counts one) allocated, then per step the process's peak RSS over it (VmHWM, reset just before it through
/proc/self/clear_refs) minus its RSS before it (read once the previous step's buffers are freed), the largest of
the `MEASURED` steps after `WARMUP` steps, plus the bytes of the arrays alive (state, reference, batch). The child
runs with glibc's mmap threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_), so freed buffers leave the RSS. The
analytic figure compared is the step phase, `plan.step_total` = params + optimizer + reference + the backward
phase (grads + block_grads + accumulator + activations + logits) (GRPO's sampler phase is not run here). Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN = {name: os.path.join(ROOT, "tests", "assets", f"qwen2_5_{name.lower().replace('.', '_')}_shape")
        for name in ("0.5B", "1.5B", "7B")}
VARIANTS = {"full": {}, "lora": {"lora.rank": 8, "lora.base_dtype": "bfloat16"},
            "qlora_int8": {"lora.rank": 8, "lora.base_dtype": "bfloat16", "lora.base_quant": "int8"},
            "qlora_nf4": {"lora.rank": 8, "lora.base_dtype": "bfloat16", "lora.base_quant": "nf4"}}
MESHES = {1: {}, 8: {"mesh.rules": "fsdp", "mesh.fsdp": 8, "mesh.data": 1}}
SIZES = {  # peaks: small models this CPU runs
    "tiny": dict(vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=512),
    "d256": dict(vocab_size=4096, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=1024),
    "d512": dict(vocab_size=8192, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, mlp_dim=2048,
                 tie_embeddings=True)}
PEAK_WORKLOAD = {  # peaks: 8 rows of 256 tokens per step for each trainer
    "sft": {"data.batch_size": 8, "data.seq_len": 256},
    "dpo": {"data.batch_size": 4, "data.seq_len": 256},
    "grpo": {"data.prompts_per_step": 2, "grpo.group_size": 4, "grpo.minibatches": 1, "data.max_prompt_len": 128,
             "sampling.max_new_tokens": 128}}


def _set(config, changes: dict) -> None:
  for dotted, value in changes.items():
    section, _, field = dotted.rpartition(".")
    target = config
    for key in filter(None, section.split(".")):
      target = target[key]
    target[field] = value


def _config(trainer: str, recipe: str, changes: dict):
  from jaxpt.config import load_config_file
  config = load_config_file(os.path.join(ROOT, "experiments", "configs", f"{trainer}_{recipe}.py"))
  _set(config, changes)
  return config


def workloads() -> dict:
  """The recipes' step sizes the tables use (from the configs, as `plan.workload` reads them)."""
  from jaxpt.trainers import plan
  out = {}
  for trainer in ("sft", "dpo", "grpo"):
    config = _config(trainer, "hf", {"init_from": f"hf:{QWEN['0.5B']}"})
    run = plan.run_config(trainer, config)
    load = plan.workload(trainer, run)
    out[trainer] = dict(rows_per_update=load.rows, micro_rows=load.micro_rows, seq=load.seq,
                        sampler_rows=load.sampler_rows, sampler_len=load.sampler_len, dtype=run.model.dtype,
                        param_dtype=run.model.param_dtype, remat=run.model.remat)
  return out


def _advised(trainer: str, config, devices: int, tips: list[str]) -> dict | None:
  """The plan of the advice's `together:` overrides (else its first single override that fits), or None."""
  from jaxpt.trainers import plan
  chosen = next((t for t in tips if t.startswith("together:")), None) or next(
      (t for t in tips if "(fits)" in t), None)
  if chosen is None:
    return None
  flags = [word for word in chosen.split() if word.startswith("--config.")]
  changes = {}
  for flag in flags:
    key, _, value = flag[len("--config."):].partition("=")
    changes[key] = int(value) if value.lstrip("-").isdigit() else value
  _set(config, changes)
  result = plan.plan_memory(trainer, config, devices, 16)
  return dict(overrides=" ".join(flags), total_gib=result["per_device_gib"]["total"], fits=result["fits"],
              per_device_gib=result["per_device_gib"], workload=result["workload"])


def tables() -> dict:
  from jaxpt.trainers import plan
  out = {}
  for size, directory in QWEN.items():
    for devices, mesh in MESHES.items():
      for trainer in ("sft", "dpo", "grpo"):
        for variant, changes in VARIANTS.items():
          config = _config(trainer, "hf", {"init_from": f"hf:{directory}", **mesh, **changes})
          result = plan.plan_memory(trainer, config, devices, 16)
          cell = dict(per_device_gib=result["per_device_gib"], fits=result["fits"], advice=result["advice"])
          if not result["fits"]:
            cell["advised"] = _advised(trainer, config, devices, result["advice"])
          out[f"{size} {devices}x16GiB {trainer} {variant}"] = cell
  return out


WARMUP, MEASURED = 2, 2  # peaks: untimed steps (the first ones free the previous step's buffers late), measured ones
CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
from benchmarks.plan_tables import child
print("RESULT " + json.dumps(child(*json.loads(sys.argv[1]))))
"""


def _kb(field: str) -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _settled_rss_kb(interval: float = 0.05, still: int = 4, limit: float = 5.0) -> int:
  """VmRSS once the previous step's buffers are freed: garbage collected, then `still` equal readings in a row
  (`interval` seconds apart; at most `limit` seconds). XLA:CPU frees a step's buffers after its outputs are ready,
  so an RSS read at once would count them in the baseline and the next step would reuse them unseen."""
  gc.collect()
  readings, deadline = [_kb("VmRSS")], time.monotonic() + limit
  while time.monotonic() < deadline and not (len(readings) >= still and len(set(readings[-still:])) == 1):
    time.sleep(interval)
    readings.append(_kb("VmRSS"))
  return readings[-1]


def _batch(shapes: dict, seq: int) -> dict:
  """A batch of `shapes` whose every index is in range (last / lengths within the sequence)."""
  import jax.numpy as jnp
  out = {}
  for key, s in shapes.items():
    value = seq - 1 if key.endswith("_last") else seq // 2 if key.endswith("_response_len") else 1
    out[key] = jnp.full(s.shape, value if jnp.issubdtype(s.dtype, jnp.integer) else 0.5, s.dtype)
  return out


def child(trainer: str, size: str, rank: int, accum: int = 1) -> dict:
  """The analytic, compiled and measured peak of one step of `trainer` at `size`, LoRA `rank` (0: full fine-tune),
  `accum` micro-batches per update (run in a fresh process)."""
  import jax
  import jax.numpy as jnp
  from jaxpt.trainers import plan
  changes = {**{f"model.{k}": v for k, v in SIZES[size].items()}, **PEAK_WORKLOAD[trainer],
             "model.dtype": "float32", "model.remat": "full", "model.max_seq_len": 256, "lora.rank": rank,
             "optim.grad_accum_steps": accum}
  run = plan.run_config(trainer, _config(trainer, "tiny", changes))
  parts = plan.account(trainer, run, 1)
  start = time.perf_counter()
  training = plan.step_training(trainer, run, 1)
  compile_s = time.perf_counter() - start
  stats = training.sharded.train_step.memory_analysis()
  compiled = dict(argument=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
                  temp=stats.temp_size_in_bytes, alias=stats.alias_size_in_bytes)
  compiled["peak"] = compiled["argument"] + compiled["output"] + compiled["temp"] - compiled["alias"]
  load = plan.workload(trainer, run)
  state = training.init_state()
  reference = jax.tree.map(jnp.copy, state.params) if load.reference else None
  batch = training.put(_batch(plan.step_shapes(trainer, run), load.seq))
  transients = []
  for _ in range(WARMUP + MEASURED):
    before = _settled_rss_kb()
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")  # VmHWM := VmRSS
    state, metrics = training.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    transients.append((_kb("VmHWM") - before) * 1024)
  alive = sum(x.nbytes for x in jax.tree.leaves((state, reference, batch)))
  transient = max(transients[WARMUP:])
  reference_bytes = parts["reference"]
  step_total = plan.step_total(parts)
  measured = alive + transient
  mib = lambda n: round(n / 2 ** 20, 2)
  return dict(
      trainer=trainer, size=size, lora_rank=rank, grad_accum_steps=accum, rows=load.rows,
      micro_rows=load.micro_rows, seq=load.seq,
      analytic_mib={k: mib(v) for k, v in parts.items()}, analytic_step_total_mib=mib(step_total),
      compiled_mib={k: mib(v) for k, v in compiled.items()}, compiled_total_mib=mib(compiled["peak"] + reference_bytes),
      measured_mib=dict(alive_before_step=mib(alive), step_transient=mib(transient), peak=mib(measured),
                        transient_per_step=[mib(t) for t in transients]),
      analytic_over_measured=round(step_total / measured, 3),
      compiled_over_measured=round((compiled["peak"] + reference_bytes) / measured, 3),
      loss_finite=bool(jnp.isfinite(metrics["loss"])), compile_s=round(compile_s, 1))


def peaks(sizes: list[str], trainers: list[str], accums: list[int]) -> list[dict]:
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", JAX_PLATFORMS="cpu",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = []
  for size in sizes:
    for trainer in trainers:
      for rank in (0, 8):
        for accum in accums:
          done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([trainer, size, rank, accum])], env=env,
                                cwd=ROOT, capture_output=True, text=True)
          line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
          if line is None:
            raise RuntimeError(f"{trainer} {size} rank {rank} accum {accum}: {done.stderr[-2000:]}")
          result = json.loads(line[len("RESULT "):])
          result["loadavg_1min"] = os.getloadavg()[0]
          print(json.dumps(result), file=sys.stderr, flush=True)
          out.append(result)
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", default="all", choices=("tables", "peaks", "all"))
  parser.add_argument("--sizes", default="tiny,d256,d512", help="peaks: among " + ",".join(SIZES))
  parser.add_argument("--trainers", default="sft,dpo,grpo", help="peaks: among " + ",".join(PEAK_WORKLOAD))
  parser.add_argument("--accum", default="1", help="peaks: optim.grad_accum_steps values (each divides 8)")
  args = parser.parse_args(argv)
  report = {"benchmark": "plan_tables", "command": "python -m benchmarks.plan_tables " + " ".join(
      sys.argv[1:] if argv is None else argv), "headroom": None}
  from jaxpt.trainers import plan
  report["headroom"] = plan.HEADROOM
  if args.part in ("tables", "all"):
    report["workloads"] = workloads()
    report["tables"] = tables()
  if args.part in ("peaks", "all"):
    report["peak_workload"] = dict(PEAK_WORKLOAD, sizes={s: SIZES[s] for s in args.sizes.split(",")})
    report["peaks"] = peaks(args.sizes.split(","), args.trainers.split(","), [int(a) for a in args.accum.split(",")])
  json.dump(report, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  main()
