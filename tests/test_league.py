"""Policies added and removed during a run (Algorithm.add_policy / remove_policy, RLlib's
names), so a league can be built: a new policy acts and trains from the next iteration,
a removed one is gone from the learners, the results and the next checkpoint; a bad
change is one line with the run unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import assert_one_line
from multi_agent_envs import TwoMapsEnv, two_maps_config

from algorithms import register_env
from algorithms.dqn import DQN
from algorithms.ppo import PPO
from policy_service.config import ConfigError
from policy_service.io import checkpoints

register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))


def b_plays_pc(agent, episode, **kwargs):
    return "pa" if agent == "a" else "pc"


def b_plays_pb(agent, episode, **kwargs):
    return "pa" if agent == "a" else "pb"


def small_ppo() -> PPO:
    return PPO(
        two_maps_config(
            train_batch_size=64, minibatch_size=32, num_epochs=1, model={"fcnet_hiddens": [8]}
        )
    )


def weights(algo, policy_id) -> dict:
    return {k: v.copy() for k, v in algo.get_policy(policy_id).get_weights().items()}


def unchanged(before: dict, after: dict) -> bool:
    return all(np.array_equal(before[k], after[k]) for k in before)


def test_an_added_policy_acts_and_trains_from_the_next_iteration_and_a_removed_one_is_gone(
    tmp_path,
):
    algo = small_ppo()
    try:
        algo.train()
        start = algo.get_policy("pb").get_state()
        added = algo.add_policy("pc", policy_state=start, policy_mapping_fn=b_plays_pc)
        assert added is algo.get_policy("pc")
        assert unchanged(start["weights"], weights(algo, "pc"))  # it starts as pb was
        pb_before = weights(algo, "pb")
        result = algo.train()
        assert "pc" in result["policy_reward_mean"]  # b played pc (pb: the window's past)
        assert not unchanged(start["weights"], weights(algo, "pc"))  # and pc learned
        assert unchanged(pb_before, weights(algo, "pb"))  # pb had no rows
        path = algo.save(str(tmp_path / "with_pc"))
        assert checkpoints.read_algorithm_state(path)["policy_ids"] == ["pa", "pb", "pc"]

        algo.remove_policy("pc", policy_mapping_fn=b_plays_pb)
        with pytest.raises(KeyError):
            algo.get_policy("pc")
        result = algo.train()
        assert set(result["policy_reward_mean"]) == {"pa", "pb"}
        path = algo.save(str(tmp_path / "without_pc"))
        assert checkpoints.read_algorithm_state(path)["policy_ids"] == ["pa", "pb"]
        assert sorted(algo.config.policies) == ["pa", "pb"]
    finally:
        algo.stop()


def test_bad_changes_are_one_line_and_leave_the_run_as_it_was():
    algo = small_ppo()
    try:
        algo.train()
        before = {p: weights(algo, p) for p in ("pa", "pb")}
        with pytest.raises(ConfigError) as err:
            algo.add_policy("pa")
        assert_one_line(err.value, "add_policy", "'pa'", "already")
        with pytest.raises(ConfigError) as err:
            algo.remove_policy("pz")
        assert_one_line(err.value, "remove_policy", "'pz'")
        # b mapped to a policy that is not there: refused before anything changes
        with pytest.raises(ConfigError) as err:
            algo.remove_policy("pb")
        assert_one_line(err.value, "'pb'")
        assert sorted(algo.config.policies) == ["pa", "pb"]
        assert sorted(algo.policy_learners.groups) == ["pa", "pb"]
        assert all(unchanged(before[p], weights(algo, p)) for p in before)
        algo.train()  # the run goes on
    finally:
        algo.stop()


def test_a_single_policy_run_refuses_in_one_line():
    algo = PPO({"env": "CartPole-v1", "train_batch_size": 64, "minibatch_size": 32})
    try:
        with pytest.raises(ConfigError) as err:
            algo.add_policy("other")
        assert_one_line(err.value, "add_policy", "config.policies")
    finally:
        algo.stop()


def test_an_added_off_policy_policy_gets_its_own_replay_buffer_and_the_others_keep_theirs():
    algo = DQN(
        {
            **two_maps_config(model={"fcnet_hiddens": [8]}),
            "hiddens": [8],
            "train_batch_size": 16,
            "minibatch_size": None,
            "num_epochs": 1,
            "num_steps_sampled_before_learning_starts": 32,
            "min_sample_timesteps_per_iteration": 64,
        }
    )
    try:
        algo.train()
        kept = {p: algo.replays[p] for p in ("pa", "pb")}
        sizes = {p: len(r) for p, r in kept.items()}
        algo.add_policy("pc", policy_mapping_fn=b_plays_pc)
        assert all(algo.replays[p] is kept[p] and len(kept[p]) == sizes[p] for p in kept)
        assert len(algo.replays["pc"]) == 0
        algo.train()
        assert len(algo.replays["pc"]) > 0 and len(algo.replays["pb"]) == sizes["pb"]
    finally:
        algo.stop()
