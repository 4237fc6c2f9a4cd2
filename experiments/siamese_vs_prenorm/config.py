"""Pre-Norm vs Post-Norm vs HybridNorm vs SiameseNorm: the shared run config of the experiment in `run.py`.

A 6-layer model (deeper than `tiny`, so that where the norms sit matters), 200 steps on tiny Shakespeare. `run.py`
sets `model.norm_scheme`, `model.num_layers` (depth sweep), `optim.learning_rate`, `seed` and `data.path` per run;
`--set key=value` changes any other field for every run (an accelerator-scale rerun: see README.md here).

Held-out text: data.eval_fraction of the paragraphs (by content hash) never reach training. Their first
data.eval_batches x data.batch_size packed rows are the validation rows (the run's own eval_loss, every
eval_every steps: every learning-rate choice is made on them); the held-out rows after them, from the first row that
starts a new paragraph, are the test rows (evaluated once, at the end: the reported numbers).

  jaxpt pretrain --config experiments/siamese_vs_prenorm/config.py --workdir /tmp/one_run \
      --config.model.norm_scheme=siamese_post_pre --config.data.path=../shared/data/tinyshakespeare
"""

from jaxpt.config import config_dict
from jaxpt.trainers.pretrain import PretrainRunConfig

STEPS = 200


def get_config():
  return config_dict(
      PretrainRunConfig, steps=STEPS, log_every=10, eval_every=25,
      checkpoint_every=STEPS,  # one checkpoint, at the end
      keep_checkpoints=1, async_checkpoints=False, progress=False,
      model=dict(vocab_size=1024, d_model=64, num_layers=6, num_heads=4, num_kv_heads=4, mlp_dim=256, max_seq_len=64,
                 norm_scheme="pre"),
      data=dict(seq_len=64, batch_size=16, eval_batches=4, eval_fraction=0.1, max_corpus_bytes=2_000_000),
      optim=dict(learning_rate=3e-3, warmup_steps=STEPS // 20))
