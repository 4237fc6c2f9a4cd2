"""Pre-Norm vs Post-Norm vs HybridNorm vs SiameseNorm LMs, each at its own validation-tuned learning rate.

Three phases (`experiments.toolkit.lm_comparison`), each a grid of `jaxpt.train("pretrain", ...)` runs (same steps,
batch, tokens, width; `config.py`), on tiny Shakespeare:

1. tune:  every scheme x lr in LRS x the tuning seeds (100, 101). Each scheme's lr is the one with the lowest
          mean final *validation* loss; the test rows are not looked at.
2. final: every scheme at its tuned lr x the reported seeds (0..7, disjoint from the tuning seeds). Reported:
          final *test* loss; paired per-seed statistics (same seed = same data order and init seed) of each scheme
          against Pre-Norm and of each SiameseNorm variant against HybridNorm, with `experiments.toolkit.stats`.
3. depth: every scheme at its tuned lr (tuned at 6 layers) at 2 and 12 layers, seed 0; with the 6-layer final runs:
          the gradient norm reaching each block and the residual-stream norm by depth, at init and after training
          (`experiments.toolkit.probes`, on the first validation batch).

  python experiments/siamese_vs_prenorm/run.py [--workdir /tmp/siamese_vs_prenorm] [--jobs 2] [--out DIR]
  python experiments/siamese_vs_prenorm/run.py --phases tune --methods pre,post --set steps=400
  python experiments/siamese_vs_prenorm/run.py --report-only --out experiments/siamese_vs_prenorm/results --overwrite

Runs live in `WORKDIR/<phase>/<scheme>/...` (resumable: a finished run is kept; a workdir made with other --set
values is refused). Results (results.md/.json, plots, each reported run's metrics.jsonl) go to --out, default
WORKDIR/results; the committed ones are in `results/` next to this file and are only replaced with --overwrite.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.toolkit import lm_comparison  # noqa: E402

SIAMESE = ("siamese_post_pre", "siamese_hybrid_pre")
SCHEMES = ("pre", "post", "hybrid") + SIAMESE
EXPERIMENT = lm_comparison.Experiment(
    doc=__doc__, here=HERE, config="experiments.siamese_vs_prenorm.config",
    title="SiameseNorm vs Pre/Post/HybridNorm (tiny Shakespeare, CPU)", schemes=SCHEMES,
    comparisons=lambda schemes: tuple((s, "pre") for s in schemes if s != "pre") + tuple(
        (s, "hybrid") for s in SIAMESE),
    lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1), tune_seeds=(100, 101), seeds=tuple(range(8)), depths=(2, 12),
    corpus=os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "tinyshakespeare")),
    workdir="/tmp/siamese_vs_prenorm")


if __name__ == "__main__":
  lm_comparison.main(EXPERIMENT)
