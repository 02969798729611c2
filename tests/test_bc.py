"""algorithms/bc.py: the loss is the logged actions' negative log-likelihood (numpy),
no value or return columns are read, two fake GPUs take one device's step, and a
beta other than 0 is refused in one line. BC's learning tests (logged CartPole steps of a
trained PPO; BC against MARWIL on a mix) are in test_marwil.py, beside MARWIL's, which
share their logged data."""

import gymnasium as gym
import numpy as np
import pytest
from fakes import assert_grads_close, assert_weights_close, fake_gpus

from algorithms import get_algorithm_class
from algorithms.bc import BC, BCConfig, BCPolicy
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
TINY = {"seed": 0, "lr": 1e-2, "model": {"fcnet_hiddens": [16]}}


def logged(n: int, seed: int = 0) -> SampleBatch:
    """n logged rows with obs and Box actions only: what BC reads."""
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-2, 2, (n, 2)).astype(np.float32),
        }
    )


def test_the_loss_is_the_negative_log_likelihood_of_the_logged_actions():
    policy = BCPolicy(OBS, BOX, TINY)
    batch = logged(11, seed=1)
    out = policy.model({SampleBatch.OBS: batch[SampleBatch.OBS]}, training=False)
    mean, log_std = np.split(out["action_dist_inputs"].numpy().astype(np.float64), 2, axis=1)
    z = (batch[SampleBatch.ACTIONS] - mean) / np.exp(log_std)
    logp = np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=1)
    _, stats = policy.compute_gradients(batch)
    np.testing.assert_allclose(stats["policy_loss"], -logp.mean(), rtol=1e-5)


def test_cloning_moves_the_mean_action_towards_the_logged_one():
    policy = BCPolicy(OBS, BOX, {**TINY, "lr": 3e-3})
    batch = logged(64, seed=2)
    batch[SampleBatch.ACTIONS] = np.tile(np.float32([1.5, -1.0]), (64, 1))
    first = policy.learn_on_batch(batch)["policy_loss"]
    for _ in range(150):
        last = policy.learn_on_batch(batch)["policy_loss"]
    actions, _, _ = policy.compute_actions(batch[SampleBatch.OBS][:8], explore=False)
    assert last < first - 1.0
    np.testing.assert_allclose(actions, np.tile([1.5, -1.0], (8, 1)), atol=0.2)


def test_two_fake_gpus_take_the_gradient_and_step_of_one_device():
    one, two = BCPolicy(OBS, BOX, TINY), BCPolicy(OBS, BOX, {**TINY, **fake_gpus(2)})
    assert two.devices == ["/CPU:0", "/CPU:1"]
    batch = logged(13, seed=3)  # padded over 2 towers
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    assert_grads_close(g1, g2)
    assert s2["policy_loss"] == pytest.approx(s1["policy_loss"], rel=1e-5)
    for seed in (4, 5):
        one.learn_on_batch(logged(13, seed=seed))
        two.learn_on_batch(logged(13, seed=seed))
        assert_weights_close(one.get_weights(), two.get_weights())


def test_bc_is_registered_and_refuses_a_beta():
    assert get_algorithm_class("bc") is BC
    assert from_dict(BCConfig, {}).beta == 0.0
    with pytest.raises(ConfigError, match="beta must be 0 for BC") as err:
        from_dict(BCConfig, {"beta": 1.0})
    assert "\n" not in str(err.value)
