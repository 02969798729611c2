"""ExportedPolicy: the tar GET /v1/model sends, loaded and acting as the policy does."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from fakes import PGPolicy

from policy_service.client.exported_policy import ExportedModelError, ExportedPolicy, pack_model
from policy_service.io.export import export_saved_model

ENV = gym.make("CartPole-v1")


@pytest.fixture(scope="module")
def policy_and_tar(tmp_path_factory):
    policy = PGPolicy(
        ENV.observation_space, ENV.action_space, {"seed": 0, "model": {"fcnet_hiddens": [16]}}
    )
    directory = tmp_path_factory.mktemp("export")
    export_saved_model(policy, str(directory / "model"))
    return policy, pack_model(directory, weights_version=7, global_timestep=300)


def test_it_acts_as_the_policy_for_any_batch_size(policy_and_tar):
    policy, tar = policy_and_tar
    exported = ExportedPolicy.from_tar(tar, 7, ENV.observation_space, explore=False)
    assert (exported.weights_version, exported.global_timestep) == (7, 300)
    rng = np.random.default_rng(0)
    for rows in (1, 5, 1):  # one concrete function serves every batch size
        obs = rng.normal(size=(rows, 4)).astype(np.float32)
        actions, states = exported.act(
            obs, [], np.zeros(rows, np.int64), np.zeros(rows, np.float32), 0
        )
        np.testing.assert_array_equal(actions, policy.compute_actions(obs, explore=False)[0])
        assert states == []


def test_exploring_draws_differ_between_calls(policy_and_tar):
    _, tar = policy_and_tar
    exported = ExportedPolicy.from_tar(tar, 7, ENV.observation_space)
    obs = np.zeros((64, 4), np.float32)
    draws = [exported.act(obs, [], np.zeros(64, np.int64), np.zeros(64, np.float32), 0)[0]]
    draws.append(exported.act(obs, [], np.zeros(64, np.int64), np.zeros(64, np.float32), 0)[0])
    assert not np.array_equal(*draws)  # 64 near-even coin flips twice alike: p = 2^-64


def test_a_model_of_another_version_is_refused(policy_and_tar):
    _, tar = policy_and_tar
    with pytest.raises(ExportedModelError, match="weights_version: expected 8 .* got 7"):
        ExportedPolicy.from_tar(tar, 8, ENV.observation_space)
    with pytest.raises(ExportedModelError, match="not a tar"):
        ExportedPolicy.from_tar(b"not a tar", 7, ENV.observation_space)


def test_a_nested_action_space_comes_back_nested(tmp_path):
    space = gym.spaces.Dict(
        {"move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "pick": gym.spaces.Discrete(3)}
    )
    policy = PGPolicy(
        ENV.observation_space,
        space,
        {
            "seed": 0,
            "model": {
                "fcnet_hiddens": [16],
                "use_lstm": True,
                "lstm_cell_size": 8,
                "lstm_use_prev_action": True,
            },
        },
    )
    export_saved_model(policy, str(tmp_path / "model"))
    tar = pack_model(tmp_path, weights_version=1, global_timestep=0)
    exported = ExportedPolicy.from_tar(tar, 1, ENV.observation_space, False, action_space=space)
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    prev = {"move": np.full((3, 2), 0.5, np.float32), "pick": np.array([0, 2, 1])}
    states = policy.get_initial_state()
    state_batch = [np.repeat(s[None], 3, axis=0) for s in states]
    actions, state_outs = exported.act(obs, state_batch, prev, np.zeros(3, np.float32), 0)
    expected, expected_states, _ = policy.compute_actions(
        obs, state_batch, prev, np.zeros(3, np.float32), explore=False
    )
    assert set(actions) == {"move", "pick"}
    np.testing.assert_array_equal(actions["pick"], expected["pick"])
    np.testing.assert_allclose(actions["move"], expected["move"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state_outs[0], expected_states[0], rtol=1e-6, atol=1e-6)
