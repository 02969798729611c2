"""IMPALA, APPO and A3C with `policies`: each trained policy learns on its own rows of
multi-agent fragments, an untrained one keeps its weights bit-identical, rows carry
the weights version that acted, results count agent steps and each policy's return;
with `inference: learners` each policy acts through its own learner actors, which are
replaced after a death; each algorithm's two mapped policies learn their maps on
TwoMapsEnv with env runner actors, APPO acting on the learners too (slow)."""

import numpy as np
import pytest
import ray
from fakes import assert_one_line
from multi_agent_envs import (
    A_MAP,
    B_MAP,
    RANDOM_RETURN,
    TwoMapsEnv,
    by_agent,
    greedy_actions,
    train_until_policies_reach,
    two_maps_config,
)

from algorithms import register_env
from algorithms.a3c import A3C
from algorithms.appo import APPO
from algorithms.impala import IMPALA, IMPALAPolicy
from policy_service import PolicySpec
from policy_service.config import ConfigError
from policy_service.distributed.async_learning import AsyncSettings, makes_train_batch
from policy_service.distributed.fragment_stream import Fragment
from policy_service.distributed.policy_actor import WEIGHTS_VERSION
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.multi_agent.policies import agent_policies
from policy_service.runs.metrics_logger import Stat

register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))
POLICY_IDS = ("pa", "pb")


def config(**changes) -> dict:
    """two_maps_config with fragments of 16 env steps (the async algorithms' unit)."""
    base = two_maps_config(train_batch_size=64, rollout_fragment_length=16, num_epochs=1, **changes)
    base.pop("minibatch_size")
    return base


def with_learner_actors(**changes) -> dict:
    """config() with one env runner and a learner actor per policy (small CPU asks)."""
    return config(
        num_env_runners=1,
        num_learners=1,
        num_cpus_per_learner=0.25,
        num_cpus_per_env_runner=0.25,
        **changes,
    )


def weights(algo) -> dict:
    return {p: algo.get_policy(p).get_weights() for p in POLICY_IDS}


def changed(before: dict, after: dict) -> bool:
    return any(not np.array_equal(before[k], after[k]) for k in before)


@pytest.fixture(scope="module")
def one_policy_trained():
    """APPO, sampling in the driver, one iteration with only "pa" trained."""
    algo = APPO(config(policies_to_train=["pa"]))
    before = weights(algo)
    result = algo.train()
    yield algo, before, result
    algo.stop()


def test_a_policy_not_trained_keeps_its_weights_bit_identical(one_policy_trained):
    algo, before, result = one_policy_trained
    after = weights(algo)
    assert not changed(before["pb"], after["pb"]) and changed(before["pa"], after["pa"])
    assert any(k.startswith("pa/") for k in result) and not any(k.startswith("pb/") for k in result)


def test_results_count_agent_steps_twice_the_env_steps(one_policy_trained):
    _, _, result = one_policy_trained
    assert result["timesteps_total"] >= 64
    assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
    assert set(result["policy_reward_mean"]) == set(POLICY_IDS)
    assert result["episode_return_mean"] == pytest.approx(
        sum(result["policy_reward_mean"].values())
    )
    assert result["num_learner_updates"] >= 1 and result["policy_lag_max"] >= 0
    assert result["pa/num_samples_trained"] >= 64  # its own rows: one per env step


