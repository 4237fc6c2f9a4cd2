"""Tiny DPO run: a 2-layer, d_model 64 Pre-Norm policy trained with DPO on the embedded synthetic arithmetic
preferences (the chosen answer is also the longer one in 95% of training pairs; the 'test' split is de-biased,
'adversarial' has the chosen answer always shorter). The policy and its frozen reference start from `init_from`: ''
(as here) is a seeded random init, which is enough to exercise the trainer; an LM workdir (e.g. a `jaxpt dpo` or
`jaxpt sft` run with this model) starts both from its params and tokenizes with its tokenizer. About a minute on
2 CPU cores. Every field not set here keeps the default of its dataclass (`jaxpt.trainers.dpo.DPORunConfig`).

  jaxpt dpo --config experiments/configs/dpo_tiny.py --workdir /tmp/dpo [--config.dpo.dir=True]
  jaxpt eval --workdir /tmp/dpo
"""

from jaxpt.config import config_dict
from jaxpt.trainers.dpo import DPORunConfig


def get_config():
  return config_dict(
      DPORunConfig, steps=200, log_every=20, eval_every=100, checkpoint_every=100,
      model=dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=256, max_seq_len=64,
                 norm_scheme="pre"),
      data=dict(source="synthetic", seq_len=48, batch_size=32, length_bias=0.95, synthetic_train_pairs=4096,
                synthetic_test_pairs=512),
      optim=dict(learning_rate=1e-3, warmup_steps=20, weight_decay=0.0),
      dpo=dict(beta=0.1, dir=False, mi_warmup_steps=20, estimator_hidden=256))
