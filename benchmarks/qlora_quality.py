"""QLoRA's quality cost (`lora.base_quant`, `jaxpt.nn.quant`), one JSON object on stdout.

1. logits: each tiny HF fixture (`tests/assets/hf/<family>`, `jaxpt.load("hf:...")`) with its adapted projections'
   kernels quantized (int8, nf4; blocks of 16: head_dim is 16) vs the float32 base, on random tokens: max / mean
   |logit error| (and the mean |logit| for scale) and the top-1 agreement. B = 0, so the QLoRA model's logits are the
   dequantized base's; the model runs the quantized Dense path (codes -> W~ -> dot).
2. a tiny SFT (`experiments/configs/sft_lora_tiny.py`, shrunk): a float32 base trained in full, then adapted from it
   (`init_from`) with LoRA on the float32 base and with QLoRA int8 / nf4 (quantized at the start of the run, the
   builder's path): each run's final eval loss, and the base's.

  PYTHONPATH=. python3 benchmarks/qlora_quality.py > benchmarks/results_qlora_quality_cpu.json
"""

from __future__ import annotations

import json
import sys
import tempfile

import flax.linen as nn
import jax
import numpy as np

import jaxpt
from experiments.configs import sft_lora_tiny
from jaxpt.engine.metrics import read_metrics
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.quant import Quant

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
BLOCK = 16
SFT = {"log_every": 10, "checkpoint_every": 0, "progress": False, "model.vocab_size": 512, "model.d_model": 64,
       "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2, "model.mlp_dim": 128,
       "model.max_seq_len": 80, "data.seq_len": 80, "data.batch_size": 16, "data.eval_batches": 2,
       "optim.warmup_steps": 5, "task.max_value": 15, "task.train_size": 400, "task.test_size": 32,
       "decode.prompt_len": 48, "decode.max_new_tokens": 32, "decode.eval_problems": 16, "decode.batch_size": 16}
BASE_STEPS, ADAPT_STEPS = 60, 40


def logit_errors(family: str) -> dict:
  """{scheme: errors} of the fixture's quantized base vs its float32 base."""
  model = jaxpt.load(f"hf:tests/assets/hf/{family}")
  tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 32), 0, model.config.vocab_size)
  want = np.asarray(jax.jit(TransformerLM(model.config).apply)({"params": model.params}, tokens))
  out = {"mean_abs_logit": float(np.abs(want).mean())}
  floats = lora_lib.with_adapters(model.params, _float_adapters(model.config, tokens))  # B = 0
  for scheme in ("int8", "nf4"):
    spec = lora_lib.LoRA(1, 1.0, quant=Quant(scheme, BLOCK))
    qlora = TransformerLM(model.config, lora=spec)
    params = jax.jit(lambda p, spec=spec: lora_lib.quantize_params(p, spec.quant))(floats)
    got = np.asarray(jax.jit(qlora.apply)({"params": params}, tokens))
    err = np.abs(got - want)
    out[scheme] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                   "top1_agreement": float((got.argmax(-1) == want.argmax(-1)).mean())}
  return out


def _float_adapters(config, tokens):
  """Adapters (A random, B = 0) for every projection of the float LoRA model: their shapes place the quantizer."""
  model = TransformerLM(config, lora=lora_lib.LoRA(1, 1.0))
  return nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(1), tokens)["params"])


def sft_eval_losses(root: str) -> dict:
  """The final eval loss of the float32 base (trained in full) and of LoRA / QLoRA runs started from it."""

  def run(name: str, overrides: dict) -> float:
    config = sft_lora_tiny.get_config()
    config.update_from_flattened_dict({**SFT, **overrides})
    workdir = f"{root}/{name}"
    jaxpt.train("sft", config, workdir)
    rows = [r for r in read_metrics(workdir) if "eval_loss" in r]
    return float(rows[-1]["eval_loss"])

  base = run("base", {"lora.rank": 0, "steps": BASE_STEPS, "eval_every": BASE_STEPS, "optim.learning_rate": 3e-3})
  adapt = {"init_from": f"{root}/base", "steps": ADAPT_STEPS, "eval_every": ADAPT_STEPS, "lora.rank": 8,
           "optim.learning_rate": 1e-2}
  out = {"base_full_ft_eval_loss": base, "steps": {"base": BASE_STEPS, "adapt": ADAPT_STEPS}}
  for scheme in ("none", "int8", "nf4"):
    out[f"lora_{'fp32' if scheme == 'none' else scheme}_eval_loss"] = run(
        scheme, {**adapt, "lora.base_quant": scheme, "lora.base_quant_block": BLOCK})
  return out


def main() -> None:
  result = {"benchmark": "qlora_quality", "backend": jax.default_backend(), "block": BLOCK,
            "logits": {family: logit_errors(family) for family in FAMILIES}}
  with tempfile.TemporaryDirectory() as root:
    result["sft"] = sft_eval_losses(root)
  json.dump(result, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  main()