@pytest.mark.parametrize("algo_cls", [IMPALA, A3C], ids=["impala", "a3c"])
def test_both_policies_train_and_report_their_results(algo_cls):
    algo = algo_cls(config())
    try:
        before = weights(algo)
        result = algo.train()
        after = weights(algo)
    finally:
        algo.stop()
    assert all(changed(before[p], after[p]) for p in POLICY_IDS)
    assert set(result["policy_reward_mean"]) == set(POLICY_IDS)
    assert all(f"{p}/total_loss" in result for p in POLICY_IDS), sorted(result)
    assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
    trained = result["num_samples_trained_this_iter"]
    if algo_cls is A3C:  # every fragment's gradients applied: both agents' rows of each
        assert trained == 2 * result["env_steps_this_iter"]
    else:  # each update: a train batch of >= 64 env steps, so >= 64 rows of each policy
        assert trained == sum(result[f"{p}/num_samples_trained"] for p in POLICY_IDS)
        for p in POLICY_IDS:
            assert result[f"{p}/num_samples_trained"] >= 64 * result["num_learner_updates"]


def test_every_multi_agent_row_carries_the_weights_version_that_acted():
    policies = agent_policies(
        {"pa": None, "pb": None}, by_agent, None, TwoMapsEnv(), IMPALAPolicy, {"seed": 0}
    )
    worker = RolloutWorker(TwoMapsEnv, policies, num_envs=2, rollout_fragment_length=6, seed=0)
    worker.set_weights(worker.get_weights(), version=3)
    batch, metrics = worker.sample()
    for policy_id, rows in batch.policy_batches.items():
        assert rows[WEIGHTS_VERSION].tolist() == [3] * rows.count, policy_id
    assert metrics["weights_version"] == Stat(3, "min")  # the oldest, over runners
    assert metrics["policy_agent_steps"] == {"pa": 12, "pb": 12}


@pytest.mark.parametrize(
    "own, named",
    [({"num_learners": 0}, "num_learners=0"), ({"inference": "env_runners"}, "'env_runners'")],
)
def test_a_policy_whose_config_leaves_the_learners_acting_is_refused_in_one_line(own, named):
    """inference: learners acts through each policy's learners: none may opt out."""
    run = config(inference="learners", num_learners=1, num_env_runners=1)
    run["policies"] = {"pa": None, "pb": PolicySpec(config=own)}
    with pytest.raises(ConfigError) as refused:
        APPO(run)
    assert_one_line(refused.value, "config.policies['pb']", "inference='learners'", named)


def test_a_train_batch_holds_train_batch_size_steps_counted_as_count_steps_by():
    """Fragments of 12 env steps, 24 agent steps: 64 steps take 6 fragments counted in
    env steps, 3 in agent steps; and a fragment for each learner either way."""
    policies = agent_policies(
        {"pa": None, "pb": None}, by_agent, None, TwoMapsEnv(), IMPALAPolicy, {"seed": 0}
    )
    worker = RolloutWorker(TwoMapsEnv, policies, num_envs=2, rollout_fragment_length=6, seed=0)
    fragments = [Fragment.sampled(*worker.sample()) for _ in range(6)]
    assert {(f.steps("env_steps"), f.steps("agent_steps")) for f in fragments} == {(12, 24)}
    env_steps = AsyncSettings(train_batch_size=64)
    agent_steps = AsyncSettings(train_batch_size=64, count_steps_by="agent_steps")
    assert not makes_train_batch(fragments[:5], env_steps, num_learners=0)
    assert makes_train_batch(fragments[:6], env_steps, num_learners=0)
    assert not makes_train_batch(fragments[:2], agent_steps, num_learners=0)
    assert makes_train_batch(fragments[:3], agent_steps, num_learners=0)
    assert not makes_train_batch(fragments[:3], agent_steps, num_learners=4)


@pytest.mark.parametrize("algo_cls", [IMPALA, A3C], ids=["impala", "a3c"])
def test_counting_agent_steps_an_iteration_samples_train_batch_size_agent_steps(algo_cls):
    """With count_steps_by="agent_steps" a train batch (IMPALA) and an iteration hold
    >= 64 agent steps, 32 env steps of TwoMapsEnv's two agents, where env_steps would
    ask for 64 env steps; results still count env steps as timesteps."""
    algo = algo_cls(config(count_steps_by="agent_steps"))
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["agent_timesteps_total"] == 2 * result["timesteps_total"] >= 64
    if algo_cls is IMPALA:
        for p in POLICY_IDS:
            assert result[f"{p}/num_samples_trained"] >= 32 * result["num_learner_updates"]


