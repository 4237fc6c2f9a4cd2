"""A micro GRPO run for the multi-device and multi-process tests: a from-scratch policy whose rewards come from a
verifier that reads the decoded text (1 when the response has an even number of characters), so every group mixes
rewards and the advantages, losses and updates are not trivially 0, while the rollouts go the whole way (sampled on
the mesh, decoded and verified by the process that holds them, all-gathered)."""

from experiments.configs import grpo_tiny

G, B, T = 4, 4, 8
OVERRIDES = {
    "model.vocab_size": 512, "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2,
    "model.num_kv_heads": 2, "model.mlp_dim": 64, "model.max_seq_len": 64, "model.norm_scheme": "siamese_post_pre",
    "model.tie_embeddings": False,
    "task.num_steps": 1, "task.max_value": 9, "task.ops": "+", "task.train_size": 64, "task.test_size": 8,
    "steps": 2, "log_every": 1, "eval_every": 2, "checkpoint_every": 0, "progress": False,
    "data.prompts_per_step": B, "data.max_prompt_len": 40, "data.eval_prompts": 8,
    "sampling.max_new_tokens": T, "grpo.group_size": G, "grpo.minibatches": 2, "grpo.epochs": 2,
    "grpo.kl_coef": 0.01, "optim.learning_rate": 1e-3, "optim.warmup_steps": 0,
}
# the two-process run (tests/multidevice/grpo_process.py): data over the processes x fsdp within, a checkpoint a step;
# 2 prompts a step and eval batches of 2 padded to the 4 data-parallel devices (each process verifies 2 rows)
MULTI_PROCESS = {"steps": 3, "checkpoint_every": 1, "eval_every": 3, "mesh.data": 2, "mesh.fsdp": 2,
                 "mesh.rules": "fsdp", "data.prompts_per_step": 2, "data.eval_prompts": 6}
DAPO = {"dapo.dynamic_sampling": True, "dapo.max_rounds": 3, "dapo.overlong_filtering": True,
        "dapo.overlong_buffer": 4}
CLIPO = {"clipo.enabled": True, "clipo.out_dim": 16, "clipo.in_loss_coef": 0.1, "clipo.level": "batch_level"}


def even_length(response: str, answer: str) -> float:
  """The micro run's verifier: 1 for a response of an even number of characters."""
  del answer
  return float(len(response) % 2 == 0)


def micro_config(clipo: bool = False, **overrides):
  """grpo_tiny with OVERRIDES (and CLIPO on), then `overrides` (flattened keys: {"mesh.data": 2, ...})."""
  config = grpo_tiny.get_config()
  config.update_from_flattened_dict({**OVERRIDES, **(CLIPO if clipo else {}), **overrides})
  return config
