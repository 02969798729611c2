"""PolicySpec (RLlib's name): what a policy is built from. One owner for both uses:
a learner builds its policy from a complete spec; a multi-agent config's `policies`
may leave fields None (the algorithm's policy class, spaces from the agents mapped to
it, the algorithm's config), filled in by policy_service.multi_agent.policies."""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym


class PolicySpec(NamedTuple):
    """`policy_class(observation_space, action_space, config)`, once every field is set."""

    policy_class: type | None = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    config: Any = None

    def built_class(self) -> type:
        """policy_class, which a spec being built must have."""
        if self.policy_class is None:
            raise ValueError("PolicySpec: policy_class is None; fill the spec in before building")
        return self.policy_class

    def build(self):
        return self.built_class()(self.observation_space, self.action_space, self.config)
