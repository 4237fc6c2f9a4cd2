"""Tiny reward-model run: a 2-layer, d_model 64 Pre-Norm backbone trained with Bradley-Terry on the embedded
synthetic arithmetic preferences, where the chosen answer is also the longer one in 95% of training pairs (the
'test' split is de-biased, 'adversarial' has the chosen answer always shorter). About a minute on 2 CPU cores.
Training rows are data.seq_len = 48 tokens; model.max_seq_len (a bound, no parameter depends on it) is 128 so that
the RM can score `rlhf_tiny.py`'s prompt + response.
Every field not set here keeps the default of its dataclass (`jaxpt.trainers.rm.RMRunConfig`).

  jaxpt rm --config experiments/configs/rm_tiny.py --workdir /tmp/rm [--config.rm.loss=dir --config.rm.mi_weight=1.0]
"""

from jaxpt.config import config_dict
from jaxpt.trainers.rm import RMRunConfig


def get_config():
  return config_dict(
      RMRunConfig, steps=300, log_every=20, eval_every=100, checkpoint_every=100,
      model=dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=256, max_seq_len=128,
                 norm_scheme="pre"),
      data=dict(source="synthetic", seq_len=48, batch_size=32, length_bias=0.95, synthetic_train_pairs=4096,
                synthetic_test_pairs=512),
      optim=dict(learning_rate=3e-3, warmup_steps=30, weight_decay=0.01),
      rm=dict(loss="bt", estimator_hidden=256))
