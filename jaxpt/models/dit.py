"""DiT (Peebles & Xie 2023): a class-conditional diffusion transformer predicting the noise, over the `pre` scheme and
SiameseNorm `siamese_post_pre` (spec: shared/specs/siamesenorm.md, "Other modalities"; the official SiameseNorm
code's dit-model-siamesenorm.py).

    tokens = patchify(x_t) W_patch + b + P                     [batch, N, d], P the fixed 2-D sin-cos table
    c      = TimestepEmbedding(t) + LabelEmbedding(y)          [batch, d]; label num_classes = "null" (CFG)
    per block l, (shift_a, scale_a, gate_a, shift_m, scale_m, gate_m) = AdaLNModulation(6)(c)   (zero at init)
      pre:               x <- x + gate_a Attn(modulate(LN(x), shift_a, scale_a))
                         x <- x + gate_m MLP(modulate(LN(x), shift_m, scale_m))
      siamese_post_pre:  xh = LN_post1(x);  a = gate_a Attn(modulate(LN_in(xh + LN_pre1(y)), shift_a, scale_a))
                         x' = xh + a / c_l;  y' = y + a
                         xh' = LN_post2(x');  m = gate_m MLP(modulate(LN_in(xh' + LN_pre2(y')), shift_m, scale_m))
                         x <- xh' + m / c_l;  y <- y' + m
    hidden = x_L (pre)  or  LN_fx(x_L) + LN_fy(y_L) (siamese)
    eps    = unpatchify(modulate(LN(hidden), shift_f, scale_f) W_out + b_out)    [batch, H, W, channels], float32

LN / LN_in: LayerNorm without scale or bias (`jaxpt.nn.conditioning.layer_norm`): the modulation is its affine
map. The siamese norms (post, pre, fx, fy) are the configured norm with parameters and get no conditioning; the
adaLN modulation acts on the shared branch input after LN_in, and the gates scale the shared update, which both
streams receive. c_l = sqrt(2(l+1)). W_out, b_out and every AdaLNModulation start at 0 (adaLN-Zero), so at init
the model predicts eps = 0, every `pre` block is the identity and every siamese block the identity on y and
x -> LN_post2(LN_post1(x)) (the identity on the normalised x that every block after the first receives).
The output is the noise alone (DiT's learn_sigma=False: a fixed variance schedule at sampling).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpt.config import ConfigError, Section, at_least, fail, in_range
from jaxpt.models.blocks import ResidualBlock, depth_scale, depth_scaled
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import DecoderStack
from jaxpt.models.vit import check_bidirectional
from jaxpt.nn.conditioning import AdaLNModulation, LabelEmbedding, TimestepEmbedding, layer_norm, modulate
from jaxpt.nn.dense import Dense
from jaxpt.nn.norms import make_norm
from jaxpt.nn.vision import FixedSinCosPositions, PatchEmbedding, unpatchify
from jaxpt.registry import Registry


@dataclasses.dataclass(frozen=True)
class DiTConfig(Section):
  """What a diffusion transformer adds to the `model` section (the `dit` section). The model section's vocab_size,
  max_seq_len and tie_embeddings are not read by a DiT.

  Attributes:
    image_size: height and width of the (square) images in pixels; the data's images must have it.
    patch_size: side of the square patches each token embeds; must divide image_size.
    channels: colour channels of the images (1 grey, 3 RGB); the data's images must have it.
    num_classes: the classes c conditions on; label num_classes is the null class of classifier-free guidance.
    class_dropout: in training, each label is replaced by the null class with this probability (DiT: 0.1).
    frequency_features: width of the sinusoidal timestep features fed to the timestep MLP (DiT: 256).
  """

  image_size: int = 8
  patch_size: int = 2
  channels: int = 1
  num_classes: int = 10
  class_dropout: float = 0.1
  frequency_features: int = 256

  @property
  def grid(self) -> int:
    """Patches along each side."""
    return self.image_size // self.patch_size

  def check(self) -> None:
    for field in ("image_size", "patch_size", "channels", "num_classes", "frequency_features"):
      at_least(self, field, 1)
    if self.image_size % self.patch_size:
      raise fail(self, "patch_size", f"must divide dit.image_size={self.image_size}")
    in_range(self, "class_dropout", 0.0, 1.0, high_open=True)


class DiTBlock(ResidualBlock):
  """Shared parts of the adaLN-Zero blocks: `(streams, layer_index, condition [batch, d]) -> (streams, None)`."""

  def modulations(self, condition, features: int):
    """(shift_a, scale_a, gate_a, shift_m, scale_m, gate_m), each [batch, features], zero at init."""
    return AdaLNModulation(6, features, self.compute_dtype, jnp.dtype(self.config.param_dtype),
                           name="adaln")(condition)

  def gated_attention(self, h, shift, scale, gate, segment_ids):
    """gate Attn(modulate(LN(h), shift, scale)): the branch update [batch, tokens, d]."""
    a, _ = self.attention(modulate(layer_norm(h, self.config.norm_eps), shift, scale), None, segment_ids, None)
    return gate[:, None] * a

  def gated_mlp(self, h, shift, scale, gate):
    """gate MLP(modulate(LN(h), shift, scale))."""
    return gate[:, None] * self.mlp(modulate(layer_norm(h, self.config.norm_eps), shift, scale))


class DiTPreNormBlock(DiTBlock):

  @nn.compact
  def __call__(self, streams, layer_index, condition, segment_ids=None, cache=None):
    (x,) = streams
    shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.modulations(condition, x.shape[-1])
    x = x + self.gated_attention(x, shift_a, scale_a, gate_a, segment_ids)
    x = x + self.gated_mlp(x, shift_m, scale_m, gate_m)
    return self.constrain((x,)), None


class DiTSiamesePostPreBlock(DiTBlock):

  @nn.compact
  def __call__(self, streams, layer_index, condition, segment_ids=None, cache=None):
    x, y = streams
    c = depth_scale(layer_index)
    shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.modulations(condition, x.shape[-1])
    xh = self.norm("post1")(x)
    a = self.gated_attention(xh + self.norm("pre1")(y), shift_a, scale_a, gate_a, segment_ids)
    x, y = xh + depth_scaled(a, c), y + a
    xh = self.norm("post2")(x)
    m = self.gated_mlp(xh + self.norm("pre2")(y), shift_m, scale_m, gate_m)
    return self.constrain((xh + depth_scaled(m, c), y + m)), None


DIT_BLOCKS: Registry[type[nn.Module]] = Registry("DiT residual scheme")  # ModelConfig.norm_scheme -> DiT block
DIT_BLOCKS.add("pre", DiTPreNormBlock)
DIT_BLOCKS.add("siamese_post_pre", DiTSiamesePostPreBlock)


def check_dit_model(model: ModelConfig, dit: DiTConfig, model_field: str = "config.model") -> None:
  """ConfigError naming the model field a DiT cannot have: a scheme without an adaLN-Zero block, causal attention,
  RoPE, the fused kernel, or a d_model the sin-cos table does not fit."""
  if model.norm_scheme not in DIT_BLOCKS:
    raise ConfigError(f"{model_field}.norm_scheme", f"a DiT has the schemes {', '.join(DIT_BLOCKS.names())}",
                      model.norm_scheme)
  check_bidirectional(model, model_field, "a DiT")
  if model.kernel != "reference":
    raise ConfigError(f"{model_field}.kernel", "a DiT's modulated boundaries have no fused kernel: set it to "
                      "'reference'", model.kernel)
  if model.d_model % 4:
    raise ConfigError(f"{model_field}.d_model", "must be divisible by 4 (a DiT's 2-D sin-cos positions)",
                      model.d_model)


class DiT(nn.Module):
  """(x_t [batch, H, W, channels], t [batch], labels int [batch] in [0, num_classes]) -> predicted noise float32
  [batch, H, W, channels]; see the module doc."""

  config: ModelConfig
  dit: DiTConfig

  @nn.compact
  def __call__(self, images, timesteps, labels, deterministic: bool = True):
    cfg, dit = self.config, self.dit
    dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    tokens = PatchEmbedding(dit.patch_size, cfg.d_model, dtype, param_dtype, name="patch_embed")(images)
    tokens = tokens + FixedSinCosPositions(dtype)(dit.grid, dit.grid, cfg.d_model)[None]
    condition = (TimestepEmbedding(cfg.d_model, dit.frequency_features, dtype, param_dtype, name="t_embed")(timesteps)
                 + LabelEmbedding(dit.num_classes, cfg.d_model, dtype, param_dtype, name="y_embed")(labels))
    streams = (tokens, tokens) if cfg.is_siamese else (tokens,)
    streams = DecoderStack(cfg, deterministic, DIT_BLOCKS, name="blocks")(streams, condition)
    hidden = streams[0]
    if cfg.is_siamese:
      norm = lambda name: make_norm(cfg.norm_type, cfg.norm_eps, dtype, param_dtype, name)
      hidden = norm("final_x_norm")(streams[0]) + norm("final_y_norm")(streams[1])
    shift, scale = AdaLNModulation(2, cfg.d_model, dtype, param_dtype, name="final_adaln")(condition)
    patches = Dense((dit.patch_size ** 2 * dit.channels,), ("embed", "patch"), dtype=dtype, param_dtype=param_dtype,
                    use_bias=True, zero_init=True, name="final_proj")(
                        modulate(layer_norm(hidden, cfg.norm_eps), shift, scale))
    return unpatchify(patches.astype(jnp.float32), dit.patch_size, dit.image_size, dit.image_size)


def drop_labels(labels, rng, probability: float, null_class: int):
  """int [batch] -> the labels with each replaced by `null_class` with `probability` (classifier-free guidance's
  label dropout in training)."""
  if probability <= 0:
    return labels
  return jnp.where(jax.random.uniform(rng, labels.shape) < probability, null_class, labels)


def dummy_inputs(dit: DiTConfig, batch: int = 1) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(zero images [batch, H, W, C], zero timesteps [batch], zero labels [batch]): the init input of `DiT`."""
  images = jnp.zeros((batch, dit.image_size, dit.image_size, dit.channels), jnp.float32)
  return images, jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32)


def init_dit_params(config: ModelConfig, dit: DiTConfig, rng) -> dict:
  """Unboxed float parameters of `DiT(config, dit)`."""
  return nn.meta.unbox(DiT(config, dit).init(rng, *dummy_inputs(dit))["params"])
