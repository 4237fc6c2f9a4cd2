"""A SiameseNorm (post_pre) DiT on scikit-learn's 8x8 digits (offline): 2x2 patches, d_model 64, 2 layers, the
linear schedule over T = 1000; about a minute on 2 CPU cores. Every field not set here keeps the default of its
dataclass (`jaxpt.trainers.dit.DiTRunConfig`); DiT's settings are LayerNorm eps 1e-6, tanh GELU, biases, a fixed 2-D
sin-cos position table, label dropout 0.1, and no augmentation here (crop_padding 0).

  jaxpt dit --config experiments/configs/dit_digits.py --workdir /tmp/dit [--config.model.norm_scheme=pre ...]

DiT-B/4 on 32x32 CIFAR-10 pixels (prepared once with `tfds build cifar10 --file_format=array_record`):
--config.data.source=tfds:cifar10 --config.data.flip=True --config.dit.image_size=32 --config.dit.patch_size=4
--config.dit.channels=3 --config.model.d_model=768 --config.model.num_layers=12 --config.model.num_heads=12
--config.model.num_kv_heads=12 --config.model.mlp_dim=3072 --config.optim.learning_rate=1e-4 (DiT: AdamW 1e-4, no
weight decay, batch 256).
"""

from jaxpt.config import config_dict
from jaxpt.trainers.dit import DiTRunConfig


def get_config():
  return config_dict(
      DiTRunConfig, steps=1500, log_every=100, eval_every=500, checkpoint_every=500,
      model=dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, mlp_dim=256, norm_scheme="siamese_post_pre",
                 norm_type="layernorm", norm_eps=1e-6, mlp_type="gelu", mlp_bias=True, qkv_bias=True,
                 attn_out_bias=True, causal=False, rope=False, tie_embeddings=False, scan_layers=False),
      dit=dict(image_size=8, patch_size=2, channels=1, num_classes=10, class_dropout=0.1, frequency_features=64),
      data=dict(source="digits", batch_size=64, crop_padding=0, flip=False),
      sample=dict(num_steps=50, eta=0.0, guidance_scale=1.5),
      optim=dict(learning_rate=1e-3, warmup_steps=50, weight_decay=0.0))
