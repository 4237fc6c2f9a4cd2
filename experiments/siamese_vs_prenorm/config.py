"""Pre-Norm vs Post-Norm vs SiameseNorm: the shared run config of the grid in `run.py`.

A 6-layer model (deeper than `tiny`, so that where the norms sit matters) sized so that the 48-run grid fits in
~40 minutes on 2 CPU cores. `run.py` sets `model.norm_scheme`, `optim.learning_rate`, `seed` and `data.path`
per run; everything else (steps, batch, tokens, width, depth) is the same for every run.

  jaxpt pretrain --config experiments/siamese_vs_prenorm/config.py --workdir /tmp/one_run \
      --config.model.norm_scheme=siamese_post_pre
"""

from jaxpt.config import config_dict
from jaxpt.train.pretrain import PretrainRunConfig

STEPS = 200
# Probed on tiny Shakespeare, seed 0, before the grid (final eval loss): 200 steps, 1e-3: pre 5.63, post 5.64;
# 3e-3: pre 5.18, post 5.68. 300 steps, 1e-2: pre 4.56, post 5.90; 3e-2: pre 4.66, post 5.90 (unigram loss 5.90).
# So: normal = 3e-3, the library's default (experiments/configs/tiny.py); high = 3e-2, above the best Pre-Norm lr
# of the probe (1e-2) but still trainable for Pre-Norm, while Post-Norm stalls at the unigram loss.
NORMAL_LR = 3e-3
HIGH_LR = 3e-2


def get_config():
  return config_dict(
      PretrainRunConfig, steps=STEPS, log_every=10, eval_every=25,
      checkpoint_every=STEPS,  # one checkpoint, at the end (marks the run as finished)
      keep_checkpoints=1, async_checkpoints=False, progress=False,
      model=dict(vocab_size=1024, d_model=64, num_layers=6, num_heads=4, num_kv_heads=4, mlp_dim=256, max_seq_len=64,
                 norm_scheme="pre"),
      data=dict(seq_len=64, batch_size=16, eval_batches=2, max_corpus_bytes=2_000_000),
      optim=dict(learning_rate=NORMAL_LR, warmup_steps=STEPS // 20))