# ----- with env runner actors (slow) -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo_cls, inference",
    [(APPO, "env_runners"), (APPO, "learners"), (IMPALA, "env_runners"), (A3C, "env_runners")],
    ids=["APPO", "APPO-acting-on-learners", "IMPALA", "A3C"],
)
def test_two_mapped_policies_each_learn_their_own_map(ray_local, algo_cls, inference):
    learning = two_maps_config(
        num_env_runners=2, rollout_fragment_length=32, num_envs_per_env_runner=4
    )
    learning.pop("minibatch_size")
    if inference == "learners":  # a learner actor per policy, acting for both runners
        learning.update(inference=inference, num_learners=1, num_cpus_per_learner=0.25)
    if algo_cls is A3C:  # each fragment is one gradient step: shorter ones, more steps
        learning.pop("num_epochs")
        learning["rollout_fragment_length"] = 8
    algo = algo_cls(learning)
    try:
        result = train_until_policies_reach(algo, list(POLICY_IDS), iterations=40)
        assert min(result["policy_reward_mean"].values()) >= 0.8 * 8 > 3 * RANDOM_RETURN, result[
            "policy_reward_mean"
        ]
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
        acting = {p: acting_policy(algo, p) for p in POLICY_IDS}
        assert greedy_actions(acting["pa"], 0) == A_MAP
        assert greedy_actions(acting["pb"], 1) == B_MAP
    finally:
        algo.stop()


