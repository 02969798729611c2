"""Multi-agent sampling beyond the driver: sub-envs stepped in lockstep, env runner
actors (EnvRunnerGroup: weights by policy id, a dead worker replaced) and
remote inference through one MultiPolicyActor (batches per policy, each row acted by
its own policy), with fakes.ReturnsPGPolicy. PPO learning TwoMapsEnv sampled in Ray:
test_multi_agent_ppo.py."""

import asyncio
import os
import signal

import envs
import numpy as np
import pytest
import ray
from fakes import ReturnsPGPolicy
from multi_agent_envs import TwoMapsEnv, by_agent

from policy_service import PolicySpec, SampleBatch
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.multi_policy_actor import MultiPolicyHost
from policy_service.distributed.restarts import RestartablePolicyActor
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.multi_agent.policies import agent_policies
from policy_service.runs.metrics_logger import Stat

BASE = {"model": {"fcnet_hiddens": [8]}}
# different seeds: different initial weights, so a row acted by the wrong policy shows
POLICIES = {"pa": PolicySpec(config={"seed": 1}), "pb": PolicySpec(config={"seed": 2})}


@pytest.fixture(scope="module")
def two_maps_policies():
    return agent_policies(POLICIES, by_agent, None, TwoMapsEnv(), ReturnsPGPolicy, BASE)


class CountingPolicy:
    """A policy whose compute_actions calls are counted."""

    def __init__(self, policy) -> None:
        self.policy, self.calls = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def compute_actions(self, obs, *args, **kwargs):
        self.calls.append(len(obs))
        return self.policy.compute_actions(obs, *args, **kwargs)


# ----- in this process --------------------------------------------------------------------


def test_sub_envs_step_in_lockstep_with_one_forward_pass_per_policy(two_maps_policies):
    worker = RolloutWorker(
        TwoMapsEnv, two_maps_policies, num_envs=3, rollout_fragment_length=10, seed=0
    )
    counted = {p: CountingPolicy(policy) for p, policy in worker.policies.items()}
    worker.sampler.policies = counted
    batch, metrics = worker.sample()
    assert batch.env_steps() == 30 and batch.agent_steps() == 60
    assert (metrics["env_steps"], metrics["agent_steps"]) == (Stat(30, "sum"), Stat(60, "sum"))
    assert {p: c.calls for p, c in counted.items()} == {"pa": [3] * 10, "pb": [3] * 10}
    rows = batch.policy_batches["pa"]
    steps_by_episode = np.unique(np.asarray(rows[SampleBatch.EPS_ID]), return_counts=True)[1]
    # three sub-envs, 8-step episodes: each has one whole episode and 2 steps of the next
    assert sorted(steps_by_episode.tolist()) == [2, 2, 2, 8, 8, 8]
    assert (
        len(metrics["episode_returns"]) == 3 and len(metrics["policy_episode_returns"]["pb"]) == 3
    )
    worker.stop()


def test_a_group_built_with_agent_policies_samples_and_syncs_by_policy_id(two_maps_policies):
    """The one EnvRunnerGroup, given an AgentPolicies, runs its worker here on them:
    fragments by policy id, each policy's returns joined, weights by policy id (some
    policies' sync keeps the others' latest), no observation filter; a policy_config
    beside them is refused in one line."""
    group = EnvRunnerGroup(
        TwoMapsEnv, two_maps_policies, num_envs_per_env_runner=2, rollout_fragment_length=8
    )
    try:
        batch, metrics = group.sample()
        assert {p: rows.count for p, rows in batch.policy_batches.items()} == {"pa": 16, "pb": 16}
        assert metrics["env_steps"] == batch.env_steps() == 16
        assert {p: len(r) for p, r in metrics["policy_episode_returns"].items()} == {
            "pa": 2,
            "pb": 2,
        }
        assert group.filter_stats is None and group.observation_spaces == {
            p: spec.observation_space for p, spec in two_maps_policies.specs.items()
        }
        weights = shifted(group.local_worker.get_weights(), 1.0)
        group.sync_weights({"pa": weights["pa"]}, 3)
        group.sync_weights({"pb": weights["pb"]}, 4)
        assert_weights_equal(group.local_worker.get_weights(), weights)
        assert group.weight_sync.weights.keys() == {"pa", "pb"}
    finally:
        group.stop()
    with pytest.raises(ValueError, match="an AgentPolicies holds each policy's config"):
        EnvRunnerGroup(TwoMapsEnv, two_maps_policies, BASE)


