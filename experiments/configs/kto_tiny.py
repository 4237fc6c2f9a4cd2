"""Tiny KTO run: a 2-layer, d_model 64 Pre-Norm policy trained with KTO on the embedded synthetic arithmetic
preferences split into unpaired rows (each chosen answer a desirable example, each rejected one an undesirable
example; `kto.one_response_per_prompt=True` keeps one of the two per prompt). The policy and its frozen reference
start from `init_from` ('' = a seeded random init, as here; an LM workdir starts both from its params and tokenizer).
About a minute on 2 CPU cores. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.kto.KTORunConfig`).

  jaxpt kto --config experiments/configs/kto_tiny.py --workdir /tmp/kto
  jaxpt eval --workdir /tmp/kto
"""

from jaxpt.config import config_dict
from jaxpt.trainers.kto import KTORunConfig


def get_config():
  return config_dict(
      KTORunConfig, steps=200, log_every=20, eval_every=100, checkpoint_every=100,
      model=dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=256, max_seq_len=64,
                 norm_scheme="pre"),
      data=dict(source="synthetic", seq_len=48, batch_size=32, length_bias=0.95, synthetic_train_pairs=4096,
                synthetic_test_pairs=512),
      optim=dict(learning_rate=1e-3, warmup_steps=20, weight_decay=0.0),
      kto=dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0))
