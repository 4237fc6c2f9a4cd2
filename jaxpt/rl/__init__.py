"""RL post-training: the KV-cache sampler (`sampler`), teacher-forced log-probs in its layout (`logprobs`), rollout
plumbing (`rollouts`), rollout collection (`collect`: sampling, verifying, DAPO refills, CLIPO rewards), CLIPO
(`clipo`), DAPO (`dapo`) and verifiable rewards (`rewards`)."""

from jaxpt.rl import clipo, collect, dapo, logprobs, rewards, rollouts, sampler  # noqa: F401

__all__ = ["clipo", "collect", "dapo", "logprobs", "rewards", "rollouts", "sampler"]
