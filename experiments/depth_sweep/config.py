"""Stability with depth: the run config of `run.py`, the model, data and budget of
`experiments/siamese_vs_prenorm/config.py` (d_model 64, 200 steps on tiny Shakespeare; its 6-layer depth is the
sweep's shallowest). `run.py` sets the scheme, model.num_layers, the peak lr, optim.warmup_steps, the seed and
data.path per run; `--set key=value` changes any other field for every run.
"""

from experiments.siamese_vs_prenorm import config as siamese_config


def get_config():
  return siamese_config.get_config()
