"""The mechanism the SiameseNorm paper argues, measured on a model's parameters and one batch: a language model
(`block_gradient_norms`, `stream_norms`) or a ViT (`vit_block_gradient_norms`, `vit_stream_norms`).

- block gradient norms: ||dL/dθ_l||_2 over all parameters θ_l of block l, [num_layers], for the model's
  cross-entropy L (LM: mean over the batch's weighted targets, no z-loss; ViT: mean over the weighted images, no
  label smoothing; no dropout): the gradient reaching each block.
- stream norms: the residual streams' mean token L2 norm, mean_t ||s_t||_2, at the input of the block stack
  (depth 0: the LM's token embeddings; the ViT's patch embeddings + positions, class token first) and after each
  block (depth l + 1), [num_layers + 1, streams] (SiameseNorm: column 0 the Post-Norm-like x, column 1 the
  Pre-Norm-like y). LM: over the batch's weighted tokens; ViT: over every token of every weighted image.
Both work for scanned (`<stack>/layers`, leaves [layers, ...]) and unrolled (`<stack>/layers_{l}`) parameters; the
shared core (`_gradient_norms`, `_stream_norms`) takes the model's loss or forward and the name of its block stack
(`decoder` for the LM, `encoder` for the ViT).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpt.losses import get_loss
from jaxpt.models.blocks import ResidualBlock
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import DecoderStack, TransformerLM, unstack_layers


def _unrolled(config: ModelConfig, params, stack: str = "decoder"):
  if config.scan_layers:  # unstack_layers reads a `decoder` stack
    layers = unstack_layers({"decoder": params[stack]}, config.num_layers)["decoder"]
    return dataclasses.replace(config, scan_layers=False), dict(params, **{stack: layers})
  return config, params


def _gradient_norms(loss_fn: Callable[[Any], jax.Array], params, stack: str, num_layers: int) -> np.ndarray:
  """[num_layers] float64: the L2 norm of d loss_fn / d params over each `params[stack]['layers_{l}']`."""
  grads = jax.jit(jax.grad(loss_fn))(params)[stack]
  return np.array([optax.global_norm(grads[f"layers_{l}"]) for l in range(num_layers)], np.float64)


def _is_block_call(module, method: str) -> bool:
  return method == "__call__" and isinstance(module, ResidualBlock)


def _stream_norms(apply: Callable[..., Any], params, stack: str, num_layers: int, weights) -> np.ndarray:
  """[num_layers + 1, streams] float64: the weighted mean token L2 norm of each stream at the input of the block
  stack and after each block. `apply(p, **kwargs)` runs the model's forward (kwargs: flax's `mutable` and
  `capture_intermediates`); `weights` [batch, tokens] (or [batch], one weight per sequence) weigh the tokens."""

  def forward(p):
    inputs = []

    def stack_input(next_fun, args, kwargs, context):
      if isinstance(context.module, DecoderStack) and context.method_name == "__call__":
        inputs.append(tuple(args[0]))
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(stack_input):
      _, state = apply(p, mutable=["intermediates"], capture_intermediates=_is_block_call)
    blocks = state["intermediates"][stack]
    streams = inputs[:1] + [blocks[f"layers_{l}"]["__call__"][0][0] for l in range(num_layers)]
    return jnp.stack([jnp.stack([jnp.linalg.norm(s.astype(jnp.float32), axis=-1) for s in depth])
                      for depth in streams])

  norms = np.asarray(jax.jit(forward)(params), np.float64)  # [depth, streams, batch, tokens]
  weights = np.asarray(weights, np.float64)
  weights = np.broadcast_to(weights[:, None] if weights.ndim == 1 else weights, norms.shape[2:])
  return (norms * weights).sum(axis=(2, 3)) / weights.sum()


# ------------------------------------------------------------------------------------------- language model


def block_gradient_norms(config: ModelConfig, params, batch: dict) -> np.ndarray:
  """[num_layers] float64: the L2 norm of the LM loss gradient over each block's parameters."""
  config, params = _unrolled(config, params)
  model = TransformerLM(config)
  loss = get_loss("lm", "lm_cross_entropy")

  def loss_fn(p):
    logits = model.apply({"params": p}, batch["inputs"], positions=batch.get("positions"),
                         segment_ids=batch.get("segment_ids"))
    return loss(logits, batch["targets"], batch["weights"], z_loss=0.0)[0]

  return _gradient_norms(loss_fn, params, "decoder", config.num_layers)


def stream_norms(config: ModelConfig, params, batch: dict) -> np.ndarray:
  """[num_layers + 1, streams] float64: mean over the batch's weighted tokens of each stream's L2 norm."""
  config, params = _unrolled(config, params)
  model = TransformerLM(config)
  apply = lambda p, **kwargs: model.apply({"params": p}, batch["inputs"], positions=batch.get("positions"),
                                          segment_ids=batch.get("segment_ids"), **kwargs)
  return _stream_norms(apply, params, "decoder", config.num_layers, batch["weights"])


# ------------------------------------------------------------------------------------------------------ ViT


def vit_block_gradient_norms(config: ModelConfig, vit, params, batch: dict) -> np.ndarray:
  """[num_layers] float64: the L2 norm of the ViT's cross-entropy gradient (no label smoothing) over each block's
  parameters, on `batch` {images, labels, weights}."""
  from jaxpt.models.vit import ViT
  from jaxpt.trainers.vit import make_vit_loss_fn

  config, params = _unrolled(config, params, "encoder")
  loss = make_vit_loss_fn(ViT(config, vit), label_smoothing=0.0, train=False)
  return _gradient_norms(lambda p: loss(p, batch, jax.random.PRNGKey(0))[0], params, "encoder", config.num_layers)


def vit_stream_norms(config: ModelConfig, vit, params, batch: dict) -> np.ndarray:
  """[num_layers + 1, streams] float64: mean over every token (class token included) of the weighted images of
  each stream's L2 norm."""
  from jaxpt.models.vit import ViT

  config, params = _unrolled(config, params, "encoder")
  model = ViT(config, vit)
  apply = lambda p, **kwargs: model.apply({"params": p}, batch["images"], **kwargs)
  return _stream_norms(apply, params, "encoder", config.num_layers, batch["weights"])
