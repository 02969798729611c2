"""A tiny image environment both sides can build: RLlib in its own virtualenv and this
project, for the checkpoint import tests (tests/test_rllib_import.py).

ImageTarget-v0: an 84x84x4 float Box (a frame stack's shape, RLlib's default conv
filters apply); a bright square sits in one of three columns, and the action that
names the column earns 1. Imported by name ("rllib_image_env:ImageTarget-v0"), which
registers it with gymnasium. No TensorFlow, no Ray.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SHAPE = (84, 84, 4)
COLUMNS = 3


class ImageTarget(gym.Env):
    """Episodes of 20 steps; reward 1 when the action names the lit column."""

    metadata = {"render_modes": ()}

    def __init__(self, config: dict | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, SHAPE, np.float32)
        self.action_space = gym.spaces.Discrete(COLUMNS)
        self.column = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = self.np_random.uniform(0.0, 0.2, SHAPE).astype(np.float32)
        width = SHAPE[1] // COLUMNS
        obs[30:54, self.column * width : (self.column + 1) * width, :] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.column = int(self.np_random.integers(COLUMNS))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.column)
        self.t += 1
        self.column = int(self.np_random.integers(COLUMNS))
        return self._obs(), reward, False, self.t >= 20, {}


if "ImageTarget-v0" not in gym.registry:
    gym.register("ImageTarget-v0", entry_point=ImageTarget)
