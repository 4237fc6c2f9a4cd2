"""A reward model (Bradley-Terry, DIR or ODIN) on a Hugging Face backbone, the DIR paper's recipe (a Llama-3.1-8B
backbone, hh-rlhf style pairs) at the sizes one accelerator holds.

`init_from=hf:DIR` fills the backbone's architecture from DIR/config.json and gives the tokenizer; the model
section holds only how the model runs. Every field not set here keeps the default of its dataclass
(`jaxpt.trainers.rm.RMRunConfig`).

  jaxpt rm --config experiments/configs/rm_hf.py --workdir /tmp/rm_llama --config.init_from=hf:/models/Llama-3.2-1B \
      --config.data.source=../shared/data/hh-rlhf/harmless-base-test.jsonl.gz [--config.rm.loss=dir]
  # official DIR code's 8-GPU lambda = 1 is --config.rm.mi_weight=0.125 here (README, "DIR under data parallelism")
"""

from jaxpt.config import config_dict
from jaxpt.trainers.rm import RMRunConfig


def get_config():
  return config_dict(
      RMRunConfig, steps=1000, log_every=10, eval_every=200, checkpoint_every=200,
      model=dict(dtype="bfloat16", param_dtype="float32", remat="full", max_seq_len=1024),
      data=dict(source="synthetic", seq_len=1024, batch_size=32),
      optim=dict(learning_rate=1e-5, warmup_steps=30, weight_decay=0.0),
      rm=dict(loss="bt", estimator_hidden=512))
