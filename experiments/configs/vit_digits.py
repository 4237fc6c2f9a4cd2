"""A DeiT-style SiameseNorm (post_pre) ViT on scikit-learn's 8x8 digits (offline): 2x2 patches, d_model 64, 4
layers; about a minute on 2 CPU cores. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.vit.ViTRunConfig`); the DeiT settings are LayerNorm eps 1e-6, erf GELU, biases, a class token.

  jaxpt vit --config experiments/configs/vit_digits.py --workdir /tmp/vit [--config.model.norm_scheme=pre ...]

For CIFAR-10 (prepared once with `tfds build cifar10 --file_format=array_record`): --config.data.source=tfds:cifar10
--config.data.flip=True --config.data.crop_padding=4 --config.vit.image_size=32 --config.vit.patch_size=4
--config.vit.channels=3; DeiT-T on ImageNet: tfds:imagenet2012, image_size 224, patch_size 16, channels 3,
num_classes 1000, d_model 192, num_layers 12, num_heads 3, mlp_dim 768, label_smoothing 0.1.
"""

from jaxpt.config import config_dict
from jaxpt.trainers.vit import ViTRunConfig


def get_config():
  return config_dict(
      ViTRunConfig, steps=600, log_every=50, eval_every=200, checkpoint_every=200, label_smoothing=0.1,
      model=dict(d_model=64, num_layers=4, num_heads=4, num_kv_heads=4, mlp_dim=128, norm_scheme="siamese_post_pre",
                 norm_type="layernorm", norm_eps=1e-6, mlp_type="gelu_exact", mlp_bias=True, qkv_bias=True,
                 attn_out_bias=True, causal=False, rope=False, tie_embeddings=False, scan_layers=False),
      vit=dict(image_size=8, patch_size=2, channels=1, num_classes=10, pooling="cls", position_embedding="learned"),
      data=dict(source="digits", batch_size=64, crop_padding=1, flip=False),
      optim=dict(learning_rate=2e-3, warmup_steps=50))
