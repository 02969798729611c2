"""EnvRunnerGroup: parallel and asynchronous sampling, one-put weight sync, replacing
dead workers."""

import os
import threading
import time

import envs
import fakes
import numpy as np
import pytest
import ray
from ray.exceptions import ActorDiedError, RayTaskError

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.actor_pool import (
    backoff_delays,
    died_of_actor_death,
    is_actor_death,
)
from policy_service.distributed.env_runner_group import (
    EnvRunnerFailure,
    EnvRunnerGroup,
    joined_metrics,
)
from policy_service.runs.metrics_logger import Stat

CONFIG = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "lr": 0.01}
SCRIPT = {"lengths": [4, 6], "endings": ["terminated", "truncated"]}
SLOW_SCRIPT = {**SCRIPT, "step_sleep_s": 0.02}  # a fragment of 20 steps takes ~0.4 s


# the module's group of two env runner actors: its start takes ~10 s here alone and up to
# minutes beside a busy job, so its tests run in the slow group
WITH_THE_GROUP = pytest.mark.slow


@pytest.fixture(scope="module")
def group(ray_local):
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=20,
        env_config=SLOW_SCRIPT,
        seed=0,
    )
    yield group
    group.stop()


def _runners_of(batch) -> set:
    """Worker indices of a batch's rows (its unroll ids)."""
    return set(np.asarray(batch[SampleBatch.UNROLL_ID]) // 2**32)


def _learner(group):
    return fakes.ReturnsPGPolicy(group.observation_space, group.action_space, CONFIG)


def test_workers_metrics_join_by_the_rules_they_were_sampled_with():
    def worker(steps, version, seconds, returns):
        return {
            "env_steps": Stat(steps, "sum"),
            "weights_version": Stat(version, "min"),
            "sample_time_s": Stat(seconds, "max"),
            "episode_returns": returns,
            "episode_lengths": [len(returns)],
            "worker_index": version,  # one worker's own: not joined
        }

    joined = joined_metrics([worker(20, 7, 0.5, [1.0, 2.0]), worker(21, 6, 0.25, [3.0])])
    assert joined == {
        "env_steps": 41,
        "weights_version": 6,
        "worker_sample_time_s": 0.5,
        "episode_returns": [1.0, 2.0, 3.0],
        "episode_lengths": [2, 1],
        "callbacks": [],
    }


def test_each_policys_episode_returns_join_by_policy_id():
    def worker(returns_of: dict):
        return {"sample_time_s": Stat(0.1, "max"), "policy_episode_returns": returns_of}

    joined = joined_metrics([worker({"pa": [1.0], "pb": [2.0]}), worker({"pa": [3.0]})])
    assert joined["policy_episode_returns"] == {"pa": [1.0, 3.0], "pb": [2.0]}
    assert joined_metrics([worker({}), worker({})])["policy_episode_returns"] == {}


def test_local_group_needs_no_ray_actors():
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_envs_per_env_runner=2,
        rollout_fragment_length=5,
        env_config=SCRIPT,
        seed=0,
    )
    batch, metrics = group.sample()
    assert group.workers == [] and group.local_worker is not None
    assert batch.count == metrics["env_steps"] >= 10
    assert metrics["num_worker_restarts"] == 0 and metrics["num_env_runners"] == 0
    weights = {k: v + 1.0 for k, v in group.local_worker.get_weights()["default_policy"].items()}
    assert group.sync_weights(weights, 4) == 4
    assert group.weights_versions() == [4]
    np.testing.assert_array_equal(
        next(iter(group.local_worker.get_weights()["default_policy"].values())),
        next(iter(weights.values())),
    )
    group.stop()


