"""algorithms/dqn.py on a Dict observation: the Q model's encoder is the per-component
one (ComplexInputEncoder), so an image component goes through conv layers in training."""

import gymnasium as gym
import numpy as np
import pytest

from algorithms import register_env
from algorithms.dqn import DQN
from policy_service.policy.complex_inputs import ComplexInputEncoder


class ImageAndVectorEnv(gym.Env):
    """A small camera frame and a 2-vector; action 1 pays 1 when joints[0] > 0, action 0
    otherwise. Episodes of 8 steps."""

    def __init__(self, config: dict | None = None):
        self.observation_space = gym.spaces.Dict(
            {
                "camera": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                "joints": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == int(self.obs["joints"][0] > 0))
        self.t += 1
        return self._obs(), reward, self.t >= 8, False, {}

    def _obs(self) -> dict:
        self.obs = self.observation_space.sample()
        return self.obs


register_env("image_and_vector", lambda env_config: ImageAndVectorEnv(env_config))


@pytest.mark.slow  # a DQN run in the driver, one iteration: ~20 s here
def test_dqn_trains_conv_layers_on_an_image_component():
    algo = DQN(
        {
            "env": "image_and_vector",
            "seed": 0,
            "model": {"fcnet_hiddens": [8], "conv_filters": [[4, [3, 3], 2], [8, [4, 4], 4]]},
            "hiddens": [8],
            "train_batch_size": 8,
            "rollout_fragment_length": 8,
            "num_steps_sampled_before_learning_starts": 16,
            "min_sample_timesteps_per_iteration": 32,
            "replay_buffer_capacity": 100,
        }
    )
    try:
        policy = algo.get_policy()
        assert isinstance(policy.model.features, ComplexInputEncoder)
        before = policy.get_weights()
        assert before["q_encoder/q_encoder_camera_conv_0/kernel"].shape == (3, 3, 3, 4)
        assert before["q_encoder/q_encoder_camera_conv_1/kernel"].shape == (4, 4, 4, 8)
        assert before["q_encoder/q_encoder_joints_dense_0/kernel"].shape == (2, 8)
        assert max(w.shape[0] for w in before.values() if w.ndim == 2) < 8 * 8 * 3
        algo.train()
        after = policy.get_weights()
        assert not np.array_equal(
            before["q_encoder/q_encoder_camera_conv_0/kernel"],
            after["q_encoder/q_encoder_camera_conv_0/kernel"],
        )
    finally:
        algo.stop()
