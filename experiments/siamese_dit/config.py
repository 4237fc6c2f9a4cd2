"""The run config of `experiments/siamese_dit/run.py`: `experiments/configs/dit_digits.py` (d_model 64, 2 layers,
1500 steps, 50 DDIM steps with guidance 1.5) with an eval every 250 steps (the FID-style curves: fid.num_samples =
500 samples scored against the test split, eval_fid, and the validation split, eval_val_fid) and one checkpoint, at
the end. `run.py` sets model.norm_scheme, optim.learning_rate, seed and fid.classifier per run; `--set key=value`
changes any other field for every run.

Held-out images: the digits' fixed split (`jaxpt.data.images`): 20% test (the reported metric), 10% validation
(every learning-rate choice), the rest train.
"""

from experiments.configs import dit_digits
from experiments.toolkit.image_comparison import one_checkpoint


def get_config():
  return one_checkpoint(dit_digits.get_config(), eval_every=250)
