"""The DQN tests' tiny setting: a 3-dim Box observation, 3 actions, a small Q model,
and one fragment of two episodes (the first terminated, the second cut)."""

import gymnasium as gym
import numpy as np

from policy_service.data.sample_batch import SampleBatch

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(3)
TINY = {
    "seed": 0,
    "model": {"fcnet_hiddens": [5]},
    "hiddens": [4],
    "target_network_update_freq": 1000,
}


def tiny_batch(rows: int = 8, seed: int = 0) -> SampleBatch:
    """One fragment of two episodes: the first terminates at row 3, the second is cut."""
    rng = np.random.default_rng(seed)
    terminated = np.zeros(rows, bool)
    terminated[3] = True
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 3, rows),
            SampleBatch.REWARDS: rng.uniform(-3, 3, rows).astype(np.float32),
            SampleBatch.TERMINATEDS: terminated,
            SampleBatch.TRUNCATEDS: np.zeros(rows, bool),
            SampleBatch.EPS_ID: np.repeat([0, 1], [4, rows - 4]),
        }
    )