@pytest.mark.slow  # two workers started (and one replaced) while the stand-in samples
def test_a_stand_in_samples_until_the_workers_start_then_hands_them_weights_and_filter(
    ray_local, tmp_path
):
    """The workers' envs wait for a file: until it is gone the stand-in (worker 3, the
    envs of both) samples; then the workers act with its weights and version and go on
    from its observation statistics, and one killed while starting is replaced."""
    hold = tmp_path / "hold"
    hold.touch()
    group = EnvRunnerGroup(
        envs.env_held_outside_the_driver,
        fakes.ReturnsPGPolicy,
        {**CONFIG, "observation_filter": "MeanStdFilter"},
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=5,
        env_config={**SCRIPT, "hold": str(hold), "driver_pid": os.getpid()},
        seed=0,
        sample_while_starting=True,
    )
    try:
        for _ in range(2):
            batch, metrics = group.sample()
            assert _runners_of(batch) == {3} and batch.count == metrics["env_steps"] == 20
        weights = {
            k: v + 1.0 for k, v in group.local_worker.get_weights()["default_policy"].items()
        }
        assert group.sync_weights(weights, 5) == 5
        seen = group.filter_stats.count  # the stand-in's observations, merged
        assert seen >= 40
        ray.kill(group.workers[1])  # dies while starting
        envs.release_held_workers(group, hold)
        assert group.local_worker is None
        kept = group.workers[0]
        filter_count = kept.__ray_call__.remote(lambda w: w.observation_filter.stats.count)
        assert ray.get(filter_count) == seen
        kept_weights = ray.get(kept.get_weights.remote())["default_policy"]
        fakes.assert_weights_close(kept_weights, weights, atol=0, rtol=0)
        batch, metrics = group.sample()
        assert _runners_of(batch) == {1, 2} and metrics["weights_version"] == 5
        assert metrics["num_worker_restarts"] == 1
    finally:
        group.stop()


def test_only_a_group_acting_through_inference_actors_can_be_handed_new_ones():
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv, fakes.ReturnsPGPolicy, CONFIG, env_config=SCRIPT, seed=0
    )
    try:
        assert group.inference_actors == []
        # a worker whose acting actor died is a learner's death only with inference actors
        assert not group.acting_actor_died(RayTaskError("sample", "...", ActorDiedError()))
        with pytest.raises(ValueError, match=r"replaces the 0 inference actor\(s\).*got 1$"):
            group.set_inference_actors([object()])
        with pytest.raises(ValueError, match="acts with its own policy copy"):
            group.local_worker.set_acting_actor(object())
        assert group.local_worker.acting_actor() is None
    finally:
        group.stop()


