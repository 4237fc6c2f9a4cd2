"""Tiny pretraining run: a 2-layer, d_model 128 SiameseNorm (post_pre) LM on the embedded corpus; a few minutes
on 2 CPU cores.

  jaxpt pretrain --config experiments/configs/tiny.py --workdir /tmp/tiny [--config.steps=N ...]
"""

from experiments.configs import base


def get_config():
  config = base.get_base_config()
  config.steps = 300
  config.log_every = 10
  config.eval_every = 50
  config.checkpoint_every = 100
  config.model = base.model_config(vocab_size=2048, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4,
                                   mlp_dim=512, max_seq_len=128, norm_scheme="siamese_post_pre")
  config.data = base.data_config(seq_len=128, batch_size=16, eval_batches=4, max_corpus_bytes=2_000_000)
  config.optim = base.optim_config(learning_rate=3e-3, warmup_steps=30)
  return config
