"""Tiny pretraining run: a 2-layer, d_model 128 SiameseNorm (post_pre) LM on the embedded corpus; a few minutes
on 2 CPU cores. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.pretrain.PretrainRunConfig`).

  jaxpt pretrain --config experiments/configs/tiny.py --workdir /tmp/tiny [--config.steps=N ...]
"""

from jaxpt.config import config_dict
from jaxpt.trainers.pretrain import PretrainRunConfig


def get_config():
  return config_dict(
      PretrainRunConfig, steps=300, log_every=10, eval_every=50, checkpoint_every=100,
      model=dict(vocab_size=2048, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=512,
                 max_seq_len=128, norm_scheme="siamese_post_pre"),
      data=dict(seq_len=128, batch_size=16, eval_batches=4, max_corpus_bytes=2_000_000),
      optim=dict(learning_rate=3e-3, warmup_steps=30))
