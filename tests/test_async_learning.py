"""The asynchronous machinery: FragmentStream (requests in flight, references only,
dead runners), LearnerThread (bounded queue, dealing, policy lag) and AsyncLearning
over a real local Ray, with the learner in the driver and in 2 learner actors.
The tests that start Ray are in the slow group (the fast suite's budget)."""

import collections
import threading
import time

import envs
import fakes
import numpy as np
import pytest
import ray
from async_runs import CONFIG, SCRIPT, drain

from policy_service import LearnerGroup
from policy_service.data.sample_batch import concat_samples
from policy_service.distributed.async_learning import AsyncLearning, AsyncSettings
from policy_service.distributed.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from policy_service.distributed.fragment_stream import Fragment, FragmentStream
from policy_service.distributed.learner_thread import LearnerThread, deal
from policy_service.runs.metrics_logger import Stat


@pytest.fixture(scope="module")
def runners(ray_local):
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=10,
        env_config=SCRIPT,
        seed=0,
    )
    yield group
    group.stop()


@pytest.fixture(scope="module")
def learners(runners):
    group = LearnerGroup(
        fakes.ReturnsPGPolicy, runners.observation_space, runners.action_space, CONFIG
    )
    yield group
    group.stop()


@pytest.mark.slow  # Ray and its actors: ~20-40 s on a loaded 2-core machine
def test_each_runner_keeps_its_requests_in_flight_and_the_driver_gets_only_metrics(runners):
    stream = FragmentStream(runners, max_requests_in_flight_per_env_runner=3)
    stream.top_up()
    assert stream.requests_in_flight() == 6
    stream.top_up()  # already full: nothing more asked
    assert stream.requests_in_flight() == 6
    fragments = drain(stream)
    assert len(fragments) == 6 and stream.lost_fragments == 0
    assert all(isinstance(f.batch, ray.ObjectRef) for f in fragments)
    by_worker = collections.Counter(f.metrics["worker_index"] for f in fragments)
    assert by_worker == {1: 3, 2: 3}
    batch = ray.get(fragments[0].batch)
    assert batch.count == fragments[0].env_steps >= 20
    np.testing.assert_array_equal(batch["weights_version"], fragments[0].weights_version)
    assert stream.collect(timeout_s=0.05) == []  # not asked again: the runners wait


@pytest.mark.slow  # Ray and its actors: ~20-40 s on a loaded 2-core machine
def test_a_killed_runner_loses_its_requests_counted_and_is_replaced_in_the_background(runners):
    stream = FragmentStream(runners, max_requests_in_flight_per_env_runner=2)
    restarts = runners.num_restarts
    stream.top_up()
    ray.kill(runners.workers[0], no_restart=True)
    delivered = collections.Counter()
    asked = collections.Counter({1: 2, 2: 2})
    while True:
        for fragment in drain(stream):  # the death shows when a request to it fails
            delivered[fragment.metrics["worker_index"]] += 1
        if runners.num_restarts > restarts:
            break
        stream.top_up()
        asked.update({1: 2, 2: 2})
    # the collect that found the death started the replacement and did not wait for it
    assert stream.runners_starting() == [0] and runners.num_restarts == restarts + 1
    assert delivered[2] == asked[2]
    assert 1 <= stream.lost_fragments == asked[1] - delivered[1]
    stream.top_up()  # runner 2 is asked; runner 1 once its replacement is up
    drain(stream)
    stream.forget()  # waits for the replacement: every slot holds a live runner
    assert stream.runners_starting() == [] and runners.num_restarts == restarts + 1
    stream.top_up()  # the replacement samples
    assert {f.metrics["worker_index"] for f in drain(stream)} == {1, 2}


