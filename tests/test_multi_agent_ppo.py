"""PPO with `policies`: each trained policy learns on its own rows, an untrained one
keeps its weights bit-identical, results count env and agent steps and each policy's
return; on TwoMapsEnv two mapped policies, or one shared policy, learn each map; PPO with
an LSTM trains on it (recurrent multi-agent sampling: test_multi_agent_recurrent.py)."""

import numpy as np
import pytest
from multi_agent_envs import (
    A_MAP,
    B_MAP,
    RANDOM_RETURN,
    TwoMapsEnv,
    by_agent,
    greedy_actions,
    train_until_policies_reach,
)
from multi_agent_envs import two_maps_config as config

from algorithms import register_env
from algorithms.ppo import PPO, PPOPolicy
from policy_service import PolicySpec, SampleBatch
from policy_service.config import ConfigError
from policy_service.data.sample_batch import concat_samples
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.multi_agent.env import MultiAgentEnvError
from policy_service.multi_agent.policies import agent_policies

register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))


@pytest.fixture(scope="module")
def one_policy_trained():
    algo = PPO(
        config(train_batch_size=128, minibatch_size=64, num_epochs=1, policies_to_train=["pa"])
    )
    before = {p: algo.get_policy(p).get_weights() for p in ("pa", "pb")}
    result = algo.train()
    yield algo, before, result
    algo.stop()


def test_a_policy_not_trained_keeps_its_weights_bit_identical(one_policy_trained):
    algo, before, result = one_policy_trained
    after = {p: algo.get_policy(p).get_weights() for p in ("pa", "pb")}
    assert all(np.array_equal(before["pb"][k], after["pb"][k]) for k in before["pb"])
    assert any(not np.array_equal(before["pa"][k], after["pa"][k]) for k in before["pa"])
    assert any(k.startswith("pa/") for k in result) and not any(k.startswith("pb/") for k in result)


def test_results_count_agent_steps_twice_the_env_steps(one_policy_trained):
    algo, _, result = one_policy_trained
    assert result["timesteps_total"] == 128 and result["agent_timesteps_total"] == 2 * 128
    assert set(result["policy_reward_mean"]) == {"pa", "pb"}
    assert result["episode_return_mean"] == pytest.approx(
        sum(result["policy_reward_mean"].values())
    )
    assert isinstance(algo.get_policy("pb"), PPOPolicy)
    with pytest.raises(KeyError, match=r"no policy 'pc'; policies are \['pa', 'pb'\]"):
        algo.get_policy("pc")


def test_multi_agent_runs_refuse_what_they_do_not_do_yet_in_one_line():
    with pytest.raises(ConfigError, match=r"is a multi-agent env: set config.policies"):
        PPO({"env": "pettingzoo:mpe2.simple_spread_v3"})
    for key, value in (
        ("vectorize_mode", "async"),
        ("observation_filter", "MeanStdFilter"),
        ("external_env", True),
    ):
        with pytest.raises(
            ConfigError,
            match=rf"config.{key} must keep its default with policies set \(not in "
            rf"multi-agent runs yet\), got {value!r}",
        ):
            PPO(config(**{key: value}))
    with pytest.raises(
        MultiAgentEnvError, match=r"needs a multi-agent env, but 'CartPole-v1' made a gymnasium id"
    ):
        PPO(config(env="CartPole-v1"))


@pytest.mark.slow
def test_two_mapped_policies_each_learn_their_own_map():
    algo = PPO(config())
    try:
        result = train_until_policies_reach(algo, ["pa", "pb"])
        assert min(result["policy_reward_mean"].values()) >= 0.8 * 8 > 3 * RANDOM_RETURN, result[
            "policy_reward_mean"
        ]
        assert greedy_actions(algo.get_policy("pa"), 0) == A_MAP
        assert greedy_actions(algo.get_policy("pb"), 1) == B_MAP
    finally:
        algo.stop()


