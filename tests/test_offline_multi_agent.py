"""Multi-agent offline data keyed by policy id: a multi-agent run's `output` writes each
policy's rows under its id, and a run with `input` and `policies` trains each policy on
its own rows, spaces from the manifest (algorithms/multi_agent_offline.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from multi_agent_envs import TwoMapsEnv, by_agent
from offline_datasets import multi_agent_bc_config, scripted_output

from algorithms import register_env
from algorithms.bc import BC, BCConfig, BCPolicy
from algorithms.marwil import MARWIL
from algorithms.multi_agent_offline import offline_multi_agent_runners
from policy_service import PolicySpec
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.policies import agent_policies
from policy_service.offline import OfflineDataError

SMALL = {"model": {"fcnet_hiddens": [16]}, "seed": 0}


def worker_output(directory, fragments: int = 2, fmt: str = "parquet") -> MultiAgentBatch:
    """What a multi-agent run's env runner writes with `output` (PPO acting)."""
    from algorithms.ppo import PPOPolicy

    policies = agent_policies(
        {"pa": None, "pb": None}, by_agent, None, TwoMapsEnv(), PPOPolicy,
        {**SMALL, "output": str(directory), "output_format": fmt},
    )  # fmt: skip
    worker = RolloutWorker(TwoMapsEnv, policies, num_envs=2, rollout_fragment_length=16)
    try:
        from policy_service.multi_agent.batch import concat_multi_agent

        return concat_multi_agent(worker.sample()[0] for _ in range(fragments))
    finally:
        worker.stop()


@pytest.mark.parametrize("fmt", ["parquet", "json"])  # a directory per policy; one per line
def test_each_policy_reads_the_rows_a_multi_agent_run_wrote(tmp_path, fmt):
    """The runners Algorithm builds for `policies` with `input` (the slow tests train)."""
    written = worker_output(tmp_path, fmt=fmt)
    config = from_dict(BCConfig, multi_agent_bc_config(tmp_path, shuffle_buffer_size=0))
    runners, policies = offline_multi_agent_runners(config, BCPolicy, seed=0)
    try:
        batch, metrics = runners.sample()
    finally:
        runners.stop()
    assert metrics["env_steps"] == 64 and metrics["agent_steps"] == 2 * 64
    for policy_id in ("pa", "pb"):  # its own rows, in the order written
        mine = written.policy_batches[policy_id]
        np.testing.assert_array_equal(
            batch.policy_batches[policy_id][SampleBatch.OBS], mine[SampleBatch.OBS][:64]
        )
        spec = policies.specs[policy_id]  # spaces from the manifest: no env named
        assert spec.observation_space == TwoMapsEnv().observation_spaces["a"]
        assert spec.action_space == TwoMapsEnv().action_spaces["a"]


@pytest.mark.slow  # 6-8 s: MARWIL's postprocessing copies and learners, two policies
def test_marwil_trains_each_policy_too(tmp_path):
    scripted_output(tmp_path, episodes=20, correct=0.5)
    algo = MARWIL(multi_agent_bc_config(tmp_path))
    try:
        before = {p: algo.get_policy(p).get_weights() for p in ("pa", "pb")}
        result = algo.train()
        after = {p: algo.get_policy(p).get_weights() for p in ("pa", "pb")}
    finally:
        algo.stop()
    assert {"pa/vf_loss", "pb/vf_loss"} <= set(result)
    for p in ("pa", "pb"):
        assert any(not np.array_equal(before[p][k], after[p][k]) for k in before[p])


def test_a_policy_without_rows_is_one_line(tmp_path):
    scripted_output(tmp_path, episodes=4, correct=1.0)
    policies = {"pa": None, "pb": None, "pc": None}
    with pytest.raises(OfflineDataError) as err:
        BC(multi_agent_bc_config(tmp_path, policies=policies))
    assert str(err.value) == (
        "config.policies: policy 'pc' has no rows in config.input (its policies: ['pa', 'pb'])"
    )


def test_spaces_that_disagree_with_the_config_are_one_line(tmp_path):
    scripted_output(tmp_path, episodes=4, correct=1.0)
    other = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    policies = {"pa": PolicySpec(observation_space=other), "pb": None}
    with pytest.raises(OfflineDataError) as err:
        BC(multi_agent_bc_config(tmp_path, policies=policies))
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "pa" / "_manifest.json") in message
    assert "policy 'pa': observation_space is Box(0.0, 1.0, (6,), float32) there" in message
    assert str(other) in message


def test_the_env_given_is_checked_against_the_manifest(tmp_path):
    scripted_output(tmp_path, episodes=4, correct=1.0)
    register_env("two_maps_continuous", lambda c: TwoMapsEnv({**c, "continuous": True}))
    with pytest.raises(OfflineDataError) as err:
        BC(multi_agent_bc_config(tmp_path, env="two_maps_continuous"))
    assert "policy 'pa': action_space is Discrete(4) there" in str(err.value)


def test_policies_are_not_added_or_removed_during_an_offline_run(tmp_path):
    scripted_output(tmp_path, episodes=4, correct=1.0)
    algo = BC(multi_agent_bc_config(tmp_path))
    try:
        for change in (lambda: algo.add_policy("pc"), lambda: algo.remove_policy("pb")):
            with pytest.raises(ConfigError) as err:
                change()
            assert "an offline run trains the policies of config.policies" in str(err.value)
        assert sorted(algo.policy_learners.groups) == ["pa", "pb"]
    finally:
        algo.stop()


@pytest.mark.slow  # 12 s on 2 busy cores (load 8), 50 evaluation episodes included
def test_bc_per_policy_learns_each_agents_map(tmp_path):
    """A noisy expert (its agent's target 40% of the time, else uniform: 4.4 of 8 per
    agent) logs 400 episodes; BC per policy recovers each agent's own map, evaluated
    greedily in the env (which the run names for evaluation only): measured 8.0 / 8.0
    for both policies after 5 and after 10 iterations, seeds 0-2. Threshold 7.5: far
    above the behaviour, and a policy trained on the other agent's rows would score 0."""
    register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))
    behaviour = scripted_output(tmp_path, episodes=400, correct=0.4)
    assert 4.0 < behaviour < 4.8
    algo = BC(
        multi_agent_bc_config(
            tmp_path,
            env="two_maps",
            train_batch_size=256,
            minibatch_size=64,
            lr=3e-3,
            shuffle_buffer_size=2048,
            evaluation_interval=10,
            evaluation_duration=50,
            evaluation_config={"explore": False},
        )
    )
    try:
        for _ in range(10):
            result = algo.train()
    finally:
        algo.stop()
    returns = result["evaluation/policy_reward_mean"]
    assert returns["pa"] >= 7.5 and returns["pb"] >= 7.5, returns
