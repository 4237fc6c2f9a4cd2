"""Pre-Norm vs Post-Norm vs SiameseNorm ViT classifiers on the 8x8 digits, each at its own validation-tuned lr.

Two phases (`experiments.toolkit.image_comparison`), each a grid of `jaxpt vit` runs of
`experiments/configs/vit_digits.py` (d_model 64, 4 layers, 2x2 patches, class token, 600 steps of batch 64,
label smoothing 0.1) that differ only in model.norm_scheme, optim.learning_rate and seed; evals every 100 steps:

1. tune:  pre, post, siamese_post_pre x lr in LRS x the tuning seeds (100, 101). Each scheme's lr is the one with
          the highest mean final *validation* top-1 (eval_val_top1: the digits' 10% validation split); the test
          split is not looked at.
2. final: every scheme at its tuned lr x the reported seeds (0..7, disjoint from the tuning seeds). Reported:
          final *test* top-1 (the 20% test split); paired per-seed differences (Post-Norm and SiameseNorm against
          Pre-Norm, SiameseNorm against Post-Norm); train loss and validation top-1 over training; for seed 0 the
          gradient norm reaching each block and the residual-stream norm by depth, at init and after training
          (`experiments.toolkit.probes`, first validation batch).

  python experiments/siamese_vit/run.py [--workdir /tmp/siamese_vit] [--jobs 1] [--out DIR]
  python experiments/siamese_vit/run.py --report-only --out experiments/siamese_vit/results --overwrite

Accelerator-scale rerun (CIFAR-10 prepared once with `tfds build cifar10 --file_format=array_record`; the fields of
`experiments/configs/vit_digits.py`'s docstring), e.g. a DeiT-T-sized ViT on CIFAR-10:

  python experiments/siamese_vit/run.py --workdir /tmp/siamese_vit_cifar --jobs 1 --lrs 3e-4,1e-3,3e-3 \
      --set data.source=tfds:cifar10 --set data.flip=True --set data.crop_padding=4 --set vit.image_size=32 \
      --set vit.patch_size=4 --set vit.channels=3 --set model.d_model=192 --set model.num_layers=12 \
      --set model.num_heads=3 --set model.num_kv_heads=3 --set model.mlp_dim=768 --set data.batch_size=256 \
      --set steps=20000 --set eval_every=1000 --set optim.warmup_steps=1000

(ImageNet, DeiT-T: data.source=tfds:imagenet2012, vit.image_size=224, vit.patch_size=16, vit.num_classes=1000,
label_smoothing=0.1.) CIFAR-10 in TFDS has train and test only and ImageNet train and validation (used as test), so
neither has a validation split (`jaxpt.data.images`) and eval_val_top1 is absent (NaN): pass a single --lrs (no
tuning) or give the data a validation split first; selecting on the reported split is what this experiment must
not do.

Runs live in `WORKDIR/<phase>/<scheme>/lr<lr>/seed<seed>` (resumable: a finished run is kept; a workdir made with
other --set values is refused). Results go to --out, default WORKDIR/results; the committed ones are in `results/`
next to this file and are only replaced with --overwrite.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.toolkit import image_comparison  # noqa: E402

EXPERIMENT = image_comparison.Experiment(
    doc=__doc__, here=HERE, kind="vit", config="experiments.siamese_vit.config",
    title="SiameseNorm vs Pre/Post-Norm ViT (8x8 digits, CPU)", schemes=("pre", "post", "siamese_post_pre"),
    comparisons=(("post", "pre"), ("siamese_post_pre", "pre"), ("siamese_post_pre", "post")),
    lrs=(1e-3, 3e-3, 1e-2), tune_seeds=(100, 101), seeds=tuple(range(8)),
    metric=image_comparison.Metric(key="top1", label="top-1 accuracy", higher_is_better=True),
    curves=(("loss", "train loss (smoothed CE)"), ("eval_val_top1", "validation top-1")),
    workdir="/tmp/siamese_vit",
    how_n_fixed="not by a power analysis, and not in advance: seeds 0-2 were run first and seeds 3-7 added after "
                "their table had been seen (optional stopping, disclosed in the discussion; issue 31 item 2)")


if __name__ == "__main__":
  image_comparison.main(EXPERIMENT)
