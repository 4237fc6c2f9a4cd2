"""Model hyper-parameters: one frozen dataclass (the `model` config section), checked on construction."""

from __future__ import annotations

import dataclasses

from jaxpt.config import Section, fail, one_of
from jaxpt.nn.norms import NORMS
from jaxpt.nn.rope import Llama3Scaling

SIAMESE_SCHEMES = ("siamese_post_pre", "siamese_hybrid_pre")
HYPER_CONNECTION_SCHEMES = ("hc", "hc_dynamic", "mhc", "mhc_lite")  # n = hc_streams streams
NORM_SCHEMES = ("pre", "post", "hybrid") + SIAMESE_SCHEMES + HYPER_CONNECTION_SCHEMES
MAX_MHC_LITE_STREAMS = 5  # mhc_lite mixes all n! permutation matrices (120 at n = 5)
MLP_TYPES = ("swiglu", "gelu", "gelu_exact")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots")
KERNELS = ("reference", "pallas")
ATTENTION_IMPLS = ("auto", "jaxpt", "jax")
ROPE_SCALINGS = ("none", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
  """Decoder-only transformer LM (the `model` section).

  Attributes:
    vocab_size: rows of the token embedding; the tokenizer is trained to at most this many tokens.
    d_model: width of the residual stream.
    num_layers: transformer blocks.
    num_heads: attention (query) heads.
    num_kv_heads: key/value heads (grouped-query attention; must divide num_heads).
    head_dim: width of a head; None = d_model // num_heads (must be even, for RoPE).
    mlp_dim: hidden width of the MLP.
    mlp_type: swiglu | gelu (tanh approximation) | gelu_exact (erf, as ViT/DeiT).
    mlp_bias: add a bias to every MLP projection (ViT).
    num_experts: > 0: every MLP is a top-k routed mixture of that many experts (`jaxpt.nn.moe`), each of width
      mlp_dim; 0 = dense MLPs.
    experts_per_token: MoE: experts k each token is routed to (gates renormalised over them).
    moe_capacity_factor: MoE: 0 = dropless (`jax.lax.ragged_dot` over the tokens sorted by expert); > 0 = each
      expert takes at most ceil(factor * tokens * k / experts) assignments (dense dispatch, the rest dropped).
    moe_load_balance_coef: MoE: weight of the load-balancing loss E sum_e f_e P_e (mean over layers) in the LM loss.
    moe_router_z_coef: MoE: weight of the router z-loss mean_t logsumexp(router logits)^2 (mean over layers).
    norm_type: rmsnorm | layernorm.
    norm_eps: epsilon of every norm.
    norm_scheme: the residual scheme (see `jaxpt.models.blocks`): pre | post | hybrid | siamese_post_pre |
      siamese_hybrid_pre | hc | hc_dynamic | mhc | mhc_lite (the multi-stream schemes of
      `jaxpt.models.hyper_connections`).
    hc_streams: residual streams n of the multi-stream schemes (hc, hc_dynamic, mhc, mhc_lite; at most 5 for
      mhc_lite); the other schemes ignore it.
    hc_sinkhorn_iterations: mhc: Sinkhorn-Knopp iterations (rows then columns) that make the mixing matrix doubly
      stochastic.
    qk_norm: normalise queries and keys in attention (the hybrid schemes always do).
    v_norm: normalise values in attention (the hybrid schemes always do).
    causal: causal self-attention (a token reads itself and earlier tokens: the LM); False = bidirectional (every
      token reads every token: ViT, DiT).
    rope: rotary position embedding on queries and keys; False for models that add position embeddings to their
      inputs (ViT, DiT: `jaxpt.nn.vision`).
    tie_embeddings: the output projection is the token embedding, transposed.
    rope_theta: base wavelength of the rotary position embedding.
    qkv_bias: add a bias [heads, head_dim] to the query/key/value projections (Qwen2).
    attn_out_bias: add a bias [d_model] to the attention output projection.
    rope_scaling: `none` (RoPE frequencies base^(-2i/D)) or `llama3` (Llama-3.1 frequency scaling, equations in
      `jaxpt.nn.rope`, with the four fields below).
    rope_scaling_factor: llama3: low frequencies are divided by it.
    rope_low_freq_factor: llama3: wavelengths above rope_original_max_len / it are scaled fully.
    rope_high_freq_factor: llama3: wavelengths below rope_original_max_len / it are kept.
    rope_original_max_len: llama3: the pre-training context length the bands are measured in.
    attention_query_chunk: > 0: causal attention computed that many queries at a time, skipping the key blocks
      above the diagonal (same result; see `jaxpt.nn.attention`); 0 = all queries at once.
    attention_impl: how attention without a KV cache (training, scoring) is computed: `jaxpt` (head-major, in
      query chunks; `jaxpt.nn.attention`), `jax` (`jax.nn.dot_product_attention`: cuDNN's fused attention on
      NVIDIA GPUs in bf16 without packed segments, XLA's otherwise) or `auto` (the default: cuDNN's where it
      applies, else `jaxpt`; on one H200 a ~350M bf16 train step took 70 ms with cuDNN's and 154 ms with `jaxpt`,
      benchmarks/results_device_h200). Same result; decoding always uses `jaxpt`.
    max_seq_len: the longest sequence the model takes (data rows, prompt + response).
    dtype: the compute dtype: float32 | bfloat16.
    param_dtype: the dtype parameters are always kept in: float32 | bfloat16.
    remat: recompute each block in the backward pass: none | full | dots (keep the matmul outputs).
    scan_layers: the blocks run as one scan over stacked layer parameters (faster compile), else unrolled.
    dropout_rate: dropout probability in training (0 = off).
    kernel: how the siamese schemes compute their sub-layer boundaries: `reference` (separate norm modules, XLA fuses
      what it can) or `pallas` (the fused two-stream-norm kernels in `kernels/two_stream_norm`; same parameters).
      The other schemes have no fused boundary and ignore it.
  """

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int | None = None
  mlp_dim: int = 512
  mlp_type: str = "swiglu"
  mlp_bias: bool = False
  num_experts: int = 0
  experts_per_token: int = 2
  moe_capacity_factor: float = 0.0
  moe_load_balance_coef: float = 0.01
  moe_router_z_coef: float = 0.001
  norm_type: str = "rmsnorm"
  norm_eps: float = 1e-5
  norm_scheme: str = "pre"
  hc_streams: int = 4
  hc_sinkhorn_iterations: int = 20
  qk_norm: bool = False
  v_norm: bool = False
  qkv_bias: bool = False
  attn_out_bias: bool = False
  causal: bool = True
  rope: bool = True
  tie_embeddings: bool = True
  rope_theta: float = 10000.0
  rope_scaling: str = "none"
  rope_scaling_factor: float = 8.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  attention_query_chunk: int = 64
  attention_impl: str = "auto"
  max_seq_len: int = 2048
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  dropout_rate: float = 0.0
  kernel: str = "reference"

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  @property
  def rope_scaling_params(self) -> Llama3Scaling | None:
    """What `jaxpt.nn.rope.apply_rope` takes: None without scaling."""
    if self.rope_scaling == "none":
      return None
    return Llama3Scaling(self.rope_scaling_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                         self.rope_original_max_len)

  @property
  def is_siamese(self) -> bool:
    return self.norm_scheme in SIAMESE_SCHEMES

  @property
  def num_streams(self) -> int:
    """Residual streams a block takes and returns: 2 for SiameseNorm, hc_streams for the multi-stream schemes."""
    if self.is_siamese:
      return 2
    return self.hc_streams if self.norm_scheme in HYPER_CONNECTION_SCHEMES else 1

  def projection_dims(self) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection LoRA can adapt (`jaxpt.nn.lora.PROJECTIONS`; no mlp_* with MoE)."""
    heads, kv = self.num_heads * self.resolved_head_dim, self.num_kv_heads * self.resolved_head_dim
    dims = {"q": (self.d_model, heads), "k": (self.d_model, kv), "v": (self.d_model, kv), "o": (heads, self.d_model)}
    if not self.num_experts:
      dims.update(mlp_in=(self.d_model, self.mlp_dim), mlp_out=(self.mlp_dim, self.d_model))
    return dims

  def projection_blocked_dims(self) -> dict[str, int]:
    """The size of each projection kernel's last input axis (a quantized base's blocks run along it,
    `jaxpt.nn.quant`): d_model, head_dim for o, mlp_dim for mlp_out."""
    d = self.d_model
    return {"q": d, "k": d, "v": d, "o": self.resolved_head_dim, "mlp_in": d, "mlp_out": self.mlp_dim}

  def check(self) -> None:
    """ConfigError (relative field name) for an impossible combination; `jaxpt.config.from_section` calls it."""
    for field in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim", "max_seq_len",
                  "hc_streams", "hc_sinkhorn_iterations"):
      if getattr(self, field) <= 0:
        raise fail(self, field, "must be a positive integer")
    choices = {"norm_scheme": NORM_SCHEMES, "norm_type": NORMS, "mlp_type": MLP_TYPES, "dtype": DTYPES,
               "param_dtype": DTYPES, "remat": REMAT_POLICIES, "kernel": KERNELS, "rope_scaling": ROPE_SCALINGS,
               "attention_impl": ATTENTION_IMPLS}
    for field, allowed in choices.items():
      one_of(self, field, allowed)
    if self.num_experts < 0:
      raise fail(self, "num_experts", "must be a non-negative integer (0: dense MLPs)")
    if self.num_experts and self.mlp_bias:
      raise fail(self, "mlp_bias", "the MoE experts (model.num_experts > 0) have no biases")
    if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
      raise fail(self, "experts_per_token", f"must be in [1, model.num_experts={self.num_experts}]")
    for field in ("moe_capacity_factor", "moe_load_balance_coef", "moe_router_z_coef"):
      if not getattr(self, field) >= 0:
        raise fail(self, field, "must be non-negative")
    if self.norm_scheme == "mhc_lite" and self.hc_streams > MAX_MHC_LITE_STREAMS:
      raise fail(self, "hc_streams", f"mhc_lite mixes all hc_streams! permutation matrices: at most "
                 f"{MAX_MHC_LITE_STREAMS} streams")
    if self.head_dim is None and self.d_model % self.num_heads:
      raise fail(self, "d_model", f"not divisible by model.num_heads={self.num_heads}")
    if self.head_dim is not None and self.head_dim <= 0:
      raise fail(self, "head_dim", "must be a positive integer")
    if self.rope and self.resolved_head_dim % 2:
      raise fail(self, "head_dim" if self.head_dim else "d_model", "head dimension must be even for RoPE")
    if self.num_heads % self.num_kv_heads:
      raise fail(self, "num_kv_heads", f"must divide model.num_heads={self.num_heads}")
    if not self.norm_eps > 0:
      raise fail(self, "norm_eps", "must be positive")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise fail(self, "dropout_rate", "must be in [0, 1)")
    if self.attention_query_chunk < 0:
      raise fail(self, "attention_query_chunk", "must be a non-negative integer (0: all queries at once)")
    if not self.rope_theta > 0:
      raise fail(self, "rope_theta", "must be positive")
    if self.rope_scaling == "llama3":
      for field in ("rope_scaling_factor", "rope_low_freq_factor", "rope_original_max_len"):
        if not getattr(self, field) > 0:
          raise fail(self, field, "must be positive")
      if not self.rope_high_freq_factor > self.rope_low_freq_factor:
        raise fail(self, "rope_high_freq_factor", f"must exceed model.rope_low_freq_factor={self.rope_low_freq_factor}")
