"""exploration.py: RLlib's GaussianNoise schedule and OrnsteinUhlenbeckNoise (checked
against the OU recursion by hand), and user exploration classes by class, by
"module.Class" and by registered name. A replay config's random_timesteps (TD3's):
test_td3.py; an algorithm's config JSON naming a class type: test_algorithm.py."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config

from policy_service.config import ConfigError
from policy_service.policy import exploration
from policy_service.policy.distributions import dist_class_for
from policy_service.policy.exploration import (
    Exploration,
    GaussianNoise,
    OrnsteinUhlenbeckNoise,
    StochasticSampling,
)

WIDE = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
BOX_OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX_ACTIONS = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def seed(i: int) -> tf.Tensor:
    return tf.constant([7, i], tf.int64)


def greedy_zeros(rows: int):
    return dist_class_for(WIDE, deterministic=True)(tf.zeros((rows, 2)))


@pytest.mark.parametrize(
    "timestep, expected", [(0, 1.0), (10, 1.0), (60, 0.51), (110, 0.02), (10**6, 0.02)]
)
def test_noise_scale_holds_through_the_random_steps_then_falls_linearly(timestep, expected):
    noise = GaussianNoise(
        WIDE, random_timesteps=10, initial_scale=1.0, final_scale=0.02, scale_timesteps=100
    )
    assert float(noise.scale(tf.constant(timestep, tf.int64))) == pytest.approx(expected)


def test_gaussian_noise_is_scale_times_stddev_times_a_normal_draw():
    noise = GaussianNoise(
        WIDE, stddev=0.5, random_timesteps=0, initial_scale=2.0, final_scale=0.0, scale_timesteps=4
    )
    actions, logp = noise.choose(
        greedy_zeros(3), tf.constant(True), tf.constant(1, tf.int64), seed(0)
    )
    draw = tf.random.stateless_normal([3, 2], seed(0)).numpy()
    np.testing.assert_allclose(actions.numpy(), 1.5 * 0.5 * draw, rtol=1e-6)  # scale 1.5 at t=1
    np.testing.assert_array_equal(logp.numpy(), np.zeros(3, np.float32))


def test_rllibs_td3_exploration_config_is_accepted():
    config = {
        "type": "GaussianNoise",
        "stddev": 0.1,
        "initial_scale": 1.0,
        "final_scale": 1.0,
        "scale_timesteps": 1,
        "random_timesteps": 0,
    }
    assert exploration.exploration_config_error(config) is None
    assert exploration.make_exploration(WIDE, config).get_state() == config


def test_ou_noise_follows_the_recursion_by_hand():
    theta, sigma, base = 0.15, 0.2, 0.1
    ou = OrnsteinUhlenbeckNoise(
        WIDE,
        ou_theta=theta,
        ou_sigma=sigma,
        ou_base_scale=base,
        random_timesteps=5,
        final_scale=1.0,
    )
    assert ou.ou_state == [0.0, 0.0]
    dist, x = greedy_zeros(3), np.zeros(2)
    # before random_timesteps the actions are uniform and the process stays put
    ou.choose(dist, tf.constant(True), tf.constant(2, tf.int64), seed(0))
    assert ou.ou_state == [0.0, 0.0]
    for t in range(1, 30):
        actions, logp = ou.choose(dist, tf.constant(True), tf.constant(5 + t, tf.int64), seed(t))
        draw = tf.random.stateless_normal([2], seed(t)).numpy()
        x = x + theta * -x + sigma * draw
        expected = base * x * 20.0  # scale 1, range high - low = 20
        np.testing.assert_allclose(actions.numpy(), np.tile(expected, (3, 1)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ou.ou_state, x, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(logp.numpy(), np.zeros(3, np.float32))
    # acting greedily gives the greedy action and leaves the process where it was
    state = ou.ou_state
    greedy, _ = ou.choose(dist, tf.constant(False), tf.constant(100, tf.int64), seed(99))
    np.testing.assert_array_equal(greedy.numpy(), np.zeros((3, 2), np.float32))
    assert ou.ou_state == state


def lag_one_correlation(series: np.ndarray) -> float:
    return float(np.corrcoef(series[:-1], series[1:])[0, 1])


def noisy_policy(exploration_config: dict) -> PGPolicy:
    """A policy on Box actions, exploring from its first step (no random timesteps)."""
    exploration_config = {"random_timesteps": 0, **exploration_config}
    return PGPolicy(
        BOX_OBS, BOX_ACTIONS, small_config(model={}, exploration_config=exploration_config)
    )


def noise_series(exploration_config: dict, steps: int = 1000) -> np.ndarray:
    """The first action dimension's noise over `steps` calls of a policy: its noisy
    action minus its greedy one (the Gaussian's mean)."""
    policy = noisy_policy(exploration_config)
    obs = np.zeros((1, 3), np.float32)
    greedy, _, _ = policy.compute_actions(obs, explore=False, timestep=10)
    noisy = [policy.compute_actions(obs, explore=True, timestep=10)[0][0, 0] for _ in range(steps)]
    return np.asarray(noisy) - greedy[0, 0]


@pytest.mark.slow  # two policies and 2,000 acting calls: ~5 s
def test_ou_noise_is_temporally_correlated_and_gaussian_noise_is_not():
    ou = noise_series({"type": "OrnsteinUhlenbeckNoise", "final_scale": 1.0})
    # an AR(1) process x' = (1 - theta) x + sigma e: lag-one correlation 1 - theta = 0.85
    assert lag_one_correlation(ou) == pytest.approx(0.85, abs=0.05)
    assert np.abs(ou).max() > 0
    gaussian = noise_series({"type": "GaussianNoise", "stddev": 0.1})
    assert abs(lag_one_correlation(gaussian)) < 0.1


def test_ou_state_is_part_of_the_policy_state():
    config = {"type": "OrnsteinUhlenbeckNoise"}
    source = noisy_policy(config)
    obs = np.zeros((2, 3), np.float32)
    for _ in range(5):
        source.compute_actions(obs, explore=True, timestep=50)
    state = source.get_state()
    assert state["exploration"]["type"] == "OrnsteinUhlenbeckNoise"
    assert state["exploration"]["ou_state"] == source.exploration.ou_state != [0.0, 0.0]
    target = noisy_policy(config)
    target.set_state(state)
    assert target.exploration.ou_state == source.exploration.ou_state
    a, _, _ = source.compute_actions(obs, explore=True, timestep=50)
    b, _, _ = target.compute_actions(obs, explore=True, timestep=50)
    np.testing.assert_array_equal(a, b)


def test_a_bad_ou_state_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"ou_state must hold 2 numbers .*got \[1.0\]"):
        exploration.make_exploration(WIDE, {"type": "OrnsteinUhlenbeckNoise", "ou_state": [1.0]})
    error = exploration.exploration_config_error(
        {"type": "OrnsteinUhlenbeckNoise", "ou_theta": 2.0}
    )
    assert error == "OrnsteinUhlenbeckNoise options with ou_theta a finite number in [0, 1]"


