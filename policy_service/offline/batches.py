"""One path for single- and multi-agent data: a SampleBatch is the batch of the policy
`default_policy`, as a single-agent run is a multi-agent run with that one id.

A multi-agent batch is known by what it holds (`policy_batches`, `env_steps()`), not
by its class: experiences on disk sit below the multi-agent package and the env
runners, which write them (tests/test_offline_io.py holds DEFAULT_POLICY_ID to
policy_service.multi_agent.policies')."""

from __future__ import annotations

from typing import Protocol, TypeAlias

from policy_service.data.sample_batch import SampleBatch
from policy_service.offline.columns import OfflineDataError

DEFAULT_POLICY_ID = "default_policy"  # multi_agent.policies.DEFAULT_POLICY_ID


class PolicyBatches(Protocol):
    """A MultiAgentBatch as offline data reads it: policy id -> rows, and env steps."""

    policy_batches: dict[str, SampleBatch]

    def env_steps(self) -> int: ...


AnyBatch: TypeAlias = SampleBatch | PolicyBatches


def is_multi_agent(batch: object) -> bool:
    return hasattr(batch, "policy_batches")


def policy_batches(batch: AnyBatch, where: str) -> dict[str, SampleBatch]:
    """policy id -> that policy's rows of `batch`; `where` names the destination."""
    if isinstance(batch, SampleBatch):
        return {DEFAULT_POLICY_ID: batch}
    if is_multi_agent(batch):
        return dict(batch.policy_batches)
    raise OfflineDataError(
        f"{where}: expected a SampleBatch or MultiAgentBatch, got {type(batch).__name__}"
    )
