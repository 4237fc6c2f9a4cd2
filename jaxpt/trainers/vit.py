"""Image classification with a ViT (`jaxpt vit`): run config -> image data -> ViT -> the shared builder, step and
loop (orbax checkpoints, bitwise resume, the run record, metrics, the mesh).

    batch {images [B, H, W, C] in [-1, 1], labels [B], weights [B]}  (jaxpt.data.images: augmented by step)
    loss  = softmax cross-entropy of ViT(images) (label smoothing optional; jaxpt.losses.classification)
    eval  = eval_top1 / eval_loss on the test split, eval_val_top1 / eval_val_loss on the validation split
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import numpy as np

from jaxpt.config import ConfigError, from_section, in_range
from jaxpt.data.images import ImageData, ImageDataConfig, splits_of
from jaxpt.losses.classification import softmax_cross_entropy
from jaxpt.models import hf
from jaxpt.models.vit import ViT, ViTConfig, check_vit_model, dummy_images
from jaxpt.progress import say
from jaxpt.engine.builder import Training, batch_shapes, build_training, training_mesh
from jaxpt.engine.config import RunConfig
from jaxpt.engine.loop import LoopResult, print_summary
from jaxpt.engine.record import check_launch, digest, record_launch
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import LossFn

EVAL_PREFIXES = {"test": "eval", "validation": "eval_val"}  # split -> metric prefix


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTRunConfig(RunConfig):
  """An image-classification run: `RunConfig` plus these sections. The model section must set causal=False and
  rope=False (see `jaxpt.models.vit`).

  Attributes:
    vit: the image fields of the model (image size, patch size, classes, pooling, position embedding).
    data: the image set, the batch and the augmentation.
    label_smoothing: the share s of each target spread over all classes: q = (1 - s) onehot + s / K.
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


def check_data(vit: ViTConfig | Any, data: ImageData, section: str = "config.vit") -> None:
  """ConfigError naming the field of the image section (`vit`, or DiT's `dit`: image_size, channels, num_classes)
  that does not fit the data's images or labels."""
  height, width, channels = data.image_shape
  source = data.config.source
  if (height, width) != (vit.image_size, vit.image_size):
    raise ConfigError(f"{section}.image_size", f"the data set {source!r} has {height}x{width} images",
                      vit.image_size)
  if channels != vit.channels:
    raise ConfigError(f"{section}.channels", f"the data set {source!r} has {channels} channels", vit.channels)
  if data.num_classes > vit.num_classes:
    raise ConfigError(f"{section}.num_classes", f"the data set {source!r} has {data.num_classes} classes",
                      vit.num_classes)


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


def split_means_evaluator(sums: Callable[[Any, dict, jax.Array], jax.Array], names: tuple[str, ...], data: ImageData,
                          put: Callable[[dict], dict]) -> Callable[[TrainState], dict]:
  """evaluate(state) -> {<prefix>_<name>}: for each held-out split (prefix `eval` for test, `eval_val` for
  validation), the example-weighted means sum_batches(n m) / sum_batches(n) of the metrics that
  `sums(params, batch, batch_index) -> [n m_1, ..., n m_k, n]` returns, batches streamed from the host."""

  def evaluate(state: TrainState) -> dict:
    row = {}
    for split in splits_of(data):
      total = np.zeros(len(names) + 1, np.float64)
      for index, batch in enumerate(data.eval_batches(split)):
        total += np.asarray(jax.device_get(sums(state.params, put(batch), index)), np.float64)
      row.update({f"{EVAL_PREFIXES[split]}_{name}": value / max(total[-1], 1.0) for name, value in zip(names, total)})
    return row

  return evaluate


@dataclasses.dataclass
class ImageTraining:
  """An image run (ViT or DiT) built once: `training` holds the compiled step and can serve several runs."""

  config: RunConfig
  training: Training
  data: ImageData
  batches: Callable[[int], Iterator[dict]]
  evaluate: Callable[[TrainState], dict]

  @property
  def inputs(self) -> dict[str, str]:
    """The run record's inputs: a digest of the image set's identity."""
    return {"images": digest(self.data.identity)}

  def train(self, workdir: str, stop_at: int | None = None) -> LoopResult:
    """Trains (or resumes) the run in `workdir`, recording the launch once its checkpoint restored; the result."""
    return self.training.run(self.batches, workdir, self.evaluate, stop_at,
                             record=lambda: record_launch(workdir, self.config, self.inputs))


def build_image_training(config: RunConfig | Any, workdir: str, section: str, model: nn.Module, init_args: tuple,
                         loss_fn: LossFn, make_evaluator: Callable[[ImageData, Callable[[dict], dict]], Any]
                         ) -> ImageTraining:
  """The shared part of `build_vit` / `jaxpt.trainers.dit.build_dit` for a checked run `config`: the mesh, the launch
  check, the image data (checked against the `section` of the config, `vit` or `dit`: image_size, channels,
  num_classes), the compiled step of `loss_fn` and `make_evaluator(data, put)` under the mesh's rules."""
  mesh = training_mesh(config, config.data.batch_size)
  check_launch(workdir, config)
  say("loading the images ...")
  images = getattr(config, section)
  data = ImageData.create(config.data, seed=config.seed, image_size=images.image_size)
  check_data(images, data, f"config.{section}")
  say("compiling the train step ...")
  training = build_training(config, mesh, model, init_args, batch_shapes(data.train_batch(0), config.data.batch_size),
                            loss_fn=loss_fn, weight_key="num_examples")
  evaluate = training.under_rules(make_evaluator(data, training.put))
  return ImageTraining(config=config, training=training, data=data,
                       batches=training.batches(data.train_batch, config.data.batch_size), evaluate=evaluate)


def build_vit(config: ViTRunConfig | Any, workdir: str) -> ImageTraining:
  """Checks `config` (a ViTRunConfig or a ConfigDict; ConfigError naming the field), then builds data, model,
  optimizer, the compiled step and the evaluator. The mesh comes from `config.mesh`."""
  config = from_section(ViTRunConfig, config, "config")
  model = ViT(config.model, config.vit)
  return build_image_training(config, workdir, "vit", model, (dummy_images(config.vit),),
                              make_vit_loss_fn(model, config.label_smoothing),
                              lambda data, put: make_vit_evaluator(model, data, put))


def train_vit(config: ViTRunConfig | Any, workdir: str, *, setup: ImageTraining | None = None,
              stop_at: int | None = None) -> LoopResult:
  """Trains (or resumes) the ViT run in `workdir`; returns the loop's result. `setup` reuses compiled functions."""
  return (setup or build_vit(config, workdir)).train(workdir, stop_at)


def run_vit(config: ViTRunConfig, workdir: str) -> int:
  """`jaxpt vit`: builds, prints the mesh and memory, trains, prints one summary line; the exit code."""
  setup = build_vit(config, workdir)
  print(setup.training.describe("vit"), flush=True)
  return print_summary("vit", train_vit(config, workdir, setup=setup), workdir,
                       ("loss", "eval_loss", "eval_top1", "eval_val_top1"))
