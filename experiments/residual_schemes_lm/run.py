"""Every residual scheme in one code base as a language model: Pre/Post/HybridNorm, both SiameseNorm variants,
Hyper-Connections and mHC-lite with 2 and 4 streams; dense, and MoE for Pre-Norm and SiameseNorm.

The protocol of `experiments.toolkit.lm_comparison`: each scheme's lr tuned on validation (tuning seed 100, lrs
1e-3..1e-1), then 3 reported seeds at that lr, test loss, and per-seed paired differences against Pre-Norm with the
same MLP (dense or MoE), of each SiameseNorm variant against each multi-stream scheme, and of MoE against dense; the
mechanism the SiameseNorm paper argues (gradient norm reaching each block, residual-stream norm by depth, every
stream) at init and after training, seed 0 of each scheme at 6 layers and at DEPTHS (lr tuned at 6 layers). Step
time and peak memory per scheme: `python -m benchmarks.train_step --schemes pre,hc:4,mhc_lite:4,pre+moe,...`.

CPU scale (what the committed results ran): the config of `experiments/siamese_vs_prenorm` (6 layers of d_model 64,
200 steps, tiny Shakespeare), so the five single-stream schemes' runs there are the same computation (same config
digest, corpus, names and seeds) and may be reused: link `WORKDIR/{tune,final,depth12}/<scheme>` to that
experiment's workdir before running (`results.md` says which runs were trained where).

  python experiments/residual_schemes_lm/run.py [--workdir /tmp/residual_schemes_lm] [--jobs 2] [--out DIR]
  python experiments/residual_schemes_lm/run.py --methods pre,hc:4,siamese_post_pre --seeds 0,1,2
  # the issue's full design at accelerator scale: every scheme dense and MoE, at 6 and 24 layers, 2 tuning seeds:
  #   --methods pre,post,...,mhc_lite:4,pre+moe,...,pre@24,...,mhc_lite:4+moe@24 --tune-seeds 100,101
  #   --set model.d_model=1024 --set model.num_heads=16 --set model.num_kv_heads=16 --set model.mlp_dim=4096
  #   --set data.batch_size=256 --set data.seq_len=1024 --set model.max_seq_len=1024 --set steps=20000
  #   --corpus '' --set data.tfds_name=lm1b
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from experiments.toolkit import lm_comparison  # noqa: E402

SINGLE = ("pre", "post", "hybrid", "siamese_post_pre", "siamese_hybrid_pre")
SIAMESE = SINGLE[3:]
MULTI = ("hc:2", "hc:4", "mhc_lite:2", "mhc_lite:4")
MOE = ("pre+moe", "siamese_post_pre+moe")
SCHEMES = SINGLE + MULTI + MOE
DEPTHS = (12,)


def comparisons(schemes=SCHEMES) -> tuple[tuple[str, str], ...]:
  """Each scheme against Pre-Norm with the same MLP and depth, each SiameseNorm variant against each multi-stream
  scheme, and each MoE scheme against its dense self (`norm_scheme[:n][+moe][@layers]`; any depths given)."""
  def pre_of(scheme: str) -> str:
    parsed = lm_comparison.parse_scheme(scheme)
    return "pre" + ("+moe" if parsed["moe"] else "") + (f"@{parsed['num_layers']}" if "num_layers" in parsed else "")

  pairs = [(s, pre_of(s)) for s in schemes if s != pre_of(s)]
  pairs += [(s, m) for s in schemes for m in schemes
            if s.split("@")[0] in SIAMESE and m.split(":")[0] in ("hc", "mhc_lite", "mhc", "hc_dynamic")
            and ("+moe" in s) == ("+moe" in m) and s.partition("@")[2] == m.partition("@")[2]]
  pairs += [(s, s.replace("+moe", "")) for s in schemes if "+moe" in s and s.replace("+moe", "") in schemes]
  return tuple(dict.fromkeys(pairs))


EXPERIMENT = lm_comparison.Experiment(
    doc=__doc__, here=HERE, config="experiments.residual_schemes_lm.config",
    title="Residual schemes as LMs: Pre/Post/HybridNorm, SiameseNorm, HC, mHC-lite; dense and MoE (CPU)",
    schemes=SCHEMES, comparisons=comparisons, lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1), tune_seeds=(100,),
    seeds=(0, 1, 2), depths=DEPTHS,
    corpus=os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "tinyshakespeare")),
    workdir="/tmp/residual_schemes_lm")


if __name__ == "__main__":
  lm_comparison.main(EXPERIMENT)
