"""The run config of `experiments/siamese_vit/run.py`: `experiments/configs/vit_digits.py` (d_model 64, 4 layers,
600 steps) with an eval every 100 steps (the curves) and one checkpoint, at the end. `run.py` sets
model.norm_scheme, optim.learning_rate and seed per run; `--set key=value` changes any other field for every run.

Held-out images: the digits' fixed split (`jaxpt.data.images`): 20% test (the reported top-1), 10% validation
(every learning-rate choice), the rest train.
"""

from experiments.configs import vit_digits
from experiments.toolkit.image_comparison import one_checkpoint


def get_config():
  return one_checkpoint(vit_digits.get_config(), eval_every=100)