@WITH_THE_GROUP
def test_workers_start_with_the_same_weights_and_sample_in_parallel(group, monkeypatch):
    batch, metrics = group.sample()  # the first sample waits for both to start
    first, second = [
        w["default_policy"] for w in ray.get([w.get_weights.remote() for w in group.workers])
    ]
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    assert batch.count == metrics["env_steps"] and 80 <= batch.count <= 82
    assert set(np.asarray(batch[SampleBatch.UNROLL_ID]) // 2**32) == {1, 2}  # both workers
    assert len(metrics["episode_returns"]) == len(metrics["episode_lengths"]) > 0
    # in parallel: both workers' requests are in flight when the driver first blocks
    waits = []  # (refs, timeout) of each ray.wait; timeout 0: a poll (weight acks)
    real_wait = ray.wait
    monkeypatch.setattr(
        ray,
        "wait",
        lambda refs, **kw: waits.append((len(refs), kw.get("timeout"))) or real_wait(refs, **kw),
    )
    group.sample()
    assert [n for n, timeout in waits if timeout != 0][0] == 2, waits


@WITH_THE_GROUP
def test_sync_weights_puts_the_weights_in_the_object_store_once(group, monkeypatch):
    learner = _learner(group)
    weights = {k: v * 0.5 for k, v in learner.get_weights().items()}
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    assert group.sync_weights(weights, 11) == 11
    assert len(puts) == 1
    assert group.weights_versions() == [11, 11]
    for got in ray.get([w.get_weights.remote() for w in group.workers]):
        for name, value in weights.items():
            np.testing.assert_array_equal(got["default_policy"][name], value)
    _, metrics = group.sample()
    assert metrics["weights_version"] == 11


@WITH_THE_GROUP
def test_fragments_name_the_grad_updates_synced_with_the_weights_they_acted_with(group):
    """What learners read their lead over the sampler from: each remote worker's
    fragment carries the count synced with its weights (through Ray's pickling), kept
    by the group's concatenation; a sync that names none leaves batches naming none."""
    weights = _learner(group).get_weights()
    group.sync_weights(weights, 12, num_grad_updates=7)
    batch, _ = group.sample()
    assert _runners_of(batch) == {1, 2} and batch.num_grad_updates == 7
    group.sync_weights(weights, 13)
    assert group.sample()[0].num_grad_updates is None


@WITH_THE_GROUP  # and an env runner actor started twice
def test_a_killed_worker_is_replaced_and_training_goes_on(group):
    learner = _learner(group)
    version = 20
    group.sync_weights(learner.get_weights(), version)
    restarts_before = group.num_restarts
    victim = group.workers[0]
    for iteration in range(3):
        if iteration == 1:  # kill worker 1 while it is sampling
            threading.Timer(0.15, ray.kill, args=(victim,)).start()
        batch, metrics = group.sample()
        assert 80 <= batch.count <= 82
        assert set(np.asarray(batch[SampleBatch.UNROLL_ID]) // 2**32) == {1, 2}
        assert metrics["weights_version"] == version  # the replacement got the latest weights
        stats = learner.learn_on_batch(batch)
        assert np.isfinite(stats["total_loss"])
        if iteration >= 1:
            assert metrics["num_worker_restarts"] == restarts_before + 1
        version += 1
        group.sync_weights(learner.get_weights(), version)
    assert group.num_restarts == restarts_before + 1
    assert group.workers[0] != victim
    assert group.weights_versions() == [version, version]
    replaced = ray.get(group.workers[0].get_weights.remote())["default_policy"]
    for name, value in learner.get_weights().items():
        np.testing.assert_array_equal(replaced[name], value)


@WITH_THE_GROUP
def test_an_error_raised_by_a_worker_is_raised_not_restarted(group):
    # started first: the first sample gives every worker worker 1's initial weights,
    # which the broken worker (no set_weights) would fail on (it did when run alone)
    group.wait_started()
    healthy = group.workers[1]
    group.workers[1] = ray.remote(envs.BrokenEnvWorker).options(num_cpus=0).remote()
    restarts_before = group.num_restarts
    try:
        with pytest.raises(ValueError, match="outside its observation space"):
            group.sample()
        assert group.num_restarts == restarts_before
    finally:
        ray.kill(group.workers[1])
        group.workers[1] = healthy


@pytest.mark.slow  # a group with its PolicyActor: ~21 s here
def test_remote_inference_group_sends_weights_to_the_policy_actor_only(ray_local):
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=10,
        env_config=SCRIPT,
        seed=0,
        remote_inference=True,
        num_cpus_per_env_runner=0.25,
        policy_actor_options={"num_cpus": 0.5},
    )
    try:
        learner = _learner(group)
        group.sync_weights(learner.get_weights(), 3)
        batch, metrics = group.sample()
        assert 40 <= batch.count <= 42 and metrics["weights_version"] == 3
        assert group.weights_versions() == [3, 3]
        stats = ray.get(group.policy_actor.stats.remote())
        # one forward pass held a row per sub-env of both workers: requests were merged
        # (how often depends on timing, so only that it happened is asserted)
        assert stats["max_batch_size"] == 4 and stats["num_requests"] >= 20
        assert "advantages" in batch  # postprocessed by the policy in the actor
    finally:
        group.stop()


def test_restart_budgets_are_checked_before_any_actor_starts():
    for key in ("max_restarts_per_sample", "max_restarts", "max_policy_actor_restarts"):
        with pytest.raises(ValueError, match=f"^{key} must be >= 0, got -1$"):
            EnvRunnerGroup(
                envs.ScriptedEpisodesEnv,
                fakes.ReturnsPGPolicy,
                CONFIG,
                num_env_runners=2,
                **{key: -1},
            )


def test_restart_attempts_back_off_exponentially_up_to_a_cap():
    assert backoff_delays(1) == [0.0]
    assert backoff_delays(7) == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_death_is_told_apart_from_an_error_the_actors_code_raised():
    died = ActorDiedError()
    assert is_actor_death(died)
    raised = RayTaskError("sample", "Traceback ...", ValueError("bad observation"))
    assert not is_actor_death(raised) and not died_of_actor_death(raised)
    # a worker whose call to the (dead for good) PolicyActor failed
    assert died_of_actor_death(RayTaskError("sample", "Traceback ...", died))


# ----- asynchronous sampling (last: the module's group keeps requests in flight) ------------


def test_local_async_sample_is_one_fragment_sampled_here():
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_envs_per_env_runner=2,
        rollout_fragment_length=5,
        env_config=SCRIPT,
        seed=0,
    )
    try:
        [(batch, metrics)] = group.sample_async()
        assert metrics["worker_index"] == 0 and batch.count == metrics["env_steps"] >= 10
        [(again, _)] = group.sample_async()
        assert set(again[SampleBatch.UNROLL_ID]).isdisjoint(batch[SampleBatch.UNROLL_ID])
    finally:
        group.stop()


