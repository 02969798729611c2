"""Checkpoints of multi-agent runs (algorithms/multi_agent.py, Algorithm.save/restore):
every policy in policies/<policy id>/, restored bit-identically and continuing as the
saved run does; checkpoints of other policy ids, unsafe ids and corrupt policy files
refused in one line with nothing changed."""

import hashlib
import shutil

import numpy as np
import pytest
from fakes import assert_one_line
from multi_agent_envs import TwoMapsEnv, two_maps_config

from algorithms import register_env
from algorithms.multi_agent import PolicyIdsMismatch
from algorithms.ppo import PPO
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.multi_agent.policies import MultiAgentConfigError

register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))
IDS = ("pa", "pb")


def config(**changes):
    small = {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 2, "lr": 1e-2}
    return two_maps_config(**{**small, "model": {"fcnet_hiddens": [8]}, **changes})


def states(algo, ids=IDS) -> dict:
    return {p: algo.get_policy(p).get_state() for p in ids}


def assert_states_equal(a: dict, b: dict, groups=("weights", "optimizer_variables", "rng")):
    for policy_id in a:
        for group in groups:
            left, right = a[policy_id][group], b[policy_id][group]
            assert sorted(left) == sorted(right), (policy_id, group)
            for name in left:
                assert np.array_equal(left[name], right[name]), (policy_id, group, name)


def file_hashes(directory) -> dict:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run trained one iteration and saved, and a fresh algorithm of the same config."""
    trained, fresh = PPO(config()), PPO(config())
    try:
        trained.train()
        path = trained.save(str(tmp_path_factory.mktemp("run") / "checkpoint_000001"))
        yield trained, fresh, path
    finally:
        trained.stop()
        fresh.stop()


def test_a_checkpoint_holds_every_policy_in_its_own_directory(saved):
    trained, _, path = saved
    state = checkpoints.read_algorithm_state(path)
    assert state["policy_ids"] == list(IDS)
    assert state["agent_policy_ids"] == {"a": "pa", "b": "pb"}
    assert state["agent_timesteps_total"] == 2 * state["timesteps_total"] == 128
    assert state["config"]["policy_mapping_fn"].endswith(":by_agent")
    for policy_id in IDS:
        on_disk = checkpoints.read_policy_state(checkpoints.policy_state_dir(path, policy_id))
        for name, value in trained.get_policy(policy_id).get_weights().items():
            assert np.array_equal(on_disk["weights"][name], value), (policy_id, name)


def test_restore_is_bit_identical_per_policy_and_training_goes_on_as_saved(saved):
    trained, fresh, path = saved
    before = states(fresh)
    assert any(  # the fresh run's weights differ, so the restore has something to do
        not np.array_equal(before["pa"]["weights"][k], v)
        for k, v in trained.get_policy("pa").get_weights().items()
    )
    fresh.restore(path)
    assert_states_equal(states(fresh), states(trained))
    assert (fresh.iteration, fresh.timesteps_total, fresh.agent_timesteps_total) == (1, 64, 128)
    continued, resumed = trained.train(), fresh.train()
    assert_states_equal(states(fresh), states(trained))
    for key in ("timesteps_total", "agent_timesteps_total", "episode_return_mean"):
        assert resumed[key] == continued[key], key
    assert resumed["policy_reward_mean"] == continued["policy_reward_mean"]
    assert resumed["iteration"] == 2


def test_a_checkpoint_of_other_policy_ids_is_refused_with_nothing_changed(saved):
    _, _, path = saved
    directory = checkpoints.Path(path)
    files = file_hashes(directory)
    other = PPO(
        config(
            policies={"pa": None, "pc": None},
            policy_mapping_fn=lambda a, e, **k: "p" + {"a": "a", "b": "c"}[a],
        )
    )
    try:
        before = states(other, ("pa", "pc"))
        with pytest.raises(PolicyIdsMismatch) as refused:
            other.restore(path)
        assert_one_line(refused.value, "policies ['pa', 'pb']", "expects policies ['pa', 'pc']")
        assert_states_equal(states(other, ("pa", "pc")), before)
        assert other.iteration == 0
    finally:
        other.stop()
    single = PPO({"env": "CartPole-v1", "train_batch_size": 64, "minibatch_size": 32})
    try:
        with pytest.raises(PolicyIdsMismatch) as refused:
            single.restore(path)
        assert_one_line(refused.value, "holds policies ['pa', 'pb']", "one policy")
    finally:
        single.stop()
    assert file_hashes(directory) == files


def test_a_corrupt_policy_file_is_refused_before_any_policy_changes(saved, tmp_path):
    trained, _, path = saved
    copy = tmp_path / "checkpoint_000001"
    shutil.copytree(path, copy)
    (copy / "policies" / "pb" / checkpoints.POLICY_ARRAYS).write_bytes(b"not an npz")
    other = PPO(config())
    try:
        before = states(other)
        with pytest.raises(CheckpointFileError) as refused:
            other.restore(str(copy))
        assert_one_line(refused.value, "pb", checkpoints.POLICY_ARRAYS)
        assert_states_equal(states(other), before)  # pa, read first, is not set either
    finally:
        other.stop()


def test_policy_ids_that_are_no_safe_directory_name_are_refused_in_one_line():
    for bad in ("../x", ".hidden", "a/b", "", "x" * 101):
        with pytest.raises(MultiAgentConfigError) as refused:
            PPO(config(policies={bad: None}, policy_mapping_fn=lambda a, e, bad=bad, **k: bad))
        assert_one_line(refused.value, "config.policies", "not a safe directory name")


def test_from_checkpoint_refuses_a_run_whose_mapping_is_code(saved):
    _, _, path = saved
    with pytest.raises(CheckpointFileError) as refused:
        PPO.from_checkpoint(path)
    assert_one_line(refused.value, "policy_mapping_fn", "restore()")
