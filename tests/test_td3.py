"""algorithms/td3.py: delayed actor and target updates, target policy smoothing against
a numpy computation, Gaussian exploration within the bounds, the exported model with OU
noise, and bad input."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from algorithms import get_algorithm_class
from algorithms.td3 import TD3, TD3Config, TD3Policy
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.policy.exploration import Exploration

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
TINY = {
    "seed": 0,
    "actor_hiddens": [8],
    "critic_hiddens": [8],
    "tau": 0.5,
    "num_steps_sampled_before_learning_starts": 0,
}


def batch(n: int, seed: int = 0) -> SampleBatch:
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-2, 2, (n, 2)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            "bootstrap_discount": np.full(n, 0.99, np.float32),
        }
    )


@pytest.fixture(scope="module")
def policy():
    """No smoothing noise, so that the target value can be computed by hand."""
    return TD3Policy(OBS, BOX, {**TINY, "target_noise": 0.0})


def changed(before: dict, after: dict, part: str) -> bool:
    return any(not np.array_equal(before[k], after[k]) for k in after if part in k)


def test_the_actor_and_the_targets_move_every_policy_delay_steps(policy):
    # policy_delay 2, targets every 2 steps
    history = [(policy.get_weights(), policy.get_target_weights())]
    for seed in range(4):
        policy.learn_on_batch(batch(16, seed))
        history.append((policy.get_weights(), policy.get_target_weights()))
    for step in range(1, 5):
        (w0, t0), (w1, t1) = history[step - 1], history[step]
        assert changed(w0, w1, "critic_")
        assert changed(w0, w1, "actor_") == (step % 2 == 0), step
        assert changed(t0, t1, "critic_") == (step % 2 == 0), step
    assert policy.get_state()["steps_applied"] == 4


def test_the_smoothed_target_action_is_the_target_actors_plus_clipped_noise(policy):
    # after the steps of the test above: the targets moved, twice, halfway
    target = policy.get_target_weights()
    next_obs = batch(5, 3)[SampleBatch.NEXT_OBS]

    def dense(x, prefix, layer):
        kernel = next(v for k, v in target.items() if k.endswith(f"{prefix}_{layer}/kernel"))
        bias = next(v for k, v in target.items() if k.endswith(f"{prefix}_{layer}/bias"))
        return x @ kernel + bias

    def mlp(x, prefix):
        return dense(np.maximum(dense(x, prefix, "dense_0"), 0), prefix, "out")

    action = 2.0 * np.tanh(mlp(next_obs, "actor"))  # no noise: the target actor's action
    x = np.concatenate([next_obs, action], axis=1)
    hand = np.minimum(mlp(x, "critic_0"), mlp(x, "critic_1"))[:, 0]
    value = policy.smoothed_target_value(policy.model, tf.constant(next_obs))
    np.testing.assert_allclose(value.numpy(), hand, rtol=1e-5, atol=1e-5)


def test_exploration_adds_noise_within_the_bounds_and_acts_greedily_without_it():
    policy = TD3Policy(
        OBS, BOX, {**TINY, "exploration_config": {"type": "GaussianNoise", "stddev": 1.0}}
    )
    obs = np.zeros((500, 3), np.float32)
    greedy, _, _ = policy.compute_actions(obs, explore=False, timestep=10)
    noisy, _, extra = policy.compute_actions(obs, explore=True, timestep=10)
    assert np.all(greedy == greedy[0])  # one observation, one action
    assert np.all((noisy >= -2.0) & (noisy <= 2.0))
    spread = noisy - greedy
    assert 0.6 < np.std(spread[np.abs(noisy).max(axis=1) < 2.0]) < 1.2
    np.testing.assert_array_equal(extra[SampleBatch.ACTION_LOGP], np.zeros(500, np.float32))


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("policy_delay", 0, "config.policy_delay must be an integer >= 1, got 0"),
        ("target_noise", -0.1, "config.target_noise must be a finite number >= 0, got -0.1"),
        ("target_noise_clip", -1.0, "config.target_noise_clip must be"),
        ("tau", 0.0, r"config.tau must be a finite number in \(0, 1\]"),
    ],
)
def test_bad_td3_keys_are_one_line_errors_naming_them(key, value, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(TD3Config, {key: value})


def test_td3_on_a_discrete_space_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"TD3 needs a 1-D float Box .* got Discrete\(2\)"):
        TD3Policy(OBS, gym.spaces.Discrete(2), TINY)
    assert get_algorithm_class("td3") is TD3


@pytest.mark.slow  # builds TD3 (~5 s) and compiles its steps in one iteration: ~10-15 s
def test_td3_runs_an_iteration_with_ornstein_uhlenbeck_noise():
    algo = TD3(
        {
            "env": "Pendulum-v1",
            "seed": 0,
            "actor_hiddens": [16],
            "critic_hiddens": [16],
            "train_batch_size": 32,
            "num_steps_sampled_before_learning_starts": 50,
            "min_sample_timesteps_per_iteration": 100,
            "rollout_fragment_length": 25,
            "exploration_config": {"type": "OrnsteinUhlenbeckNoise", "final_scale": 1.0},
        }
    )
    try:
        assert algo.config.exploration_config["random_timesteps"] == 50  # the replay loop's
        result = algo.train()
        assert result["timesteps_total"] >= 100
        assert np.isfinite(result["critic_loss"]) and np.isfinite(result["actor_loss"])
        acting = algo.env_runners.local_worker.policy.exploration
        assert type(acting).__name__ == "OrnsteinUhlenbeckNoise"
        assert np.abs(acting.ou_state).max() > 0  # the process moved after step 50
    finally:
        algo.stop()


def test_its_exported_model_acts_greedily_and_keeps_the_ou_noise_state(tmp_path):
    """TD3's deterministic actor, exported with the exploration's own state (the OU
    process); the library's side of it (any policy): tests/test_export.py."""
    from policy_service.io.export import SIGNATURE_NAME

    config = {
        **TINY,
        "exploration_config": {"type": "OrnsteinUhlenbeckNoise", "final_scale": 1.0},
    }
    policy = TD3Policy(OBS, BOX, config)
    obs = np.zeros((2, 3), np.float32)
    policy.compute_actions(obs, explore=True, timestep=5)  # the OU state moves off zero
    policy.export_model(str(tmp_path / "saved"))
    signature = tf.saved_model.load(str(tmp_path / "saved")).signatures[SIGNATURE_NAME]
    asked = signature.structured_input_signature[1]

    def act(explore: bool):
        named = {
            "obs": obs,
            "explore": np.bool_(explore),
            "timestep": np.int64(5),
            "seed": np.asarray((1, 2), np.int64),
        }
        return signature(**{k: tf.constant(named[k]) for k in asked})["actions"].numpy()

    greedy, _, _ = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(act(False), greedy, rtol=1e-5, atol=1e-5)
    noise = act(True) - greedy
    assert np.all(np.abs(noise) > 0)
    np.testing.assert_allclose(noise[0], noise[1], rtol=1e-5, atol=1e-6)  # one process, all rows


