"""What the environment gets for a policy's actions: RLlib's `normalize_actions` and
`clip_actions`.

The sample batch keeps the policy's own actions; only the copy sent to the env changes.
For each Box leaf with finite bounds:
- normalize_actions: the policy acts in [-1, 1]; the env gets
  low + (a + 1) * (high - low) / 2, clipped to [low, high] (RLlib's unsquash_action);
- else clip_actions: the env gets a clipped to [low, high];
- else the action as it is.
Discrete and MultiDiscrete leaves pass unchanged. `EnvActionRule` is the one place a
policy's config turns into that step: env runners (single- and multi-agent), the episode
server, a local-mode PolicyClient and `Algorithm.compute_single_action` go through it.
`normalized` is the inverse map, for actions a client logs in the env's units
(`EnvActionRule.from_env`, its log_action in both inference modes).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from policy_service.config import config_value
from policy_service.data.spaces import (
    action_leaf_values,
    action_leaves,
    has_box_leaves,
    nest_actions,
)


class EnvActionRule:
    """What the env gets for actions of a policy acting in `action_space`."""

    def __init__(self, action_space: gym.Space, normalize: bool = False, clip: bool = True):
        self.action_space, self.normalize, self.clip = action_space, bool(normalize), bool(clip)
        # an unsupported leaf is named here, once; only Box leaves change on their way
        self.changes_actions = has_box_leaves(action_space) and (self.normalize or self.clip)

    @classmethod
    def of(cls, action_space: gym.Space, config: Any) -> EnvActionRule:
        """The rule a policy config (a dataclass, a dict or None) sets; a key it lacks
        takes PolicyConfig's default (normalize_actions False, clip_actions True)."""
        return cls(
            action_space,
            bool(config_value(config, "normalize_actions", False)),
            bool(config_value(config, "clip_actions", True)),
        )

    def to_env(self, actions: Any) -> Any:
        """Batched actions (leaves [B, ...]) as the env gets them."""
        if not self.changes_actions:
            return actions
        return to_env(self.action_space, actions, self.normalize, self.clip)

    def from_env(self, actions: Any) -> Any:
        """Batched actions a client chose in the env's units, as the policy acts (the
        batch's units): back in [-1, 1] with normalize_actions, else as they are."""
        return normalized(self.action_space, actions) if self.normalize else actions

    def single_to_env(self, action: Any) -> Any:
        """One unbatched action as the env gets it."""
        if not self.changes_actions:
            return action
        return single_to_env(self.action_space, action, self.normalize, self.clip)


def to_env(action_space: gym.Space, actions: Any, normalize: bool, clip: bool) -> Any:
    """Batched actions (leaves [B, ...]) as the env gets them."""
    if not normalize and not clip:
        return actions
    leaves = action_leaves(action_space)
    values = action_leaf_values(action_space, actions, "actions")
    return nest_actions(
        action_space,
        [_leaf_to_env(space, value, normalize) for (_, space), value in zip(leaves, values)],
    )


def _leaf_to_env(space: gym.Space, value, normalize: bool) -> np.ndarray:
    if not isinstance(space, gym.spaces.Box):
        return np.array(value, copy=True)
    bounded = bool(np.all(space.bounded_below) and np.all(space.bounded_above))
    a = np.asarray(value, np.float32)
    if normalize and bounded:
        a = space.low + (a + 1.0) * (space.high - space.low) / 2.0
    return np.clip(a, space.low, space.high).astype(np.float32)


def normalized(action_space: gym.Space, actions: Any) -> Any:
    """Actions in the env's units back in the policy's [-1, 1] (RLlib's normalize_action),
    Box leaves with finite float bounds only."""
    leaves = action_leaves(action_space)
    values = action_leaf_values(action_space, actions, "actions")
    out = []
    for (_, space), value in zip(leaves, values):
        if (
            isinstance(space, gym.spaces.Box)
            and np.all(space.bounded_below)
            and np.all(space.bounded_above)
            and np.issubdtype(space.dtype, np.floating)
        ):
            value = (np.asarray(value, np.float32) - space.low) * 2.0 / (space.high - space.low)
            value = (value - 1.0).astype(np.float32)
        out.append(value)
    return nest_actions(action_space, out)


def single_to_env(action_space: gym.Space, action: Any, normalize: bool, clip: bool) -> Any:
    """`to_env` of one unbatched action."""
    import tree

    batch = tree.map_structure(lambda a: np.asarray(a)[None], action)
    return tree.map_structure(lambda a: a[0], to_env(action_space, batch, normalize, clip))
