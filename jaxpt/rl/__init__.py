"""RL post-training: the KV-cache sampler (`sampler`), the rollout engine (`engine`: continuous batching over a
paged KV cache), teacher-forced log-probs in its layout (`logprobs`), rollout plumbing (`rollouts`), rollout
collection (`collect`: sampling, verifying, DAPO refills, CLIPO rewards), CLIPO (`clipo`), DAPO (`dapo`) and
verifiable rewards (`rewards`)."""

from jaxpt.rl import clipo, collect, dapo, engine, logprobs, rewards, rollouts, sampler  # noqa: F401

__all__ = ["clipo", "collect", "dapo", "engine", "logprobs", "rewards", "rollouts", "sampler"]