def test_each_losss_rate_follows_its_own_schedule():
    """TD3's rates are per loss (RLlib's keys), each a number or a schedule: each
    optimizer follows its own, read back at chosen timesteps (tests/test_schedules.py:
    the policy-wide lr_schedule)."""
    from piecewise import rllib_value

    schedule = [[100, 1e-3], [1100, 3e-4], [5100, 5e-5]]
    td3 = TD3Policy(OBS, BOX, {**TINY, "critic_lr": schedule})
    for t in [0, 350, 1100, 3333, 9000]:
        td3.global_timestep = t
        td3.learn_on_batch(batch(8))
        actor, critic = (o.learning_rate.numpy() for o in td3.towers.optimizers)
        assert (actor, critic) == (np.float32(1e-3), rllib_value(schedule, t)), t


def test_the_policy_wide_lr_schedule_is_refused():
    """Its optimizers take their own rates (actor_lr, critic_lr), not lr_schedule."""
    with pytest.raises(ConfigError, match=r"config.lr_schedule is not supported by TD3Policy"):
        TD3Policy(OBS, BOX, {**TINY, "lr_schedule": [[0, 1e-3]]})


@pytest.mark.parametrize(
    "key, value, what",
    [
        ("actor_lr", [[0, 1e-3], [10, 0.0]], "(a rate is 0.0)"),
        ("critic_lr", [[5, 1e-3], [1, 1e-4]], "entry 1's 1 comes after 5"),
    ],
)
def test_a_bad_per_loss_rate_is_one_line_naming_the_key(key, value, what):
    with pytest.raises(ConfigError) as err:
        from_dict(TD3Config, {key: value})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"config.{key} must be ")
    assert what in message and f"got {value!r}" in message


class ShiftedGreedy(Exploration):
    """Explores by shifting the greedy continuous action by `shift`; takes no
    random_timesteps (a user's exploration, for the tests)."""

    def __init__(self, action_space, shift: float = 0.5):
        self.shift = float(shift)

    def choose(self, dist, explore, timestep, seed):
        greedy = dist.deterministic_sample()
        chosen = tf.where(explore, greedy + self.shift, greedy)
        return chosen, tf.zeros(tf.shape(greedy)[:1], tf.float32)


def test_replay_random_timesteps_go_only_to_a_type_that_takes_them():
    """num_steps_sampled_before_learning_starts becomes the exploration's random_timesteps
    where the exploration type takes them (explorations: tests/test_exploration_noise.py)."""

    def config(exploration_config: dict) -> dict:
        return {
            **TINY,
            "num_steps_sampled_before_learning_starts": 30,
            "exploration_config": exploration_config,
        }

    policy = TD3Policy(OBS, BOX, config({"type": ShiftedGreedy, "shift": 0.25}))
    assert policy.config.exploration_config == {"type": ShiftedGreedy, "shift": 0.25}
    obs = np.zeros((2, 3), np.float32)
    greedy, _, _ = policy.compute_actions(obs, explore=False)
    shifted, _, _ = policy.compute_actions(obs, explore=True, timestep=0)
    np.testing.assert_allclose(shifted, greedy + 0.25, rtol=1e-6)
    gaussian = TD3Policy(OBS, BOX, config({"type": "GaussianNoise"}))
    assert gaussian.config.exploration_config["random_timesteps"] == 30
    assert gaussian.exploration.random_timesteps == 30
    own = TD3Policy(OBS, BOX, config({"random_timesteps": 5}))
    assert own.config.exploration_config["random_timesteps"] == 5
