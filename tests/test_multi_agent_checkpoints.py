"""Checkpoints of multi-agent runs (algorithms/multi_agent.py, Algorithm.save/restore):
every policy in policies/<policy id>/, restored bit-identically and continuing as the
saved run does; checkpoints of other policy ids, unsafe ids and corrupt policy files
refused in one line with nothing changed."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from fakes import assert_one_line
from multi_agent_envs import CUES, TwoMapsEnv, two_maps_config

import algorithms.evaluation
from algorithms import register_env
from algorithms.policy_learners import PolicyIdsMismatch
from algorithms.ppo import PPO
from policy_service.cli.commands import EXIT_BAD_INPUT, main
from policy_service.errors import RunFailure
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.io.export import SIGNATURE_NAME
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


def test_restore_is_bit_identical_per_policy_and_every_restore_trains_on_alike(saved):
    trained, fresh, path = saved
    before = states(fresh)
    assert any(  # the fresh run's weights differ, so the restore has something to do
        not np.array_equal(before["pa"]["weights"][k], v)
        for k, v in trained.get_policy("pa").get_weights().items()
    )
    fresh.restore(path)
    assert_states_equal(states(fresh), states(trained))
    assert (fresh.iteration, fresh.timesteps_total, fresh.agent_timesteps_total) == (1, 64, 128)
    trained.restore(path)  # a second restore: both sample from (seed, iteration) on
    try:
        again, resumed = trained.train(), fresh.train()
        assert_states_equal(states(fresh), states(trained))
        for key in ("timesteps_total", "agent_timesteps_total", "episode_return_mean"):
            assert resumed[key] == again[key], key
        assert resumed["policy_reward_mean"] == again["policy_reward_mean"]
        assert resumed["iteration"] == 2
    finally:  # the other tests compare the checkpoint with `trained` as it was saved
        trained.restore(path)


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


# ----- export and evaluate of one policy (algorithms/evaluation.py, --policy) ------------


def cue_observations(agent_index: int) -> np.ndarray:
    """<float32>[CUES, CUES + 2] every cue seen by agent `agent_index`."""
    obs = np.zeros((CUES, CUES + 2), np.float32)
    obs[np.arange(CUES), np.arange(CUES)] = 1.0
    obs[:, CUES + agent_index] = 1.0
    return obs


@pytest.mark.parametrize("policy_id, agent_index", [("pa", 0), ("pb", 1)])
def test_export_of_each_policy_acts_as_that_policy(saved, tmp_path, policy_id, agent_index):
    trained, _, path = saved
    policy = algorithms.evaluation.load_newest_valid(path, with_env=False, policy_id=policy_id)
    out = tmp_path / policy_id
    assert main(["export", path, "--out", str(out), "--policy", policy_id]) == 0
    serve = tf.saved_model.load(str(out)).signatures[SIGNATURE_NAME]
    obs = cue_observations(agent_index)
    exported = serve(
        obs=tf.constant(obs),
        explore=tf.constant(False),
        timestep=tf.constant(0, tf.int64),
        seed=tf.constant([0, 0], tf.int64),
    )
    saved_logits = policy.policy.compute_actions(obs, explore=False)[2]["action_dist_inputs"]
    np.testing.assert_array_equal(exported["action_dist_inputs"].numpy(), saved_logits)
    np.testing.assert_array_equal(
        exported["actions"].numpy(), policy.policy.compute_actions(obs, explore=False)[0]
    )
    # the checkpoint's policy is the run's: the same actions as the algorithm's own
    run_actions = trained.get_policy(policy_id).compute_actions(obs, explore=False)[0]
    assert exported["actions"].numpy().tolist() == np.asarray(run_actions).tolist()


@pytest.mark.parametrize("command", ["export", "evaluate"])
@pytest.mark.parametrize("flag", [[], ["--policy", "pc"]])
def test_a_missing_or_unknown_policy_is_one_line_listing_the_ids(
    saved, tmp_path, capsys, command, flag
):
    _, _, path = saved
    out = ["--out", str(tmp_path / "out")] if command == "export" else []
    assert main([command, path, *out, *flag]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert_one_line(
        ValueError(error), "multi-agent checkpoint of policies ['pa', 'pb']", "--policy"
    )
    assert not (tmp_path / "out").exists()


def test_evaluate_plays_every_agent_with_its_policy_as_mapped_in_training(saved, capsys):
    trained, _, path = saved
    assert main(["evaluate", path, "--policy", "pb", "--episodes", "2", "--seed", "5"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    by_hand = {"pa": [], "pb": []}  # the run's own policies, greedy, on the same seeds
    env = TwoMapsEnv()
    for episode in range(2):
        obs, _ = env.reset(seed=5 + episode)
        returns = {"a": 0.0, "b": 0.0}
        while obs and env.agents:
            actions = {
                a: trained.get_policy("p" + a).compute_single_action(o, explore=False)[0]
                for a, o in obs.items()
            }
            obs, rewards, _, _, _ = env.step(actions)
            for agent, reward in rewards.items():
                returns[agent] += reward
        for agent, value in returns.items():
            by_hand["p" + agent].append(value)
    assert report["policy"] == "pb" and report["episode_lengths"] == [8, 8]
    assert report["policy_reward_mean"] == {p: float(np.mean(r)) for p, r in by_hand.items()}
    assert report["episode_returns"] == [a + b for a, b in zip(by_hand["pa"], by_hand["pb"])]


def policy_files(checkpoint) -> tuple[dict, dict]:
    saved = checkpoints.load_json(Path(checkpoint) / checkpoints.ALGORITHM_STATE)
    return saved, checkpoints.read_policy_states(checkpoint, list(IDS))


def test_a_failure_before_any_policy_learned_leaves_a_final_checkpoint_of_the_last_iteration(
    tmp_path, monkeypatch
):
    """save_after_failure: iteration 2 sampled (counted: env, agent steps, returns),
    then its first policy's update failed; the final checkpoint is iteration 1's, as
    save() wrote it. Once a policy has learned, another's failure leaves none."""
    algo = PPO(config())
    try:
        algo.train()
        whole = algo.save(str(tmp_path / "whole"))
        failing: list = []

        def update_on_batch(learners, train_batch):
            if learners is algo.policy_learners.groups[failing[0]]:
                raise RunFailure(f"{failing[0]}'s learners are gone")
            return PPO.update_on_batch(algo, learners, train_batch)

        monkeypatch.setattr(algo, "update_on_batch", update_on_batch)
        for policy_id, written in (("pa", True), ("pb", False)):
            failing[:] = [policy_id]
            with pytest.raises(RunFailure):
                algo.train()
            assert algo.timesteps_total == 128  # the failed iteration's samples, counted
            final = algo.save_after_failure(str(tmp_path / f"final_{policy_id}"))
            assert (final is not None) == written, policy_id
        expected, expected_states = policy_files(whole)
        found, found_states = policy_files(tmp_path / "final_pa")
        assert found == expected
        assert found["agent_timesteps_total"] == 128 and found["iteration"] == 1
        assert_states_equal(found_states, expected_states)
        assert not (tmp_path / "final_pb").exists()
    finally:
        algo.stop()
