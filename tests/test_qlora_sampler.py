"""Rollouts on a QLoRA policy's codes (`lora.rollouts`, `make_sampler(lora=...)`): the sampler on the nf4 codes and
unmerged adapters against the same sampler on the merged float copy W~ + s A B (greedy tokens exact, log-probs to
rounding), the teacher-forced log-probs and the adapters-off reference against the merged policy and the quantized
base, bf16 rollouts on the codes (their scales kept float32), and the compiled sampler's memory: no float copy of
the base among its arguments or temporaries."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.nn import lora as lora_lib
from jaxpt.nn.lora import LoRAConfig
from jaxpt.rl.logprobs import response_logprobs
from jaxpt.nn.quant import Quant
from jaxpt.rl.sampler import SamplingConfig, decode_config_of, decode_params, make_sampler

# 4 layers whose projections outweigh the embedding, so that a float copy of the base would show in the memory
TINY = ModelConfig(vocab_size=64, d_model=64, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=256, max_seq_len=64)
LORA = {"rank": 4, "alpha": 8.0, "base_quant": "nf4", "base_quant_block": 16}
GREEDY = SamplingConfig(max_new_tokens=6, greedy=True, cache_segments=1)
PROMPT_LEN, ROWS = 6, 4


@pytest.fixture(scope="module")
def policy():
  """(spec, params with random B (the adapters matter), the merged float params, prompts, mask)."""
  spec = from_section(LoRAConfig, LORA, "lora").spec()
  params = nn.meta.unbox(jax.jit(TransformerLM(TINY, lora=spec).init)(jax.random.PRNGKey(0),
                                                                        jnp.zeros((1, 8), jnp.int32))["params"])
  params = jax.tree_util.tree_map_with_path(
      lambda p, v: 0.3 * jax.random.normal(jax.random.PRNGKey(len(jax.tree_util.keystr(p))), v.shape)
      if jax.tree_util.keystr(p).endswith("['lora_b']") else v, params)
  merged = jax.jit(lambda p: lora_lib.merge_params(p, spec.scale, spec.quant))(params)
  tokens = np.random.default_rng(0).integers(1, TINY.vocab_size, (ROWS, PROMPT_LEN)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[1, :3] = 0  # a left-padded row
  return spec, params, merged, tokens, mask


@pytest.fixture(scope="module")
def samplers(policy):
  """The greedy sampler compiled on the codes + unmerged adapters and on the merged params (~10 s each)."""
  spec, params, merged, tokens, mask = policy
  rng = jax.random.PRNGKey(0)
  codes = make_sampler(TINY, GREEDY, PROMPT_LEN, lora=spec).lower(params, tokens, mask, rng).compile()
  plain = make_sampler(TINY, GREEDY, PROMPT_LEN).lower(merged, tokens, mask, rng).compile()
  return codes, plain


def test_rollouts_on_the_codes_equal_the_merged_policys(policy, samplers):
  spec, params, merged, tokens, mask = policy
  codes, plain = samplers
  rng = jax.random.PRNGKey(0)
  got, want = codes(params, tokens, mask, rng), plain(merged, tokens, mask, rng)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got.mask, want.mask)
  base = plain(jax.jit(lambda p: lora_lib.dequantize_params(lora_lib.base_params(p), spec.quant))(params), tokens,
               mask, rng)
  assert not np.array_equal(base.tokens, want.tokens)  # the adapters change the rollouts: the codes path reads them


def test_teacher_forced_logprobs_on_the_codes_and_the_adapters_off_reference(policy, samplers):
  """The old policy's log-probs on the codes equal the merged policy's to rounding; with the adapters at 0 the
  adapted model gives the quantized base's log-probs (`lora_lib.base_spec`) exactly (s (x 0) 0 = 0 is added)."""
  spec, params, merged, tokens, mask = policy
  out = samplers[1](merged, tokens, mask, jax.random.PRNGKey(0))
  forward = lambda model: jax.jit(lambda p: response_logprobs(model, p, tokens, mask, out.tokens, out.mask))
  adapted = forward(TransformerLM(TINY, lora=spec))
  np.testing.assert_allclose(adapted(params), forward(TransformerLM(TINY))(merged), rtol=1e-5, atol=1e-5)
  off = lora_lib.replace_adapters(params, jax.tree.map(jnp.zeros_like, lora_lib.adapter_params(params)))
  np.testing.assert_array_equal(adapted(off), forward(TransformerLM(TINY, lora=lora_lib.base_spec(spec)))(
      lora_lib.base_params(params)))


