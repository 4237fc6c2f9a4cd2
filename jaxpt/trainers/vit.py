"""Image classification with a ViT (`jaxpt vit`): run config -> image data -> ViT -> the shared builder, step and
loop (orbax checkpoints, bitwise resume, the run record, metrics, the mesh).

    batch {images [B, H, W, C] in [-1, 1], labels [B], weights [B]}  (jaxpt.data.images: augmented by step)
    loss  = softmax cross-entropy of ViT(images) (label smoothing optional; jaxpt.losses.classification)
    eval  = eval_top1 / eval_loss on the test split, eval_val_top1 / eval_val_loss on the validation split
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxpt.config import ConfigError, from_section, in_range
from jaxpt.data.images import ImageData, ImageDataConfig
from jaxpt.losses.classification import softmax_cross_entropy
from jaxpt.models import hf
from jaxpt.models.vit import ViT, ViTConfig, check_vit_model, dummy_images
from jaxpt.engine.config import RunConfig
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import LossFn
from jaxpt.trainers.images import build_image_run, split_means_evaluator

@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTRunConfig(RunConfig):
  """An image-classification run: `RunConfig` plus these sections. The model section must set causal=False and
  rope=False (see `jaxpt.models.vit`).

  Attributes:
    vit: the image fields of the model (image size, patch size, classes, pooling, position embedding).
    data: the image set, the batch and the augmentation.
    label_smoothing: the share s of each target spread over all classes: q = (1 - s) onehot + s / K.
    init_from: '' = random init; a jaxpt ViT run's workdir whose latest checkpoint's params start this run (not
      'hf:DIR': a Hugging Face LM does not start a ViT).
  """

  vit: ViTConfig = ViTConfig()
  data: ImageDataConfig = ImageDataConfig()
  label_smoothing: float = 0.0

  def check(self) -> None:
    if self.init_from.startswith(hf.HF_PREFIX):
      raise ConfigError("init_from", "a ViT starts from random init or a jaxpt ViT run, not a Hugging Face LM",
                        self.init_from)
    super().check()
    check_vit_model(self.model, self.vit, "model", "vit")
    in_range(self, "label_smoothing", 0.0, 1.0, high_open=True)
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")


def make_vit_loss_fn(model: ViT, label_smoothing: float = 0.0, train: bool = True) -> LossFn:
  """loss_fn(params, batch, rng) -> (loss, metrics) of `softmax_cross_entropy`; dropout on iff training a model
  with dropout_rate > 0."""
  use_rng = train and model.config.dropout_rate > 0

  def loss_fn(params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
    logits = model.apply({"params": params}, batch["images"], deterministic=not use_rng,
                         rngs={"dropout": rng} if use_rng else None)
    return softmax_cross_entropy(logits, batch["labels"], batch["weights"], label_smoothing)

  return loss_fn


def make_vit_evaluator(model: ViT, data: ImageData, put: Callable[[dict], dict]) -> Callable[[TrainState], dict]:
  """evaluate(state) -> {eval_top1, eval_loss (test split), eval_val_top1, eval_val_loss (validation, when the data
  has one)}: example-weighted over each whole split (unsmoothed cross-entropy), batches streamed from the host."""
  loss_fn = make_vit_loss_fn(model, train=False)

  @jax.jit
  def sums(params: Any, batch: dict, index: jax.Array) -> jax.Array:
    _, metrics = loss_fn(params, batch, jax.random.PRNGKey(0))
    n = metrics["num_examples"]
    return jax.numpy.stack([n * metrics["nll"], n * metrics["accuracy"], n])

  return split_means_evaluator(sums, ("loss", "top1"), data, put)


def build(config: ViTRunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (a ViTRunConfig or a ConfigDict; ConfigError naming the field), then builds data, model,
  optimizer, the compiled step and the evaluator. The mesh comes from `config.mesh`."""
  config = from_section(ViTRunConfig, config, "config")
  model = ViT(config.model, config.vit)
  return build_image_run("vit", config, workdir, model, (dummy_images(config.vit),),
                         make_vit_loss_fn(model, config.label_smoothing),
                         lambda data, put: make_vit_evaluator(model, data, put))
