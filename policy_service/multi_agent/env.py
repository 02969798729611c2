"""MultiAgentEnv: RLlib's and PettingZoo's parallel semantics, dicts keyed by agent id.

Only the agents present in an obs dict act next; agents may join or leave mid-episode.
The done dicts carry "__all__", which ends the episode for every agent;
`checked_step` refuses a step result without it, naming the env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from policy_service.errors import UserError

ALL = "__all__"

StepResult = tuple[dict, dict, dict, dict, dict]


class MultiAgentEnvError(UserError, ValueError):
    """A multi-agent env that breaks the API (a step without "__all__", a bad dict)."""


class MultiAgentEnv:
    """Subclasses set `possible_agents`, `observation_spaces` and `action_spaces` (dicts
    per possible agent) and keep `agents` (those in the episode now) current."""

    possible_agents: list = []
    agents: list = []
    observation_spaces: dict[Any, gym.Space] = {}
    action_spaces: dict[Any, gym.Space] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """-> (obs dict, infos dict) of the agents that act first."""
        raise NotImplementedError

    def step(self, action_dict: dict) -> StepResult:
        """-> obs, rewards, terminateds, truncateds, infos dicts; the done dicts with "__all__"."""
        raise NotImplementedError

    def close(self) -> None:
        """Frees what the env holds; nothing by default."""


def checked_step(env: MultiAgentEnv, action_dict: dict) -> StepResult:
    """env.step(action_dict), or a one-line error naming the env when the result is not
    five dicts whose terminateds and truncateds carry "__all__"."""
    result = env.step(action_dict)
    name = type(env).__name__
    if not (
        isinstance(result, tuple) and len(result) == 5 and all(isinstance(d, dict) for d in result)
    ):
        raise MultiAgentEnvError(
            f"multi-agent env {name}: step must return 5 dicts (obs, rewards, terminateds, "
            f"truncateds, infos), got {type(result).__name__}"
        )
    for label, dones in (("terminateds", result[2]), ("truncateds", result[3])):
        if ALL not in dones:
            raise MultiAgentEnvError(
                f"multi-agent env {name}: step's {label} dict has no '{ALL}' key "
                f"(keys {sorted(map(str, dones))})"
            )
    return result