@pytest.mark.parametrize("scheme", ["nf4", pytest.param("int8", marks=pytest.mark.slow)])
def test_bf16_rollouts_on_the_codes_read_the_float32_dequantized_kernels_cast_once(policy, scheme):
  """`decode_params` keeps `kernel_scale` float32 under bf16 rollouts: the codes path's W~ is code x scale in float32
  cast to bf16, bitwise the merged path's bf16(W~), so with the adapters at 0 the bf16 logits on the codes equal the
  bf16 logits on the dequantized base (a bf16 scale rounds a second time: benchmarks/qlora_bf16_rollouts.py)."""
  spec, params, _, tokens, _ = policy
  if scheme != spec.quant.scheme:
    spec = dataclasses.replace(spec, quant=Quant(scheme, spec.quant.block))
    params = lora_lib.quantize_params(lora_lib.dequantize_params(params, policy[0].quant), spec.quant)
  params = lora_lib.replace_adapters(params, jax.tree.map(jnp.zeros_like, lora_lib.adapter_params(params)))
  bf16 = decode_config_of(TINY, dataclasses.replace(GREEDY, rollout_dtype="bfloat16"))
  codes = decode_params(params, TINY, bf16)
  scales = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(codes) if "kernel_scale" in str(path[-1])]
  assert scales and all(leaf.dtype == jnp.float32 for leaf in scales)
  base = decode_params(lora_lib.dequantize_params(lora_lib.base_params(params), spec.quant), TINY, bf16)
  logits = lambda model, p: jax.jit(model.apply)({"params": p}, tokens)
  np.testing.assert_array_equal(logits(TransformerLM(bf16, lora=spec), codes), logits(TransformerLM(bf16), base))


def test_the_compiled_sampler_holds_no_float_copy_of_the_base(policy, samplers):
  """Its arguments are the codes (nf4: 1/8 of float32 kernels) and its temporaries stay near the merged sampler's:
  a float copy of the quantized kernels would add their whole size (before `codes_in_step`, XLA hoisted their
  dequantization out of the decode loop: +86% of it here)."""
  spec, params, merged, _, _ = policy
  codes, plain = (c.memory_analysis() for c in samplers)
  floats = sum(leaf.nbytes for path, leaf in jax.tree_util.tree_leaves_with_path(merged)
               if jax.tree_util.keystr(path).endswith("['kernel']"))  # the quantized kernels, in float32
  assert codes.argument_size_in_bytes < plain.argument_size_in_bytes - floats / 2
  assert codes.temp_size_in_bytes < plain.temp_size_in_bytes + floats / 4, (codes.temp_size_in_bytes,
                                                                            plain.temp_size_in_bytes, floats)


def test_rollouts_setting_resolves_and_refuses_one_line():
  resolved = lambda **fields: from_section(LoRAConfig, {"rank": 4, **fields}, "lora").samples_unmerged
  assert resolved(base_quant="int8") and resolved(base_quant="nf4", base_quant_block=16)
  assert not resolved() and resolved(rollouts="unmerged")
  assert not resolved(base_quant="int8", rollouts="merged")
  assert not from_section(LoRAConfig, {}, "lora").samples_unmerged  # rank 0: no adapters
  for way in ("merged", "unmerged"):  # set with LoRA off: refused, not ignored
    with pytest.raises(ConfigError, match=rf"^lora\.rollouts='{way}': .*LoRA is off: set lora\.rank > 0") as e:
      from_section(LoRAConfig, {"rollouts": way}, "lora")
    assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match=r"^lora\.rollouts='codes': ") as e:
    from_section(LoRAConfig, {"rank": 4, "rollouts": "codes"}, "lora")
  assert "\n" not in str(e.value)


def test_a_rollouts_override_with_lora_off_is_refused_even_at_auto():
  """`--config.lora.rollouts=auto` with rank 0: a config file holds every field, so the run config cannot tell it from
  auto left unset; the command line's overrides can (`check_overrides`, run by the CLI before any work)."""
  from ml_collections import ConfigDict

  from jaxpt.engine.config import check_overrides

  off = ConfigDict({"lora": {"rank": 0, "rollouts": "auto"}})
  with pytest.raises(ConfigError, match=r"^config\.lora\.rollouts='auto': .*LoRA is off: set lora\.rank > 0"):
    check_overrides(off, {"lora.rollouts": "auto"})
  check_overrides(off, {"lora.alpha": 8.0})
  check_overrides(ConfigDict({"lora": {"rank": 4, "rollouts": "auto"}}), {"lora.rollouts": "auto"})