@pytest.mark.slow
def test_one_shared_policy_learns_both_maps_from_the_agent_index():
    algo = PPO(
        config(policies={"shared": None}, policy_mapping_fn=lambda agent, episode, **kw: "shared")
    )
    try:
        result = train_until_policies_reach(algo, ["shared"])
        assert result["policy_reward_mean"]["shared"] >= 0.8 * 8, result["policy_reward_mean"]
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
        shared = algo.get_policy("shared")
        assert greedy_actions(shared, 0) == A_MAP and greedy_actions(shared, 1) == B_MAP
    finally:
        algo.stop()


def test_an_algorithm_without_multi_agent_training_refuses_policies_in_one_line():
    class OnePolicyPPO(PPO):
        def training_step(self) -> dict:  # an own step that trains self.learners only
            return {}

    with pytest.raises(ConfigError) as refused:
        OnePolicyPPO({"env": "two_maps", "policies": {"pa": None}, "policy_mapping_fn": by_agent})
    message = str(refused.value)
    assert "\n" not in message and "policies" in message, message
    assert "OnePolicyPPO trains one policy" in message, message


class ChunksKept:
    """A policy whose postprocess_trajectories inputs are kept in `chunks`."""

    def __init__(self, policy, chunks: list) -> None:
        self.policy, self.chunks = policy, chunks

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def postprocess_trajectories(self, chunks):
        self.chunks.extend(chunks)
        return self.policy.postprocess_trajectories(chunks)


def test_a_policys_chunks_postprocessed_together_match_each_alone():
    """PPO's postprocess_trajectories bootstraps a fragment's chunks in one forward pass:
    the same advantages as each chunk alone."""
    policies = agent_policies(
        {"pa": PolicySpec(config={"seed": 1}), "pb": PolicySpec(config={"seed": 2})},
        by_agent,
        None,
        TwoMapsEnv(),
        PPOPolicy,
        {"model": {"fcnet_hiddens": [8]}},
    )
    worker = RolloutWorker(TwoMapsEnv, policies, num_envs=2, rollout_fragment_length=12, seed=0)
    policy = worker.policies["pa"]
    chunks = []
    worker.sampler.policies = {**worker.policies, "pa": ChunksKept(policy, chunks)}
    batch, _ = worker.sample()
    # 2 sub-envs x (a terminated 8-step episode, 4 steps cut and bootstrapped)
    assert sorted(c.count for c in chunks) == [4, 4, 8, 8]
    alone = concat_samples([policy.postprocess_trajectory(c) for c in chunks])
    together = batch.policy_batches["pa"]
    for column in (SampleBatch.ADVANTAGES, SampleBatch.VALUE_TARGETS):
        np.testing.assert_allclose(together[column], alone[column], rtol=1e-5, atol=1e-6)
    worker.stop()


# ----- sampled in Ray ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [
        {"num_env_runners": 2},
        {"num_env_runners": 2, "remote_inference": True, "num_cpus_per_env_runner": 0.25},
    ],
    ids=["env_runner_actors", "remote_inference"],
)
def test_two_mapped_policies_learn_their_maps_sampled_in_ray(ray_local, sampling):
    algo = PPO(config(**sampling))
    try:
        result = train_until_policies_reach(algo, ["pa", "pb"])
        assert min(result["policy_reward_mean"].values()) >= 0.8 * 8, result["policy_reward_mean"]
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
        assert greedy_actions(algo.get_policy("pa"), 0) == A_MAP
        assert greedy_actions(algo.get_policy("pb"), 1) == B_MAP
    finally:
        algo.stop()


def test_ppo_with_an_lstm_trains_on_a_multi_agent_env():
    algo = PPO(
        config(
            # minibatches of 8 sequences
            model={"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4},
            num_envs_per_env_runner=2,
            rollout_fragment_length=16,
            train_batch_size=64,
            minibatch_size=32,
            num_epochs=2,
        )
    )
    try:
        before = {p: algo.get_policy(p).get_weights() for p in ("pa", "pb")}
        for _ in range(2):
            result = algo.train()
        for policy_id in ("pa", "pb"):
            for loss in ("total_loss", "policy_loss", "vf_loss"):
                assert np.isfinite(result[f"{policy_id}/{loss}"]), (policy_id, loss)
            after = algo.get_policy(policy_id).get_weights()
            assert any(not np.array_equal(before[policy_id][k], after[k]) for k in after)
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"] == 2 * 128
    finally:
        algo.stop()