@pytest.mark.slow  # a second group, with its PolicyActor: ~20-40 s here
def test_a_policy_actor_dead_for_good_ends_the_stream_in_the_groups_one_line(ray_local):
    """The runners' requests fail on the dead PolicyActor: the line synchronous
    sampling gives (EnvRunnerFailure), not the worker's RayTaskError."""
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=1,
        num_envs_per_env_runner=2,
        rollout_fragment_length=10,
        env_config=SCRIPT,
        seed=0,
        remote_inference=True,
        num_cpus_per_env_runner=0.25,
        policy_actor_options={"num_cpus": 0.25},
    )
    try:
        stream = FragmentStream(group, max_requests_in_flight_per_env_runner=2)
        stream.top_up()
        assert drain(stream)
        ray.kill(group.policy_actor, no_restart=True)
        with pytest.raises(EnvRunnerFailure) as failure:
            for _ in range(100):  # each request fails on the dead actor at its first step
                stream.top_up()
                drain(stream)
        stream.forget()
    finally:
        group.stop()
    message = fakes.assert_one_line(failure.value)
    assert message.startswith(
        "the PolicyActor is gone: Ray restarted it 0 times (max_policy_actor_restarts=3); "
        "last: ActorDiedError: "
    ), message


@pytest.mark.slow  # a second group: ~20-40 s here
def test_forgetting_reads_a_request_that_fails_after_it_so_ray_logs_no_traceback(
    ray_local, monkeypatch
):
    """The run ends (or pauses) while a request is queued on a runner whose env then
    raises: forget() waits for the request and reads its error. Dropped unread, the
    error would reach Ray's "Unhandled error" log, traceback and all, on the user's
    stderr after the run's one line."""
    unhandled = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", unhandled.append)
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=1,
        num_envs_per_env_runner=1,
        rollout_fragment_length=10,
        # the first request's 10 steps are slow; the second fails at its first step
        env_config={"lengths": [100], "step_sleep_s": 0.1, "bad_obs_at_step": 11},
        seed=0,
    )
    try:
        group.wait_started()
        stream = FragmentStream(group, max_requests_in_flight_per_env_runner=2)
        stream.top_up()
        assert stream.forget() == 2  # while the first request still samples
        # the runner answers this call after both requests finished
        ray.get(group.workers[0].weights_version.remote())
        for _ in range(20):  # Ray reports an unread error from a thread of its own
            time.sleep(0.1)
            assert unhandled == []
    finally:
        group.stop()


@pytest.mark.slow  # Ray and its actors: ~20-40 s on a loaded 2-core machine
def test_a_stream_of_another_request_delivers_its_payload_by_reference(runners, learners):
    """request="sample_and_compute_gradients": each runner's gradients on its own
    fragment stay in the object store, with the fragment's metrics beside them."""
    runners.sync_weights(learners.get_weights(), version=4)
    try:
        stream = FragmentStream(runners, 1, request="sample_and_compute_gradients")
        stream.top_up()
        fragments = drain(stream)
    finally:
        runners.sync_weights(learners.get_weights(), version=0)  # as the other tests expect
    assert {f.metrics["worker_index"] for f in fragments} == {1, 2}
    for fragment in fragments:
        assert isinstance(fragment.batch, ray.ObjectRef) and fragment.weights_version == 4
        assert fragment.env_steps >= 20 and "total_loss" in fragment.metrics["gradient_stats"]
        gradients = ray.get(fragment.batch)["default_policy"]
        assert len(gradients) == len(learners.get_weights())  # an MLP: every weight trained
        assert any(g is not None and np.abs(g).sum() > 0 for g in gradients)


def test_fragments_are_dealt_by_env_steps_and_a_full_queue_takes_nothing():
    fragments = [Fragment(None, {"env_steps": n}) for n in (30, 10, 20, 20)]
    shards = deal(fragments, 2)
    assert sorted(sum(f.env_steps for f in s) for s in shards) == [40, 40]
    thread = LearnerThread(
        {}, queue_size=1, num_sgd_steps=1, broadcast_interval=1, max_policy_lag=None
    )
    assert thread.offer(fragments) and not thread.offer(fragments)
    assert thread.queue_fill() == 1.0
    assert thread.stop() == 4  # never started: the queued batch is dropped and counted