def test_a_multi_policy_host_batches_per_policy_as_each_policy_computes_alone(two_maps_policies):
    host = MultiPolicyHost(
        two_maps_policies.specs, max_batch_size=4, batch_wait_timeout_s=1.0
    )  # 4 one-row requests per policy fill a batch at once: no wait
    rng = np.random.default_rng(0)
    obs = {p: [rng.uniform(0, 1, (1, 6)).astype(np.float32) for _ in range(4)] for p in POLICIES}

    async def main():
        calls = [
            host.compute_actions(o, policy_id=p, explore=False) for p in POLICIES for o in obs[p]
        ]
        return await asyncio.gather(*calls), await host.stats()

    results, stats = asyncio.run(main())
    assert stats["num_requests"] == 8 and stats["num_forward_passes"] == 2
    assert {p: s["num_forward_passes"] for p, s in stats["policies"].items()} == {"pa": 1, "pb": 1}
    weights = asyncio.run(host.get_weights())
    for policy_id, answers in zip(POLICIES, (results[:4], results[4:])):
        alone = two_maps_policies.specs[policy_id].build()
        alone.set_weights(weights[policy_id])
        for o, (actions, _, extra) in zip(obs[policy_id], answers):
            want_actions, _, want = alone.compute_actions(o, explore=False)
            np.testing.assert_array_equal(actions, want_actions)
            np.testing.assert_allclose(
                extra["action_dist_inputs"], want["action_dist_inputs"], rtol=1e-5, atol=1e-6
            )
    name = next(iter(weights["pa"]))
    assert not np.allclose(weights["pa"][name], weights["pb"][name])  # two different policies


def test_a_multi_policy_host_refuses_an_unknown_policy_in_one_line_changing_nothing(
    two_maps_policies,
):
    host = MultiPolicyHost(two_maps_policies.specs, max_batch_size=1)
    before = asyncio.run(host.get_weights())
    obs = np.zeros((1, 6), np.float32)
    with pytest.raises(
        ValueError, match=r"^policy_id: this PolicyActor serves policies \['pa', 'pb'\], got 'pc'$"
    ):
        asyncio.run(host.compute_actions(obs, policy_id="pc"))
    shifted = {p: {k: v + 1.0 for k, v in w.items()} for p, w in before.items()}
    with pytest.raises(ValueError, match=r"got 'pc'$"):
        asyncio.run(host.set_weights({"pa": shifted["pa"], "pc": shifted["pb"]}, 3))
    after = asyncio.run(host.get_weights())
    assert all(np.array_equal(before["pa"][k], after["pa"][k]) for k in before["pa"])
    assert asyncio.run(host.weights_version()) == 0
    assert asyncio.run(host.set_weights({"pb": shifted["pb"]}, 5)) == 5
    _, _, extra = asyncio.run(host.compute_actions(obs, policy_id="pa"))
    assert extra["weights_version"] == 5  # one version for every policy


# ----- env runner actors and the MultiPolicyActor ------------------------------------------


def two_runners(policies, env_creator=TwoMapsEnv, **changes) -> EnvRunnerGroup:
    """2 env runner actors x 2 TwoMapsEnv copies, fragments of 8 steps (one episode)."""
    return EnvRunnerGroup(
        env_creator,
        policies,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=8,
        seed=0,
        **changes,
    )


@pytest.fixture
def group(ray_local, two_maps_policies):
    """Per test: its runners hold 1 of the 2 CPUs, which the learning tests need."""
    group = two_runners(two_maps_policies)
    yield group
    group.stop()


def shifted(weights: dict, by: float) -> dict:
    return {p: {k: v + by for k, v in w.items()} for p, w in weights.items()}


def assert_weights_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for policy_id, weights in want.items():
        for name, value in weights.items():
            np.testing.assert_array_equal(got[policy_id][name], value)


@pytest.mark.slow  # two multi-agent runner actors, one started again: ~30 s here
def test_env_runner_actors_sample_every_policy_take_weights_by_policy_and_are_replaced_with_them(
    group,
):
    """One group for both claims (each group start costs its two actors): the runners
    sample every policy and take weights by policy; then a killed one is replaced
    with every policy's latest weights."""
    batch, metrics = group.sample()
    assert batch.env_steps() == metrics["env_steps"] == 2 * 2 * 8
    assert metrics["agent_steps"] == batch.agent_steps() == 2 * 32
    assert {p: b.count for p, b in batch.policy_batches.items()} == {"pa": 32, "pb": 32}
    assert len(metrics["policy_episode_returns"]["pa"]) == 4  # an episode per sub-env
    weights = shifted(ray.get(group.workers[0].get_weights.remote()), 0.5)
    assert group.sync_weights(weights, 7) == 7
    assert group.weights_versions() == [7, 7]
    for got in ray.get([w.get_weights.remote() for w in group.workers]):
        assert_weights_equal(got, weights)

    # a dead runner is replaced with every policy's latest weights
    weights = shifted(weights, 0.25)
    group.sync_weights(weights, 8)
    before, victim = group.num_restarts, group.workers[1]
    ray.kill(victim)
    batch, metrics = group.sample()
    assert batch.env_steps() == 32 and metrics["num_worker_restarts"] == before + 1
    assert group.workers[1] != victim and group.weights_versions() == [8, 8]
    assert_weights_equal(ray.get(group.workers[1].get_weights.remote()), weights)