# ----- user exploration classes -------------------------------------------------------


class AlwaysFirstAction(Exploration):
    """Explores by always taking action `action` (a user's exploration, for the tests)."""

    def __init__(self, action_space, action: int = 0):
        self.action_space = action_space
        self.action = int(action)

    def choose(self, dist, explore, timestep, seed):
        greedy = tf.cast(dist.deterministic_sample(), tf.int64)
        chosen = tf.where(
            explore, tf.fill(tf.shape(greedy), tf.constant(self.action, tf.int64)), greedy
        )
        return chosen, tf.zeros(tf.shape(greedy), tf.float32)


@pytest.mark.parametrize(
    "kind", [AlwaysFirstAction, f"{__name__}.AlwaysFirstAction"], ids=["class", "module.Class"]
)
def test_a_user_class_acts_by_class_or_module_path(kind):
    policy = PGPolicy(
        OBS_SPACE, ACTION_SPACE, small_config(exploration_config={"type": kind, "action": 2})
    )
    obs = np.random.default_rng(0).uniform(-1, 1, (20, 4)).astype(np.float32)
    actions, _, extra = policy.compute_actions(obs, explore=True)
    np.testing.assert_array_equal(actions, np.full(20, 2))
    actions, _, _ = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(actions, np.argmax(extra["action_dist_inputs"], -1))
    state = policy.get_state()["exploration"]
    assert state == {"type": f"{__name__}.AlwaysFirstAction", "action": 2}
    other = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    other.set_state(policy.get_state())
    assert isinstance(other.exploration, AlwaysFirstAction) and other.exploration.action == 2


