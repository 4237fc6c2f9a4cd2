"""Training: one generic loop (`train_loop`) driven by a step function and a step-indexed batch iterator.

Pretraining composes it in `jaxpt.train.pretrain` (imported on its own: it pulls in the model and data layers).
"""

from jaxpt.train.checkpoint import Checkpointer
from jaxpt.train.config import validate_config
from jaxpt.train.loop import LoopConfig, LoopResult, train_loop
from jaxpt.train.optim import decay_mask, make_optimizer, make_schedule
from jaxpt.train.sharded import ShardedTraining, shard_training, sharded_init, train_state_sharding
from jaxpt.train.state import TrainState
from jaxpt.train.step import accumulate_gradients, make_train_step

__all__ = ["Checkpointer", "LoopConfig", "LoopResult", "ShardedTraining", "TrainState", "accumulate_gradients",
           "decay_mask", "make_optimizer", "make_schedule", "make_train_step", "shard_training", "sharded_init",
           "train_loop", "train_state_sharding", "validate_config"]
