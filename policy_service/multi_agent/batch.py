"""MultiAgentBatch (RLlib's): each policy's rows as its own SampleBatch, and the env
steps they came from; agent steps are the rows of all policies together."""

from __future__ import annotations

from collections.abc import Iterable

from policy_service.data.sample_batch import SampleBatch, concat_samples


class MultiAgentBatch:
    """policy id -> SampleBatch, from `env_steps` steps of the envs."""

    def __init__(self, policy_batches: dict[str, SampleBatch], env_steps: int) -> None:
        self.policy_batches = policy_batches
        self._env_steps = int(env_steps)

    def env_steps(self) -> int:
        return self._env_steps

    def agent_steps(self) -> int:
        return sum(batch.count for batch in self.policy_batches.values())

    @property
    def count(self) -> int:
        """Env steps, as RLlib's MultiAgentBatch.count."""
        return self._env_steps

    def __repr__(self) -> str:
        counts = {p: b.count for p, b in self.policy_batches.items()}
        return f"MultiAgentBatch(env_steps={self._env_steps}, rows={counts})"


def concat_multi_agent(batches: Iterable[MultiAgentBatch]) -> MultiAgentBatch:
    """One batch holding every policy's rows of `batches`, in order."""
    batches = list(batches)
    ids = dict.fromkeys(p for b in batches for p in b.policy_batches)
    return MultiAgentBatch(
        {
            p: concat_samples(b.policy_batches[p] for b in batches if p in b.policy_batches)
            for p in ids
        },
        sum(b.env_steps() for b in batches),
    )
