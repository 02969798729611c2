"""policy_service/io/space_codec.py: every supported space survives JSON exactly."""

import json

import gymnasium as gym
import numpy as np
import pytest

from policy_service.io.space_codec import space_from_json, space_to_json

SPACES = [
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    gym.spaces.Box(np.array([-np.inf, 0.0]), np.array([np.inf, 5.0]), (2,), np.float64),
    gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.MultiDiscrete([3, 4, 2]),
    gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,)), "mode": gym.spaces.Discrete(3)}),
    gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0.0, 1.0, (1,))]),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_space_round_trips_through_json_text(space):
    restored = space_from_json(json.loads(json.dumps(space_to_json(space))))
    assert restored == space
    if isinstance(space, gym.spaces.Box):
        assert restored.dtype == space.dtype
        np.testing.assert_array_equal(restored.low, space.low)


def test_unsupported_and_unknown_spaces_are_named():
    with pytest.raises(TypeError, match="Text"):
        space_to_json(gym.spaces.Text(5))
    with pytest.raises(ValueError, match="'Sphere'"):
        space_from_json({"type": "Sphere"})
