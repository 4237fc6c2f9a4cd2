"""RL post-training: verifiable rewards (`rewards`); the sampler and rollout plumbing come with issue #5."""

from jaxpt.rl import rewards  # noqa: F401

__all__ = ["rewards"]