def test_a_registered_user_class_is_named_by_its_name():
    exploration.register_exploration(AlwaysFirstAction, "AlwaysFirst")
    try:
        made = exploration.make_exploration(ACTION_SPACE, {"type": "AlwaysFirst", "action": 1})
        assert isinstance(made, AlwaysFirstAction) and made.action == 1
        assert made.get_state() == {"type": "AlwaysFirst", "action": 1}
    finally:
        exploration.unregister_exploration("AlwaysFirst")
    assert exploration.exploration_config_error({"type": "AlwaysFirst"}) is not None
    with pytest.raises(TypeError, match="subclass of policy.exploration.Exploration"):
        exploration.register_exploration(dict)


@pytest.mark.parametrize(
    "kind, detail",
    [
        (
            "not_imported_module.Noise",
            " (module 'not_imported_module' is not imported: --import it)",
        ),
        (f"{__name__}.NoSuchClass", ""),
        (dict, ""),
        (f"{__name__}.lag_one_correlation", ""),
    ],
)
def test_a_type_that_is_no_exploration_is_one_line_naming_the_key(kind, detail):
    with pytest.raises(ConfigError) as err:
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(exploration_config={"type": kind}))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "config.exploration_config must be a dict whose 'type' is one of ['EpsilonGreedy', "
        "'GaussianNoise', 'OrnsteinUhlenbeckNoise', 'StochasticSampling'"
    )
    assert "an Exploration subclass or 'module.Class' of an imported module" + detail in message


def test_user_class_options_are_checked_against_its_signature():
    error = exploration.exploration_config_error({"type": AlwaysFirstAction, "epsilon": 0.1})
    assert error == (
        f"'type' plus options from ['action'] for {__name__}.AlwaysFirstAction "
        "(unknown: ['epsilon'])"
    )
    assert StochasticSampling(ACTION_SPACE).get_state() == {
        "type": "StochasticSampling",
        "random_timesteps": 0,
    }


def test_a_class_type_is_named_for_json():
    named = exploration.named_exploration_config({"type": AlwaysFirstAction, "action": 1})
    assert named == {"type": f"{__name__}.AlwaysFirstAction", "action": 1}
    assert exploration.exploration_class(named["type"]) is AlwaysFirstAction
    assert exploration.named_exploration_config({"type": "GaussianNoise"}) == {
        "type": "GaussianNoise"
    }


def test_a_policy_with_a_class_type_checkpoints_and_restores(tmp_path):
    config = small_config(exploration_config={"type": AlwaysFirstAction, "action": 2})
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, config)
    policy.export_checkpoint(str(tmp_path / "ckpt"))  # was: type is not JSON serializable
    restored = PGPolicy.from_checkpoint(str(tmp_path / "ckpt"))
    assert restored.config.exploration_config == {
        "type": f"{__name__}.AlwaysFirstAction",
        "action": 2,
    }
    assert isinstance(restored.exploration, AlwaysFirstAction)
    obs = np.random.default_rng(1).uniform(-1, 1, (5, 4)).astype(np.float32)
    np.testing.assert_array_equal(restored.compute_actions(obs, explore=True)[0], np.full(5, 2))
    np.testing.assert_array_equal(
        restored.compute_actions(obs, explore=False)[0],
        policy.compute_actions(obs, explore=False)[0],
    )
