"""ServedPolicy: a policy served by an actor, called as a sampler calls an acting copy.

    policy = ServedPolicy(policy_actor)                  # a PolicyActor, an acting learner
    policy = ServedPolicy(multi_policy_actor, "attacker")  # one policy of a MultiPolicyActor
    actions, state_outs, extra = policy.compute_actions(obs, states, prev_a, prev_r)

`extra["weights_version"]` is a column: the actor's version for every row (its weights
may change between two calls of one fragment).
"""

from __future__ import annotations

import numpy as np
import tree

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.actor_pool import call_retrying_once

# the column of the weights version that acted on each row (an actor's reply names it too)
WEIGHTS_VERSION = "weights_version"


class ServedPolicy:
    """One policy served by an actor: of a MultiPolicyActor (named by `policy_id`), or an
    actor serving that policy alone (a PolicyActor, an acting learner: `policy_id` None).
    A call lost with a dead actor is sent once more (Ray restarts a PolicyActor with its
    weights; a learner is replaced by the driver, who sets `actor`)."""

    def __init__(self, actor, policy_id: str | None = None) -> None:
        self.actor = actor
        self._named = {} if policy_id is None else {"policy_id": policy_id}
        # the served policy's initial state tensors (none: not recurrent), which a
        # sampler gives each sub-env or agent at its episode's start
        self._initial_state = [
            np.asarray(tensor)
            for tensor in call_retrying_once(actor.get_initial_state, **self._named)
        ]

    def is_recurrent(self) -> bool:
        return bool(self._initial_state)

    def get_initial_state(self) -> list[np.ndarray]:
        return list(self._initial_state)

    def compute_actions(
        self, obs_batch, state_batches=None, prev_action_batch=None, prev_reward_batch=None
    ):
        actions, state_outs, extra = call_retrying_once(
            self.actor.compute_actions,
            obs_batch,
            state_batches,
            **self._named,
            prev_action_batch=prev_action_batch,
            prev_reward_batch=prev_reward_batch,
        )
        extra = dict(extra)  # the actor's version, as a column: its weights may change mid-fragment
        extra[WEIGHTS_VERSION] = np.full(
            len(tree.flatten(obs_batch)[0]), int(extra[WEIGHTS_VERSION]), np.int64
        )
        return actions, state_outs, extra

    def postprocess_trajectories(self, chunks: list[SampleBatch]) -> list[SampleBatch]:
        """Every chunk of this policy in one call, with the actor's weights."""
        return call_retrying_once(self.actor.postprocess_trajectories, chunks, **self._named)
