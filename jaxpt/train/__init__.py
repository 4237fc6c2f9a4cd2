"""Training: one sharded-training builder (`builder.build_training`), one step (`step.make_train_step`), one loop
(`loop.train_loop`), and the trainers composed from them: `pretrain` (+ `sft`), `rm`, `dpo`, `grpo`.

The trainers are imported on their own (`from jaxpt.train.pretrain import pretrain`): they pull in the model and
data layers.
"""

from jaxpt.train.checkpoint import Checkpointer
from jaxpt.train.config import RunConfig
from jaxpt.train.loop import LoopConfig, LoopResult, train_loop
from jaxpt.train.optim import OptimConfig, decay_mask, make_optimizer, make_schedule
from jaxpt.train.sharded import ShardedTraining, shard_training, sharded_init, train_state_sharding
from jaxpt.train.state import TrainState
from jaxpt.train.step import accumulate, accumulate_gradients, grad_fn_of, make_train_step

__all__ = ["Checkpointer", "LoopConfig", "LoopResult", "OptimConfig", "RunConfig", "ShardedTraining", "TrainState",
           "accumulate", "accumulate_gradients", "decay_mask", "grad_fn_of", "make_optimizer", "make_schedule",
           "make_train_step", "shard_training", "sharded_init", "train_loop", "train_state_sharding"]