def collect_until(group, done, timeout_s: float = 60.0) -> list:
    """sample_async() until done(results so far)."""
    results, deadline = [], time.monotonic() + timeout_s
    while not done(results):
        assert time.monotonic() < deadline, f"only {[m['worker_index'] for _, m in results]}"
        results += group.sample_async(timeout_s=10)
    return results


def from_worker(index: int):
    return lambda results: any(m["worker_index"] == index for _, m in results)


@WITH_THE_GROUP
def test_async_sample_returns_fragments_as_workers_finish_each_once(group):
    """Worker 2 is busy with one more fragment first: worker 1's comes back alone, and
    worker 1 was asked again at once (its next one comes while worker 2 still works)."""
    group.sync_weights(_learner(group).get_weights(), 50)
    busy = group.workers[1].sample.remote()  # ~0.4 s of stepping before its async request
    first = group.sample_async()
    assert [m["worker_index"] for _, m in first] == [1]
    assert group.sample_async(timeout_s=0.0) == []  # nothing is ready yet; nothing is lost
    results = first + collect_until(group, from_worker(2))
    ray.get(busy)
    assert all(batch.count == m["env_steps"] and 40 <= batch.count <= 41 for batch, m in results)
    assert all(m["weights_version"] == 50 for _, m in results)
    unroll_ids = [set(np.asarray(batch[SampleBatch.UNROLL_ID])) for batch, _ in results]
    assert sum(len(ids) for ids in unroll_ids) == len(set().union(*unroll_ids))  # none twice


@WITH_THE_GROUP  # and an env runner actor started twice
def test_a_worker_killed_during_async_sampling_is_replaced_with_the_latest_weights(group):
    learner = _learner(group)
    group.sync_weights(learner.get_weights(), 60)
    before, victim = group.num_restarts, group.workers[0]
    group.sample_async(timeout_s=0.0)  # both workers have a request in flight
    ray.kill(victim)
    collect_until(group, lambda _: group.num_restarts > before)
    assert group.num_restarts == before + 1 and group.workers[0] is not victim
    results = collect_until(group, from_worker(1))
    assert all(m["weights_version"] == 60 for _, m in results)
    replaced = ray.get(group.workers[0].get_weights.remote())["default_policy"]
    for name, value in learner.get_weights().items():
        np.testing.assert_array_equal(replaced[name], value)


@WITH_THE_GROUP  # and an env runner actor started twice
def test_a_worker_sample_replaced_is_not_replaced_again_by_its_old_async_request(group):
    group.sample_async(timeout_s=0.0)
    before, victim = group.num_restarts, group.workers[1]
    ray.kill(victim)
    group.sample()  # finds worker 2 dead and replaces it
    assert group.num_restarts == before + 1
    collect_until(group, from_worker(2))  # the old request fails; the new worker is asked
    assert group.num_restarts == before + 1


@WITH_THE_GROUP
def test_weights_sent_without_waiting_reach_each_workers_fragments_after_its_current_one(group):
    group.sync_weights(_learner(group).get_weights(), 79)
    collect_until(group, lambda r: {m["worker_index"] for _, m in r} == {1, 2})
    group.sample_async(timeout_s=0.0)  # each worker has just started a fragment (~0.4 s)
    assert group.sync_weights(_learner(group).get_weights(), 80, wait=False) == 80
    results = collect_until(
        group, lambda r: {m["worker_index"] for _, m in r if m["weights_version"] == 80} == {1, 2}
    )
    for index in (1, 2):
        versions = [m["weights_version"] for _, m in results if m["worker_index"] == index]
        assert versions == sorted(versions) and set(versions) <= {79, 80}
    assert group.weights_versions() == [80, 80]


@pytest.mark.slow  # env runner start-ups until the budget is spent
def test_async_sampling_ends_in_one_line_when_the_restart_budget_is_spent(ray_local):
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=1,
        rollout_fragment_length=20,
        env_config=SLOW_SCRIPT,
        seed=0,
        max_restarts=0,
    )
    try:
        group.sample_async(timeout_s=0.0)
        ray.kill(group.workers[0])
        with pytest.raises(
            EnvRunnerFailure,
            match=r"^env runner 1 died 1 times during one "
            r"sample_async\(\) .*max_num_env_runner_restarts=0\)",
        ) as info:
            collect_until(group, from_worker(1))
        assert "\n" not in str(info.value)
    finally:
        group.stop()
