"""algorithms/evaluation.py: `evaluate`'s episodes act as the policy does, through the
policy's observation filter (MeanStdFilter: tests/test_observation_filters.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from fakes import PGPolicy

from algorithms.evaluation import run_episodes

FILTERED = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "observation_filter": "MeanStdFilter"}
OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)


class WideObservations(gym.Env):
    """Ten steps of seeded wide observations in OBS_SPACE; records the actions taken."""

    observation_space, action_space = OBS_SPACE, gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        self.rng, self.seen, self.actions = np.random.default_rng(seed), [], []
        return self._observe(), {}

    def step(self, action):
        self.actions.append(int(action))
        return self._observe(), 0.0, False, len(self.actions) == 10, {}

    def _observe(self):
        self.seen.append(self.rng.uniform(-6, 6, 3).astype(np.float32))
        return self.seen[-1]


def test_evaluate_acts_on_observations_filtered_as_training_saw_them():
    """`evaluate`'s episodes pick, at every step, the greedy action of the model on the
    observation normalized by the filter's statistics (numpy here), and leave those
    statistics as they were."""
    policy = PGPolicy(OBS_SPACE, gym.spaces.Discrete(3), FILTERED)
    rng = np.random.default_rng(2)
    policy.observation_filter(rng.normal([3.0, -2.0, 0.5], [4.0, 0.1, 2.0], (50, 3)))
    stats = policy.observation_filter.stats
    count, env = stats.count, WideObservations()
    run_episodes(policy, env, episodes=1, explore=False, seed=3)
    seen = np.stack(env.seen[:-1])  # the last observation is never acted on
    normalized = np.clip((seen - stats.mean) / (stats.std + 1e-8), -10.0, 10.0)
    logits = policy.model({"obs": normalized.astype(np.float32)}, training=False)
    assert env.actions == np.argmax(logits["action_dist_inputs"].numpy(), axis=1).tolist()
    raw_logits = policy.model({"obs": seen}, training=False)["action_dist_inputs"].numpy()
    assert env.actions != np.argmax(raw_logits, axis=1).tolist()  # the filter mattered
    assert policy.observation_filter.stats.count == count
