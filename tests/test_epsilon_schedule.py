"""One epsilon schedule: EpsilonGreedy.epsilon, in the compiled action function (a
tensor timestep) and as a number (what DQN reports as cur_epsilon: test_dqn_algorithm.py)."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from policy_service.policy.exploration import EpsilonGreedy

SPACE = gym.spaces.Discrete(3)


@pytest.mark.parametrize("timestep", [0, 1, 2500, 9999, 10000, 50000])
def test_a_number_gives_the_float64_schedule_and_a_tensor_the_float32_one(timestep):
    schedule = EpsilonGreedy(
        SPACE, initial_epsilon=1.0, final_epsilon=0.02, epsilon_timesteps=10000
    )
    exact = 1.0 + min(1.0, timestep / 10000) * (0.02 - 1.0)
    for number in (timestep, np.int64(timestep)):
        value = schedule.epsilon(number)
        assert not tf.is_tensor(value) and value == exact  # bit for bit
    tensor = schedule.epsilon(tf.constant(timestep, tf.int64))
    assert tensor.dtype == tf.float32 and float(tensor) == pytest.approx(exact, abs=1e-6)


def test_the_compiled_schedule_is_traced_once_for_every_timestep():
    schedule = EpsilonGreedy(SPACE, initial_epsilon=1.0, final_epsilon=0.1, epsilon_timesteps=100)
    compiled = tf.function(schedule.epsilon, input_signature=[tf.TensorSpec([], tf.int64)])
    values = [float(compiled(tf.constant(t, tf.int64))) for t in (0, 50, 100, 200)]
    assert values == pytest.approx([1.0, 0.55, 0.1, 0.1])
    assert compiled.experimental_get_tracing_count() == 1
