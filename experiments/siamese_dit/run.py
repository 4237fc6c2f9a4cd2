"""Pre-Norm vs SiameseNorm class-conditional DiTs on the 8x8 digits, each at its own validation-tuned lr, scored by
an FID-style metric (the features of an in-repo ViT classifier; not comparable to published FIDs).

Three steps (`experiments.toolkit.image_comparison`), `jaxpt dit` runs of `config.py` (d_model 64, 2 layers, 1500
steps of batch 64, DDIM sampling with 50 steps and guidance 1.5) that differ only in model.norm_scheme,
optim.learning_rate and seed:

0. classifier: one `jaxpt vit` run (`experiments/configs/vit_digits.py`, Pre-Norm, seed 0) in WORKDIR/classifier;
          every DiT run's metric uses its pooled features (`jaxpt.trainers.fid`).
1. tune:  pre, siamese_post_pre x lr in LRS x the tuning seeds (100, 101). Each eval (every 250 steps) draws one
          set of 500 images (labels cycling through the classes, a fixed key) and scores it against the test split
          (eval_fid) and the validation split (eval_val_fid); each scheme's lr is the one with the lowest mean final
          eval_val_fid. The test split is not looked at.
2. final: every scheme at its tuned lr x the reported seeds (0..7). Reported: the final test FID-style metric;
          paired per-seed differences against Pre-Norm; both metrics over training; seed 0's samples (one row per
          class, both schemes, the same sampling key).

  python experiments/siamese_dit/run.py [--workdir /tmp/siamese_dit] [--jobs 1] [--out DIR]
  python experiments/siamese_dit/run.py --report-only --out experiments/siamese_dit/results --overwrite

Accelerator-scale rerun (CIFAR-10 prepared once with `tfds build cifar10 --file_format=array_record`; the fields of
`experiments/configs/dit_digits.py`'s and `vit_digits.py`'s docstrings), e.g. DiT-B/4 on 32x32 CIFAR-10 pixels with
a CIFAR-10 ViT as the feature classifier:

  python experiments/siamese_dit/run.py --workdir /tmp/siamese_dit_cifar --jobs 1 --lrs 3e-5,1e-4,3e-4 \
      --set data.source=tfds:cifar10 --set data.flip=True --set dit.image_size=32 --set dit.patch_size=4 \
      --set dit.channels=3 --set model.d_model=768 --set model.num_layers=12 --set model.num_heads=12 \
      --set model.num_kv_heads=12 --set model.mlp_dim=3072 --set data.batch_size=256 --set steps=100000 \
      --set eval_every=10000 --set fid.num_samples=10000 \
      --classifier-set data.source=tfds:cifar10 --classifier-set vit.image_size=32 --classifier-set vit.patch_size=4 \
      --classifier-set vit.channels=3 --classifier-set data.flip=True --classifier-set data.crop_padding=4 \
      --classifier-set steps=20000

CIFAR-10 in TFDS has train and test only, so there is no validation split (`jaxpt.data.images`) and eval_val_fid
is absent (NaN): pass a single --lrs (no tuning) or give the data a validation split first; selecting on test is
what this experiment must not do.

Runs live in `WORKDIR/<phase>/<scheme>/lr<lr>/seed<seed>` (resumable: a finished run is kept; a workdir made with
other --set or --classifier-set values is refused). Results go to --out, default WORKDIR/results; the committed
ones are in `results/` next to this file and are only replaced with --overwrite.
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
    doc=__doc__, here=HERE, kind="dit", config="experiments.siamese_dit.config",
    title="SiameseNorm vs Pre-Norm DiT (8x8 digits, FID-style metric, CPU)", schemes=("pre", "siamese_post_pre"),
    comparisons=(("siamese_post_pre", "pre"),), lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2), tune_seeds=(100, 101),
    seeds=tuple(range(8)),
    metric=image_comparison.Metric(key="fid", label="FID-style distance", higher_is_better=False),
    curves=(("eval_val_fid", "validation FID-style"), ("eval_fid", "test FID-style")),
    workdir="/tmp/siamese_dit", classifier_config="experiments.configs.vit_digits")


if __name__ == "__main__":
  image_comparison.main(EXPERIMENT)
