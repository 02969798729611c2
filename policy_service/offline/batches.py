"""One path for single- and multi-agent data: a SampleBatch is the batch of the policy
`default_policy`, as a single-agent run is a multi-agent run with that one id."""

from __future__ import annotations

from policy_service.data.sample_batch import SampleBatch
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
from policy_service.offline.columns import OfflineDataError


def policy_batches(batch: SampleBatch | MultiAgentBatch, where: str) -> dict[str, SampleBatch]:
    """policy id -> that policy's rows of `batch`; `where` names the destination."""
    if isinstance(batch, MultiAgentBatch):
        return dict(batch.policy_batches)
    if isinstance(batch, SampleBatch):
        return {DEFAULT_POLICY_ID: batch}
    raise OfflineDataError(
        f"{where}: expected a SampleBatch or MultiAgentBatch, got {type(batch).__name__}"
    )
