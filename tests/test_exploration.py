"""exploration.py: stochastic sampling and epsilon-greedy, through the policy."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, observations, small_config

from policy_service.policy import exploration
from policy_service.policy.exploration import EpsilonGreedy, StochasticSampling


def epsilon_greedy_policy(initial, final, timesteps=100, action_space=ACTION_SPACE, **config):
    return PGPolicy(
        OBS_SPACE,
        action_space,
        small_config(
            exploration_config={
                "type": "EpsilonGreedy",
                "initial_epsilon": initial,
                "final_epsilon": final,
                "epsilon_timesteps": timesteps,
            },
            **config,
        ),
    )


@pytest.mark.parametrize(
    "timestep, expected",
    [(0, 1.0), (25, 0.775), (50, 0.55), (99, 0.109), (100, 0.1), (101, 0.1), (10**6, 0.1)],
)
def test_epsilon_falls_linearly_then_stays_at_final(timestep, expected):
    schedule = EpsilonGreedy(
        ACTION_SPACE, initial_epsilon=1.0, final_epsilon=0.1, epsilon_timesteps=100
    )
    assert float(schedule.epsilon(tf.constant(timestep, tf.int64))) == pytest.approx(expected)


def test_epsilon_defaults_and_state():
    schedule = EpsilonGreedy(ACTION_SPACE)
    assert float(schedule.epsilon(0)) == pytest.approx(1.0)
    assert float(schedule.epsilon(10000)) == pytest.approx(0.05)
    assert schedule.get_state() == {
        "type": "EpsilonGreedy",
        "initial_epsilon": 1.0,
        "final_epsilon": 0.05,
        "epsilon_timesteps": 10000,
    }
    rebuilt = exploration.make_exploration(ACTION_SPACE, schedule.get_state())
    assert isinstance(rebuilt, EpsilonGreedy) and rebuilt.get_state() == schedule.get_state()


def test_make_exploration_errors_name_the_problem():
    assert isinstance(exploration.make_exploration(ACTION_SPACE, {}), StochasticSampling)
    with pytest.raises(ValueError, match="'Softmax'"):
        exploration.make_exploration(ACTION_SPACE, {"type": "Softmax"})
    with pytest.raises(ValueError, match="EpsilonGreedy needs a Discrete action space"):
        exploration.make_exploration(gym.spaces.Box(-1, 1, (2,)), {"type": "EpsilonGreedy"})


@pytest.mark.parametrize(
    "exploration_config",
    [
        {"type": "StochasticSampling"},
        {"type": "EpsilonGreedy", "initial_epsilon": 1.0, "final_epsilon": 1.0},
    ],
)
def test_explore_false_gives_the_argmax_of_the_logits(exploration_config):
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(exploration_config=exploration_config))
    actions, _, extra = policy.compute_actions(observations(64), explore=False)
    np.testing.assert_array_equal(actions, np.argmax(extra["action_dist_inputs"], -1))
    np.testing.assert_array_equal(extra["action_logp"], np.zeros(64, np.float32))
    np.testing.assert_array_equal(extra["action_prob"], np.ones(64, np.float32))


def test_config_explore_false_is_the_default_for_compute_actions():
    policy = PGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(
            explore=False,
            exploration_config={
                "type": "EpsilonGreedy",
                "initial_epsilon": 1.0,
                "final_epsilon": 1.0,
            },
        ),
    )
    actions, _, extra = policy.compute_actions(observations(64))
    np.testing.assert_array_equal(actions, np.argmax(extra["action_dist_inputs"], -1))
    # an explicit explore=True overrides the config: all-random actions then
    actions, _, _ = policy.compute_actions(observations(300), explore=True)
    assert len(set(actions.tolist())) == 3


def _epsilon_greedy_logp(actions, logits, eps, n):
    greedy = np.argmax(logits, -1)
    return np.log((1 - eps) * (actions == greedy) + eps / n).astype(np.float32)


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_epsilon_greedy_logp_is_that_of_the_epsilon_greedy_policy(eps):
    policy = epsilon_greedy_policy(eps, eps)
    actions, _, extra = policy.compute_actions(observations(2000), explore=True)
    logits = extra["action_dist_inputs"]
    np.testing.assert_allclose(
        extra["action_logp"], _epsilon_greedy_logp(actions, logits, eps, 3), rtol=1e-6
    )
    np.testing.assert_allclose(extra["action_prob"], np.exp(extra["action_logp"]), rtol=1e-6)
    off_greedy = np.mean(actions != np.argmax(logits, -1))
    assert off_greedy == pytest.approx(eps * 2 / 3, abs=0.04)


def test_epsilon_greedy_follows_the_timestep_argument():
    policy = epsilon_greedy_policy(1.0, 0.0, timesteps=100)
    obs = observations(2000)
    for timestep, eps in ((0, 1.0), (50, 0.5), (100, 0.0), (500, 0.0)):
        actions, _, extra = policy.compute_actions(obs, explore=True, timestep=timestep)
        logits = extra["action_dist_inputs"]
        np.testing.assert_allclose(
            extra["action_logp"], _epsilon_greedy_logp(actions, logits, eps, 3), rtol=1e-6
        )
        assert np.mean(actions != np.argmax(logits, -1)) == pytest.approx(eps * 2 / 3, abs=0.04)
    assert policy.action_trace_count() == 1  # explore and timestep are tensors


def test_epsilon_greedy_uses_the_global_timestep_by_default():
    policy = epsilon_greedy_policy(1.0, 0.0, timesteps=1000)
    obs = observations(1000)
    assert policy.global_timestep == 0
    _, _, extra = policy.compute_actions(obs)  # timestep 0: eps 1, prob 1/3 each
    np.testing.assert_allclose(extra["action_prob"], np.full(1000, 1 / 3, np.float32), rtol=1e-6)
    assert policy.global_timestep == 1000
    actions, _, extra = policy.compute_actions(obs)  # timestep 1000: eps 0
    np.testing.assert_array_equal(actions, np.argmax(extra["action_dist_inputs"], -1))
    assert policy.global_timestep == 2000


def test_epsilon_greedy_random_actions_respect_a_shifted_discrete_space():
    space = gym.spaces.Discrete(3, start=-1)
    policy = epsilon_greedy_policy(1.0, 1.0, action_space=space)
    actions, _, extra = policy.compute_actions(observations(600), explore=True)
    assert set(actions.tolist()) == {-1, 0, 1}
    greedy = np.argmax(extra["action_dist_inputs"], -1) - 1
    expected = np.log((1 - 1.0) * (actions == greedy) + 1.0 / 3).astype(np.float32)
    np.testing.assert_allclose(extra["action_logp"], expected, rtol=1e-6)
    actions, _, _ = policy.compute_actions(observations(50), explore=False)
    np.testing.assert_array_equal(actions, greedy[:50])


def test_stochastic_sampling_logp_matches_the_distribution():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    obs = observations(500)
    actions, _, extra = policy.compute_actions(obs, explore=True)
    np.testing.assert_allclose(
        extra["action_logp"], policy.compute_log_likelihoods(actions, obs), rtol=1e-5
    )
    logits = extra["action_dist_inputs"].astype(np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        extra["action_logp"], log_softmax[np.arange(500), actions], rtol=1e-5, atol=1e-6
    )


def test_stochastic_sampling_draws_follow_the_probabilities():
    # A freshly built model has near-uniform logits (orthogonal init, gain 0.01).
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    actions, _, extra = policy.compute_actions(np.zeros((3000, 4), np.float32), explore=True)
    probs = np.exp(extra["action_logp"])
    counts = np.bincount(actions, minlength=3) / 3000
    expected = [probs[actions == a][0] for a in range(3)]
    np.testing.assert_allclose(counts, expected, atol=0.04)


def test_same_seed_same_draws_and_draws_advance():
    a = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(seed=7))
    b = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(seed=7))
    obs = observations(200)
    first_a, _, _ = a.compute_actions(obs, explore=True)
    first_b, _, _ = b.compute_actions(obs, explore=True)
    np.testing.assert_array_equal(first_a, first_b)
    second_a, _, _ = a.compute_actions(obs, explore=True)
    assert not np.array_equal(first_a, second_a)


def test_box_actions_explore_false_gives_the_mean():
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = PGPolicy(OBS_SPACE, space, small_config())
    actions, _, extra = policy.compute_actions(observations(16), explore=False)
    assert actions.shape == (16, 2) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions, extra["action_dist_inputs"][:, :2])
    sampled, _, _ = policy.compute_actions(observations(16), explore=True)
    assert not np.allclose(sampled, actions)