class RecordingLearners:
    """Learners that note the fragments each update got, by policy id."""

    def __init__(self, num_learners: int, updates: list):
        self.num_learners, self.updates = num_learners, updates
        self.acting_versions: list[int] = []

    def set_acting_version(self, version: int) -> None:
        self.acting_versions.append(version)

    def update_on_fragments(self, shards, version, num_sgd_steps, policy_id):
        self.updates.append((policy_id, shards))
        rows = sum(f["rows"] for shard in shards for f in shard)
        return {
            "num_samples_trained": Stat(rows, "sum"),
            "policy_lag_mean": Stat(1.0),
            "policy_lag_max": Stat(2, "max"),
            "x": Stat(1.0),
        }

    def get_weights(self):
        return {"w": np.zeros(1)}


def multi_agent_fragment(rows: dict) -> Fragment:
    """A fragment of 8 env steps holding `rows` (policy id -> its rows)."""
    return Fragment({"rows": 0}, {"env_steps": 8, "policy_agent_steps": rows, "weights_version": 0})


def test_each_policy_trains_on_the_fragments_holding_its_rows_or_sits_the_batch_out():
    fragments = [multi_agent_fragment({"pa": 8}), multi_agent_fragment({"pa": 8, "pb": 8})]
    for fragment, rows in zip(fragments, (8, 16)):
        fragment.batch["rows"] = rows
    assert deal(fragments, 2, "pa") == [[fragments[0]], [fragments[1]]]
    assert deal(fragments, 2, "pb") == [[fragments[1]], []]
    assert deal(fragments, 1, "pc") == [[]]
    updates: list = []
    groups = {
        "pa": RecordingLearners(0, updates),  # in the driver: one shard
        "pb": RecordingLearners(2, updates),  # 2 learners, 1 fragment with its rows: sits out
        "pc": RecordingLearners(0, updates),  # no rows at all: sits out
    }
    thread = LearnerThread(
        groups, queue_size=2, num_sgd_steps=1, broadcast_interval=1, max_policy_lag=None
    )
    thread.start()
    try:
        assert thread.offer(fragments) and thread.offer([multi_agent_fragment({"pc": 0})])
        for _ in range(600):
            if thread.dropped_fragments or thread.error:
                break
            thread.join(0.1)
        thread.check()
    finally:
        thread.stop()
    assert updates == [("pa", [[fragments[0].batch, fragments[1].batch]])]
    [stats] = thread.take_results()
    assert stats == {
        "pa/num_samples_trained": Stat(24, "sum"),
        "pa/policy_lag_mean": Stat(1.0),
        "pa/policy_lag_max": Stat(2, "max"),
        "pa/x": Stat(1.0),
        "num_samples_trained": Stat(24, "sum"),
        "policy_lag_mean": Stat(1.0),
        "policy_lag_max": Stat(2, "max"),
    }
    assert thread.version == 1 and thread.dropped_fragments == 1  # the batch nobody trained on
    version, weights = thread.take_weights()
    assert version == 1 and list(weights) == ["pa"]  # only the trained policy's weights
    # those that sat out act under the new version (acting learners: no lag from it)
    assert [groups[p].acting_versions for p in ("pa", "pb", "pc")] == [[], [1], [1]]


class OneUpdateAtATime:
    """Learners whose update waits for `release`; last_gradients notes whether it
    was called while an update ran."""

    num_learners = 0

    def __init__(self):
        self.updating, self.overlapped = False, None
        self.started, self.release = threading.Event(), threading.Event()

    def update_on_fragments(self, shards, version, num_sgd_steps, policy_id):
        self.updating = True
        self.started.set()
        self.release.wait(60)
        self.updating = False
        return {}

    def get_weights(self):
        return {}

    def last_gradients(self):
        self.overlapped = self.updating
        return {"w": np.ones(2)}


