"""bf16 rollouts on a QLoRA policy's codes (`sampling.rollout_dtype=bfloat16`, `lora.rollouts=unmerged`): how far
their logits and log-probs are from the float32 policy, one JSON object on stdout.

A random tiny model (d 256, 2 layers, vocab 512) with its six projections quantized (int8, nf4; blocks of 64) and
random adapters B (so they matter), teacher-forced on random tokens [8, 32]. Each way's logits l and log-probs
log_softmax(l) against those of the float32 codes path (`fp32_codes`, the trained policy):
- `bf16_codes`: the sampler's params (`jaxpt.rl.sampler.decode_params`, as committed) read by the bf16 model with the
  quantized Dense (codes dequantized in each matmul);
- `bf16_codes_bf16_scales`: the same with the scales `kernel_scale` cast to bf16 too (every float leaf cast: what
  `decode_params` did before it kept them float32);
- `bf16_merged`: the merged float32 params W~ + s A B cast to bf16, read by the bf16 plain model (`lora.rollouts=
  merged`).
Each entry: max / mean |logit error|, max / mean |log-prob error| over the whole vocabulary, and the same of the
way against `bf16_merged` (`vs_merged_*`). Errors averaged over `SEEDS` (max: the largest).

  PYTHONPATH=. python3 benchmarks/qlora_bf16_rollouts.py > benchmarks/results_qlora_bf16_rollouts_cpu.json
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.lora import LoRA
from jaxpt.nn.quant import Quant
from jaxpt.rl.sampler import SamplingConfig, decode_config_of, decode_params

CONFIG = ModelConfig(vocab_size=512, d_model=256, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=768,
                     max_seq_len=64)
BF16 = SamplingConfig(max_new_tokens=1, rollout_dtype="bfloat16")
ROWS, SEQ, BLOCK, SEEDS = 8, 32, 64, (0, 1, 2)


def policy(scheme: str, seed: int):
  """(spec, QLoRA params with random B, tokens [ROWS, SEQ])."""
  spec = LoRA(rank=8, scale=2.0, quant=Quant(scheme, BLOCK))
  params = init_params(CONFIG, jax.random.PRNGKey(seed), model=TransformerLM(CONFIG, lora=spec))
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: 0.02 * jax.random.normal(jax.random.PRNGKey(seed + len(jax.tree_util.keystr(p))), v.shape)
      if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
  tokens = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (ROWS, SEQ)).astype(np.int32)
  return spec, params, tokens


def logits_of_ways(spec: LoRA, params, tokens) -> dict[str, np.ndarray]:
  bf16 = decode_config_of(CONFIG, BF16)
  codes_fp32 = TransformerLM(dataclasses.replace(CONFIG, scan_layers=False), lora=spec)
  codes_bf16 = TransformerLM(bf16, lora=spec)
  plain_bf16 = TransformerLM(bf16)
  unrolled = decode_params(params, CONFIG, decode_config_of(CONFIG, SamplingConfig(max_new_tokens=1)))
  cast_all = jax.tree.map(lambda p: p.astype(jnp.bfloat16) if jnp.issubdtype(p.dtype, jnp.floating) else p, unrolled)
  merged = lora_lib.merge_params(params, spec.scale, spec.quant)
  run = lambda model, p: np.asarray(jax.jit(model.apply)({"params": p}, tokens), np.float64)
  return {"fp32_codes": run(codes_fp32, unrolled),
          "bf16_codes": run(codes_bf16, decode_params(params, CONFIG, bf16)),
          "bf16_codes_bf16_scales": run(codes_bf16, cast_all),
          "bf16_merged": run(plain_bf16, decode_params(merged, CONFIG, bf16))}


def log_softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def errors(got: np.ndarray, want: np.ndarray, prefix: str = "") -> dict[str, float]:
  dl, dp = np.abs(got - want), np.abs(log_softmax(got) - log_softmax(want))
  return {f"{prefix}max_abs_logit_err": float(dl.max()), f"{prefix}mean_abs_logit_err": float(dl.mean()),
          f"{prefix}max_abs_logprob_err": float(dp.max()), f"{prefix}mean_abs_logprob_err": float(dp.mean())}


def main() -> None:
  result = {"benchmark": "qlora_bf16_rollouts", "backend": jax.default_backend(), "block": BLOCK, "seeds": len(SEEDS),
            "shape": [ROWS, SEQ]}
  for scheme in ("int8", "nf4"):
    runs = []
    for seed in SEEDS:
      ways = logits_of_ways(*policy(scheme, seed))
      want, merged = ways.pop("fp32_codes"), ways["bf16_merged"]
      runs.append({way: {**errors(got, want), **errors(got, merged, "vs_merged_")} for way, got in ways.items()})
      runs[-1]["mean_abs_logit"] = {"value": float(np.abs(want).mean())}
    reduce = lambda key: max if "max_" in key else np.mean  # over the seeds
    result[scheme] = {way: {k: float(reduce(k)([run[way][k] for run in runs])) for k in runs[0][way]}
                      for way in runs[0]}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