class ActingLearner:
    """A learner actor acting (inference: learners), called as a policy is."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def compute_actions(self, obs, explore: bool):
        return ray.get(self.actor.compute_actions.remote(obs, explore=explore))


def acting_policy(algo, policy_id: str):
    """What acts for `policy_id`: its learner in the driver, or its acting learner actor."""
    if getattr(algo.config, "inference", None) == "learners":
        return ActingLearner(algo.async_learners().actors[policy_id][0])
    return algo.get_policy(policy_id)


@pytest.mark.slow
@pytest.mark.parametrize(
    "inference, into", [("env_runners", "the_same_run"), ("learners", "a_fresh_run")]
)
def test_impala_with_learner_actors_saves_and_restores_every_policy(
    ray_local, tmp_path, inference, into
):
    """Saved after an iteration, then restored: every policy's learners hold the saved
    weights and version again, and train on from them. With the env runners acting, the
    run that saved it trains past the checkpoint and restores it (restore pauses its
    sampling, as a resume's fallback does); with the learners acting, a fresh run
    restores it, as a resume does, and its runner acts through the restored learners."""
    run = with_learner_actors(inference=inference)
    algo = IMPALA(run)
    try:
        result = algo.train()
        assert all(f"{p}/total_loss" in result for p in POLICY_IDS), sorted(result)
        algo.pause_sampling()  # no update between the save and reading what it saved
        algo.save(str(tmp_path))
        groups = algo.async_learners().groups
        saved = {p: groups[p].get_weights() for p in POLICY_IDS}
        version = algo.learner_version()
        if into == "the_same_run":
            algo.resume_sampling()
            while algo.learner_version() <= version:  # trained past the checkpoint
                algo.train()
            algo.pause_sampling()
            assert all(changed(saved[p], groups[p].get_weights()) for p in POLICY_IDS)
            algo.resume_sampling()
        else:
            algo.stop()
            algo = IMPALA(run)  # stop() is idempotent: the finally may meet either run
        algo.restore(str(tmp_path))
        assert algo.learner_version() == version
        groups = algo.async_learners().groups
        for p in POLICY_IDS:
            assert not changed(saved[p], groups[p].get_weights()), p
        result = algo.train()
        assert result["learner_version"] > version
        if inference == "learners":  # the runner acts through the restored learners
            assert acting_actors(algo) == [{p: groups[p].actors[0] for p in POLICY_IDS}]
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
    finally:
        algo.stop()


# ----- acting on the learners (inference: learners) -------------------------------------------


@pytest.fixture(scope="module")
def appo_acting_on_learners(ray_local):
    """APPO whose policies act through their own learner actors; "pb" is not trained."""
    algo = APPO(with_learner_actors(inference="learners", policies_to_train=["pa"]))
    yield algo
    algo.stop()


def learner_weights(algo) -> dict:
    groups = algo.async_learners().groups
    return {p: groups[p].get_weights() for p in POLICY_IDS}


def acting_actors(algo) -> list:
    runners = algo.env_runner_group()
    return ray.get([worker.acting_actor.remote() for worker in runners.workers])


def acting_weights(algo) -> list:
    """Each env runner's policy id -> the weights acting for it."""
    runners = algo.env_runner_group()
    return ray.get([worker.get_weights.remote() for worker in runners.workers])


def test_each_policy_acts_through_its_own_learner_with_the_weights_it_trains(
    appo_acting_on_learners,
):
    algo = appo_acting_on_learners
    before = learner_weights(algo)
    result = algo.train()
    algo.pause_sampling()  # the learner thread finishes its update and stops
    try:
        after = learner_weights(algo)
        assert changed(before["pa"], after["pa"]) and not changed(before["pb"], after["pb"])
        learners = algo.async_learners().actors
        assert all(len(learners[p]) == 1 for p in POLICY_IDS)
        assert learners["pa"] != learners["pb"]
        assert acting_actors(algo) == [{p: learners[p][0] for p in POLICY_IDS}]
        assert result["agent_timesteps_total"] == 2 * result["timesteps_total"]
        assert "pa/total_loss" in result and not any(k.startswith("pb/") for k in result)
        # the runner acts with the learners' own weights, under the trained one's version
        [acting] = acting_weights(algo)
        assert all(not changed(acting[p], after[p]) for p in POLICY_IDS)
        assert algo.env_runner_group().weights_versions() == [algo.learner_version()]
    finally:
        algo.resume_sampling()


@pytest.mark.slow  # a policy's learner actor started twice
def test_a_killed_learner_of_one_policy_is_replaced_and_the_runners_act_through_it(
    appo_acting_on_learners,
):
    algo = appo_acting_on_learners
    algo.train()
    learners = algo.async_learners()
    [dead] = learners.actors["pa"]
    ray.kill(dead)
    results = [algo.train() for _ in range(3)]
    [new] = learners.actors["pa"]
    assert new != dead and results[-1]["num_learner_restarts"] == 1
    assert algo.env_runner_group().inference_actors == learners.actors
    assert acting_actors(algo) == [{p: learners.actors[p][0] for p in POLICY_IDS}]
    assert results[-1]["learner_version"] > results[0]["learner_version"]


@pytest.mark.slow  # two learner actors and an env runner
def test_a_frozen_copy_acting_on_its_learner_takes_the_trained_weights(ray_local):
    """Self-play with inference: learners: the frozen policy acts through a learner of
    its own, which takes the trained policy's weights at every copy."""
    algo = IMPALA(
        with_learner_actors(
            inference="learners", policies_to_train=["pa"], frozen_copies={"pb": "pa"}
        )
    )
    try:
        start = learner_weights(algo)
        assert not changed(start["pa"], start["pb"])  # copied at the start
        algo.train()  # then copied again at its end
        algo.pause_sampling()
        now = learner_weights(algo)
        learners = algo.async_learners().actors
        assert acting_actors(algo) == [{p: learners[p][0] for p in POLICY_IDS}]
        [acting] = acting_weights(algo)
        assert changed(start["pb"], now["pb"]) and not changed(acting["pb"], now["pb"])
    finally:
        algo.stop()