def test_the_learner_threads_gradients_are_taken_between_two_updates():
    learners = OneUpdateAtATime()
    thread = LearnerThread(
        {None: learners}, queue_size=1, num_sgd_steps=1, broadcast_interval=1, max_policy_lag=None
    )
    thread.start()
    taken: list[dict] = []
    try:
        assert thread.offer([Fragment(None, {"env_steps": 4})])
        assert learners.started.wait(60)
        caller = threading.Thread(target=lambda: taken.append(thread.last_gradients()))
        caller.start()
        caller.join(0.2)
        assert caller.is_alive() and not taken  # the update holds it
        learners.release.set()
        caller.join(60)
    finally:
        learners.release.set()
        thread.stop()
    assert learners.overlapped is False and list(taken[0]) == ["w"]


@pytest.mark.slow  # Ray and its actors: ~20-40 s on a loaded 2-core machine
def test_async_learning_trains_and_drops_fragments_older_than_max_policy_lag(runners, learners):
    settings = AsyncSettings(
        train_batch_size=40, learner_queue_size=1, broadcast_interval=1, max_policy_lag=0
    )
    training = AsyncLearning(runners, learners, settings)
    try:
        first = training.run(min_steps=80)
        second = training.run(min_steps=80)
        grads = training.last_gradients()  # TensorBoard's, between two of the thread's updates
    finally:
        training.stop()
    for it in (first, second):
        report = it.report
        assert report["num_learner_updates"] == len(it.learner_stats) >= 1
        assert report["policy_lag_max"] == 0  # every row trained on acted with these weights
        assert 0.0 <= report["learner_queue_fill"] <= 1.0
        assert report["learner_idle_time_s"] >= 0 and report["env_runner_idle_time_s"] >= 0
        assert sum(m["env_steps"] for m in it.fragment_metrics) >= 80
    assert second.report["learner_version"] > first.report["learner_version"] >= 1
    weights = learners.get_weights()
    assert grads and set(grads) < set(weights)  # the value head is not in this loss
    assert all(g.shape == weights[k].shape and np.isfinite(g).all() for k, g in grads.items())
    # the weights of the second run's updates reached the runners without anyone waiting
    assert max(runners.weights_versions()) >= first.report["learner_version"]


@pytest.mark.slow  # Ray and its actors: ~20-40 s on a loaded 2-core machine
def test_two_learner_actors_train_on_their_own_fragments_as_one_device(runners):
    stream = FragmentStream(runners, max_requests_in_flight_per_env_runner=2)
    stream.top_up()
    fragments = drain(stream)
    group = LearnerGroup(
        fakes.ReturnsPGPolicy,
        runners.observation_space,
        runners.action_space,
        {**CONFIG, "num_learners": 2, "num_cpus_per_learner": 0.5},
    )
    try:
        one = fakes.ReturnsPGPolicy(runners.observation_space, runners.action_space, CONFIG)
        group.set_weights(one.get_weights())
        shards = [[f.batch for f in shard] for shard in deal(fragments, 2)]
        stats = group.update_on_fragments(shards, learner_version=3)
        batches = ray.get([f.batch for f in fragments])
        one.learn_on_batch(concat_samples(batches).copy())
        fakes.assert_weights_close(one.get_weights(), group.get_weights())
        assert group.weights_identical()
        rows = sum(b.count for b in batches)
        assert stats["num_samples_trained"] == Stat(rows, "sum")  # over updates: summed
        lags = np.concatenate([3 - np.asarray(b["weights_version"]) for b in batches])
        assert stats["policy_lag_mean"].value == pytest.approx(lags.mean())
        assert stats["policy_lag_max"] == Stat(lags.max(), "max")
    finally:
        group.stop()
