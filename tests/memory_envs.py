"""Small environments that only a policy with memory can solve."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class RecallEnv(gym.Env):
    """Show a cue, wait, then ask for it back.

    Step 0 shows one of `num_cues` cues (one-hot); the next `delay` steps show
    zeros; the last step shows only the query flag, and the action taken
    there is judged: reward +1 if it names the cue, -1 otherwise (0 on every
    earlier step), then the episode terminates. Episodes have delay + 2 steps.

    obs <float32>[num_cues + 1]: the cue one-hot, then the query flag.
    A memoryless policy sees the same query observation whatever the cue, so
    its expected return is at most 2 / num_cues - 1 (0 for two cues); a
    policy that remembers the cue gets 1.
    """

    def __init__(self, num_cues: int = 2, delay: int = 4):
        self.num_cues = int(num_cues)
        self.delay = int(delay)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.num_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(self.num_cues)
        self._cue = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        elif self._t == self.delay + 1:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.num_cues))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t == self.delay + 1:
            reward = 1.0 if int(action) == self._cue else -1.0
            return self._obs(), reward, True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


# The PPO run in which a policy with memory (an LSTM or GTrXL, the test's "model") learns
# RecallEnv, registered as "recall" (test_ppo_learning.py, test_attention_learning.py).
RECALL = {
    "env": "recall",
    "env_config": {"num_cues": 3, "delay": 10},
    "seed": 0,
    "lr": 1e-3,
    "lambda_": 0.95,
    "entropy_coeff": 0.01,
    "vf_clip_param": 100.0,
    "train_batch_size": 2000,
    "minibatch_size": 240,
    "num_epochs": 10,
    "num_envs_per_env_runner": 8,
}