@pytest.mark.slow  # two workers started, and replaced twice
def test_a_stand_in_samples_every_policy_until_the_workers_start_then_hands_them_all_weights(
    ray_local, two_maps_policies, tmp_path
):
    """The workers' envs wait for a file: until it is gone a stand-in worker (the envs
    of both) samples in this process; then every worker acts with each policy's latest
    weights: the one replaced after dying while starting, and one replaced after a sync
    of only some policies' weights (the others' latest are sent with them)."""
    hold = tmp_path / "hold"
    hold.touch()
    starting = two_runners(
        two_maps_policies,
        env_creator=envs.env_held_outside_the_driver,
        env_config={"make": TwoMapsEnv, "hold": str(hold), "driver_pid": os.getpid()},
        sample_while_starting=True,
    )
    try:
        batch, metrics = starting.sample()
        assert starting.local_worker is not None and batch.env_steps() == 2 * 2 * 8
        assert {p: b.count for p, b in batch.policy_batches.items()} == {"pa": 32, "pb": 32}
        latest = shifted(starting.local_worker.get_weights(), 0.5)
        assert starting.sync_weights(latest, 5) == 5
        ray.kill(starting.workers[1])  # dies while starting
        envs.release_held_workers(starting, hold)
        batch, metrics = starting.sample()
        assert starting.local_worker is None and batch.env_steps() == 32
        assert metrics["num_worker_restarts"] == 1 and starting.weights_versions() == [5, 5]
        for got in ray.get([w.get_weights.remote() for w in starting.workers]):
            assert_weights_equal(got, latest)
        trained = shifted({"pa": latest["pa"]}, 0.25)  # only "pa" trained
        assert starting.sync_weights(trained, 6) == 6
        latest = {**latest, **trained}
        ray.kill(starting.workers[0])
        _, metrics = starting.sample()
        assert metrics["num_worker_restarts"] == 2 and starting.weights_versions() == [6, 6]
        for got in ray.get([w.get_weights.remote() for w in starting.workers]):
            assert_weights_equal(got, latest)
    finally:
        starting.stop()


@pytest.mark.slow  # a group with its PolicyActor: ~19 s here
def test_remote_inference_acts_each_row_with_its_own_policy(ray_local, two_maps_policies):
    served = two_runners(
        two_maps_policies,
        remote_inference=True,
        num_cpus_per_env_runner=0.25,
        policy_actor_options={"num_cpus": 0.5},
    )
    try:
        weights = {p: spec.build().get_weights() for p, spec in two_maps_policies.specs.items()}
        served.sync_weights(weights, 3)
        batch, _ = served.sample()
        assert served.weights_versions() == [3, 3]
        for policy_id, rows in batch.policy_batches.items():
            alone = two_maps_policies.specs[policy_id].build()
            alone.set_weights(weights[policy_id])
            _, _, want = alone.compute_actions(np.asarray(rows[SampleBatch.OBS]), explore=False)
            np.testing.assert_allclose(
                rows[SampleBatch.ACTION_DIST_INPUTS],
                want["action_dist_inputs"],
                rtol=1e-5,
                atol=1e-6,
            )
            assert "advantages" in rows  # postprocessed by its policy in the actor
        stats = ray.get(served.policy_actor.stats.remote())
        # 8 steps of 2 workers: each worker asks once per policy and step
        assert {p: s["num_requests"] for p, s in stats["policies"].items()} == {"pa": 16, "pb": 16}
    finally:
        served.stop()


@pytest.mark.slow  # the actor started twice
def test_a_restarted_multi_policy_actor_acts_with_every_policys_latest_weights(
    ray_local, two_maps_policies
):
    served = RestartablePolicyActor.of_policies(
        two_maps_policies.specs, max_restarts=1, actor_options={"num_cpus": 0}
    )
    try:
        weights = shifted(ray.get(served.actor.get_weights.remote()), 0.5)
        assert served.set_weights(weights, 6) == 6
        os.kill(ray.get(served.actor.stats.remote())["pid"], signal.SIGKILL)  # Ray restarts it
        obs = np.eye(6, dtype=np.float32)[:2]
        for policy_id in POLICIES:
            _, _, extra = served.compute_actions(obs, policy_id=policy_id, explore=False)
            alone = two_maps_policies.specs[policy_id].build()
            alone.set_weights(weights[policy_id])
            _, _, want = alone.compute_actions(obs, explore=False)
            np.testing.assert_allclose(
                extra[SampleBatch.VF_PREDS], want[SampleBatch.VF_PREDS], rtol=1e-5, atol=1e-6
            )
            assert extra["weights_version"] == 6
        assert served.num_restarts() == 1
        assert_weights_equal(ray.get(served.actor.get_weights.remote()), weights)
    finally:
        served.kill()
