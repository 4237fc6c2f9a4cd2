"""What the image trainers (ViT, DiT) share: the data check against the model's image section, the evaluator over
each held-out split, and the build of an image run on the shared builder.

    build_image_run("vit", config, workdir, model, init_args, loss_fn, make_evaluator) -> BuiltRun
    split_means_evaluator(sums, names, data, put)(state) -> {eval_<name> (test), eval_val_<name> (validation)}
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from jaxpt.config import ConfigError
from jaxpt.data.images import ImageData, splits_of
from jaxpt.engine.builder import batch_shapes, build_training, training_mesh
from jaxpt.engine.config import RunConfig
from jaxpt.engine.record import check_launch, digest
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import LossFn
from jaxpt.progress import say

EVAL_PREFIXES = {"test": "eval", "validation": "eval_val"}  # split -> metric prefix


def check_data(vit: Any, data: ImageData, section: str = "config.vit") -> None:
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


def build_image_run(trainer: str, config: RunConfig | Any, workdir: str, model: nn.Module, init_args: tuple,
                    loss_fn: LossFn, make_evaluator: Callable[[ImageData, Callable[[dict], dict]], Any]) -> BuiltRun:
  """The run of image trainer `trainer` ('vit' or 'dit', also the config section holding image_size, channels and
  num_classes) for a checked run `config`: the mesh, the launch check, the image data (checked against that
  section), the compiled step of `loss_fn`, and `make_evaluator(data, put)` under the mesh's rules."""
  mesh = training_mesh(config, config.data.batch_size)
  check_launch(workdir, config)
  say("loading the images ...")
  images = getattr(config, trainer)
  data = ImageData.create(config.data, seed=config.seed, image_size=images.image_size)
  check_data(images, data, f"config.{trainer}")
  say("compiling the train step ...")
  training = build_training(config, mesh, model, init_args, batch_shapes(data.train_batch(0), config.data.batch_size),
                            loss_fn=loss_fn, weight_key="num_examples")
  return BuiltRun(trainer, config, training, training.batches(data.train_batch, config.data.batch_size),
                  inputs={"images": digest(data.identity)}, data=data,
                  evaluate=training.under_rules(make_evaluator(data, training.put)))
