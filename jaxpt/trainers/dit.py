"""Class-conditional diffusion with a DiT (`jaxpt dit`): run config -> image data -> DiT -> the shared builder, step and
loop (orbax checkpoints, bitwise resume, the run record, metrics, the mesh).

    batch  {images x0 [B, H, W, C] in [-1, 1], labels [B], weights [B]}     (jaxpt.data.images, as for the ViT)
    step   t ~ U{0 .. T-1}, eps ~ N(0, I), y <- null with prob. dit.class_dropout, all from the step's key
           x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps                  (jaxpt.losses.noise_schedule, linear betas)
           loss = mean ||eps - DiT(x_t, t, y)||^2                         (jaxpt.losses.diffusion)
    eval   eval_loss on the test split, eval_val_loss on the validation split: the same loss with t and eps drawn
           from fixed keys (one per eval batch) and no label dropout, so every eval of a run reads the same draws;
           with fid.classifier, eval_fid: the FID-style distance between fid.num_samples images drawn as the
           `sample` section says (a fixed key) and the test split (`jaxpt.trainers.fid`: features of an in-repo ViT),
           and eval_val_fid: the same samples against the validation split (when the data has one)

No EMA of the weights is kept: samples and evals use the trained weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxpt.config import ConfigError, at_least, from_section
from jaxpt.data.images import ImageData, ImageDataConfig, splits_of
from jaxpt.losses.diffusion import diffusion_loss
from jaxpt.losses.noise_schedule import NoiseSchedule
from jaxpt.models import hf
from jaxpt.models.dit import DiT, DiTConfig, check_dit_model, drop_labels, dummy_inputs
from jaxpt.models.dit_sampler import SamplerConfig, make_sampler
from jaxpt.engine.config import RunConfig
from jaxpt.trainers.fid import ClassifierFeatures, FIDConfig, make_fid
from jaxpt.engine.run import BuiltRun
from jaxpt.engine.state import TrainState
from jaxpt.engine.step import LossFn
from jaxpt.trainers.images import EVAL_PREFIXES, build_image_run, split_means_evaluator

EVAL_KEY = 0  # eval batch i draws its timesteps and noise from fold_in(PRNGKey(EVAL_KEY), i)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiTRunConfig(RunConfig):
  """A class-conditional diffusion run: `RunConfig` plus these sections. The model section must set causal=False,
  rope=False and norm_scheme pre or siamese_post_pre (see `jaxpt.models.dit`).

  Attributes:
    dit: the image and conditioning fields of the model (image size, patch size, classes, label dropout).
    data: the image set and the batch (images scaled to [-1, 1]); set data.crop_padding=0 to train on the images
      as they are.
    num_timesteps: T, the diffusion steps of the linear noise schedule (betas 1e-4 .. 0.02 at T = 1000).
    sample: how images are drawn from the trained model (steps, eta, classifier-free guidance scale).
    fid: the FID-style metric of the eval (a `jaxpt vit` run's features; off by default).
    init_from: '' = random init; a jaxpt DiT run's workdir whose latest checkpoint's params start this run (not
      'hf:DIR': a Hugging Face LM does not start a DiT).
  """

  dit: DiTConfig = DiTConfig()
  data: ImageDataConfig = ImageDataConfig()
  num_timesteps: int = 1000
  sample: SamplerConfig = SamplerConfig()
  fid: FIDConfig = FIDConfig()

  def check(self) -> None:
    if self.init_from.startswith(hf.HF_PREFIX):
      raise ConfigError("init_from", "a DiT starts from random init or a jaxpt DiT run, not a Hugging Face LM",
                        self.init_from)
    super().check()
    check_dit_model(self.model, self.dit, "model")
    at_least(self, "num_timesteps", 2)
    self.check_batch_split(self.data.batch_size, "config.data.batch_size")

  @property
  def schedule(self) -> NoiseSchedule:
    return NoiseSchedule.linear(self.num_timesteps)


def make_dit_loss_fn(model: DiT, schedule: NoiseSchedule, train: bool = True) -> LossFn:
  """loss_fn(params, batch, rng) -> (loss, metrics) of `diffusion_loss` at timesteps, noise and label dropout drawn
  from rng (see the module doc); no label dropout and no dropout when not `train`."""
  use_dropout = train and model.config.dropout_rate > 0
  class_dropout = model.dit.class_dropout if train else 0.0

  def loss_fn(params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
    time_key, noise_key, label_key, dropout_key = jax.random.split(rng, 4)
    images = batch["images"].astype(jnp.float32)
    timesteps = jax.random.randint(time_key, images.shape[:1], 0, schedule.num_timesteps)
    noise = jax.random.normal(noise_key, images.shape, jnp.float32)
    labels = drop_labels(batch["labels"], label_key, class_dropout, model.dit.num_classes)
    predicted = model.apply({"params": params}, schedule.q_sample(images, timesteps, noise), timesteps, labels,
                            deterministic=not use_dropout, rngs={"dropout": dropout_key} if use_dropout else None)
    return diffusion_loss(predicted, noise, batch["weights"])

  return loss_fn


def make_dit_evaluator(model: DiT, schedule: NoiseSchedule, data: ImageData,
                       put: Callable[[dict], dict]) -> Callable[[TrainState], dict]:
  """evaluate(state) -> {eval_loss (test split), eval_val_loss (validation, when the data has one)}: the diffusion
  loss, example-weighted over each whole split, with fixed draws (see the module doc)."""
  loss_fn = make_dit_loss_fn(model, schedule, train=False)

  @jax.jit
  def sums(params: Any, batch: dict, index: jax.Array) -> jax.Array:
    loss, metrics = loss_fn(params, batch, jax.random.fold_in(jax.random.PRNGKey(EVAL_KEY), index))
    return jnp.stack([metrics["num_examples"] * loss, metrics["num_examples"]])

  return split_means_evaluator(sums, ("loss",), data, put)


def make_dit_sampler(config: DiTRunConfig, model: DiT) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
  """sample(params, labels int [batch], key) -> images float32 [batch, H, W, C] as `config.sample` says (DDIM steps,
  eta, classifier-free guidance with the null class, clipping; `jaxpt.models.dit_sampler`)."""
  dit, sample = config.dit, config.sample
  eps_fn = lambda params, x, t, labels: model.apply({"params": params}, x, t, labels)
  return make_sampler(eps_fn, config.schedule, (dit.image_size, dit.image_size, dit.channels), sample.num_steps,
                      sample.eta, sample.guidance_scale, dit.num_classes, sample.clip_x0)


def build(config: DiTRunConfig | Any, workdir: str) -> BuiltRun:
  """Checks `config` (a DiTRunConfig or a ConfigDict; ConfigError naming the field), then builds data, model,
  optimizer, the compiled step and the evaluator. The mesh comes from `config.mesh`."""
  config = from_section(DiTRunConfig, config, "config")
  model = DiT(config.model, config.dit)
  classifier = None
  if config.fid.classifier:
    classifier = ClassifierFeatures.from_run(config.fid.classifier)
    classifier.check_images(config.dit.image_size, config.dit.channels)

  def make_evaluator(data: ImageData, put: Callable[[dict], dict]) -> Callable[[TrainState], dict]:
    evaluate = make_dit_evaluator(model, config.schedule, data, put)
    if classifier is None:
      return evaluate
    real = {f"{EVAL_PREFIXES[split]}_fid": data.split_images(split) for split in splits_of(data)}
    fid = make_fid(classifier, real, make_dit_sampler(config, model), config.dit.num_classes, config.fid.num_samples,
                   jax.random.PRNGKey(EVAL_KEY))
    return lambda state: {**evaluate(state), **fid(state.params)}

  return build_image_run("dit", config, workdir, model, dummy_inputs(config.dit),
                         make_dit_loss_fn(model, config.schedule), make_evaluator)
