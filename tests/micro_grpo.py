"""A micro GRPO run for the multi-device and multi-process tests: a from-scratch policy whose rewards come from a
verifier that reads the decoded text (1 when the response has an even number of characters), so every group mixes
rewards and the advantages, losses and updates are not trivially 0, while the rollouts go the whole way (sampled on
the mesh, decoded and verified by the process that holds them, all-gathered)."""

import functools
import tempfile

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
    # the static sampler, the rollouts' path on GPU and TPU (`engine.enabled` left to auto takes the engine on CPU);
    # the engine's own cases set engine.enabled=True
    "engine.enabled": False,
}
# the two-process run (tests/multidevice/grpo_process.py): data over the processes x fsdp within, a checkpoint a step;
# 2 prompts a step and eval batches of 2 padded to the 4 data-parallel devices (each process verifies 2 rows)
MULTI_PROCESS = {"steps": 3, "checkpoint_every": 1, "eval_every": 3, "mesh.data": 2, "mesh.fsdp": 2,
                 "mesh.rules": "fsdp", "data.prompts_per_step": 2, "data.eval_prompts": 6}
DAPO = {"dapo.dynamic_sampling": True, "dapo.max_rounds": 3, "dapo.overlong_filtering": True,
        "dapo.overlong_buffer": 4}
# each registered policy loss (and the bnpo advantage) as tests/test_train_grpo_policy_losses.py and
# tests/multidevice/sharded_grpo_losses.py run it: ppo_clip and gspo with the micro run's own settings; cispo, gppo,
# topr with their papers' knobs; clip_cov and kl_cov selecting 5% of the tokens (the papers' 2e-4 / 2e-3 would
# select one token of a micro batch), clip_cov from the band (0, 5) so that the micro run's small covariances reach it
POLICY_LOSS_VARIANTS = {
    "ppo_clip": {"grpo.policy_loss": "ppo_clip"},
    "gspo": {"grpo.policy_loss": "gspo", "grpo.eps_lo": 3e-4, "grpo.eps_hi": 4e-4, "grpo.agg": "seq-mean-token-mean"},
    "cispo": {"grpo.policy_loss": "cispo", "grpo.eps_lo": 1.0, "grpo.eps_hi": 0.28},
    "gppo": {"grpo.policy_loss": "gppo", "grpo.eps_hi": 0.28, "grpo.dual_clip_c": 10.0},
    "topr": {"grpo.policy_loss": "topr", "grpo.kl_coef": 0.0, "grpo.agg": "seq-mean-token-sum"},
    "clip_cov": {"grpo.policy_loss": "clip_cov", "grpo.clip_cov_ratio": 0.05, "grpo.clip_cov_lb": 0.0},
    "kl_cov": {"grpo.policy_loss": "kl_cov", "grpo.kl_cov_ratio": 0.05},
    "bnpo": {"grpo.advantage": "bnpo"}}
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


@functools.cache
def _scratch() -> tempfile.TemporaryDirectory:
  """This process's scratch folder, made on first use and removed when the process exits."""
  return tempfile.TemporaryDirectory(prefix="jaxpt-test-runs-")


def scratch_workdir(prefix: str) -> str:
  """A fresh run directory in this process's scratch folder, removed with it at exit (the multi-device suites' runs
  are cached for the whole process, so pytest's per-test tmp_path does not fit them; nothing is left in /tmp)."""
  return tempfile.mkdtemp(prefix=prefix, dir=_scratch().name)
