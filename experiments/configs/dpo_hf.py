"""DPO (optionally + DIR) of a Hugging Face checkpoint on preference pairs; the reference policy is the checkpoint.

`init_from=hf:DIR` fills the policy's architecture from DIR/config.json and gives the tokenizer; the model section
holds only how the model runs; prompts go in the model's chat template (data.prompt_format=chat). Every field not
set here keeps the default of its dataclass (`jaxpt.trainers.dpo.DPORunConfig`).

  jaxpt dpo --config experiments/configs/dpo_hf.py --workdir /tmp/dpo_qwen \
      --config.init_from=hf:/models/Qwen2.5-0.5B-Instruct \
      --config.data.source=../shared/data/hh-rlhf/harmless-base-test.jsonl.gz [--config.dpo.dir=True]
"""

from jaxpt.config import config_dict
from jaxpt.trainers.dpo import DPORunConfig


def get_config():
  return config_dict(
      DPORunConfig, steps=1000, log_every=10, eval_every=200, checkpoint_every=200,
      model=dict(dtype="bfloat16", param_dtype="float32", remat="full", max_seq_len=1024),
      data=dict(source="synthetic", seq_len=1024, batch_size=32, prompt_format="chat"),
      optim=dict(learning_rate=5e-7, warmup_steps=30, weight_decay=0.0),
      dpo=dict(beta=0.1, dir=False))
