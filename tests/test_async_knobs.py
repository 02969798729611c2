"""The asynchronous loop's knobs and gauges, each where its outcome is certain:
`broadcast_interval` (LearnerThread.take_weights, and the versions runners act with),
`max_policy_lag` (fragments of chosen versions, and a stale batch queued behind an
update held back), the learner's and the runners' idle times and the queue fill.
The LearnerThread tests need no Ray; the others share one EnvRunnerGroup."""

import threading
import time

import envs
import fakes
import gymnasium as gym
import numpy as np
import pytest
import ray
from async_runs import CONFIG, SCRIPT, drain
from waiting import wait_until

from policy_service import LearnerGroup
from policy_service.distributed.async_learning import AsyncLearning, AsyncSettings
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.fragment_stream import Fragment, FragmentStream
from policy_service.distributed.learner import resolve_fragments
from policy_service.distributed.learner_thread import LearnerThread
from policy_service.distributed.policy_actor import PolicyActor
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.runs.metrics_logger import Stat

FAST_SCRIPT = {**SCRIPT, "step_sleep_s": 0.0}
RUNNERS_WAIT_S = 0.3  # how long the runners are kept waiting on a full learner queue
POLL_S = 0.002  # the learner thread changes within milliseconds


def wait_for_an_update(thread: LearnerThread) -> list[dict]:
    """The statistics of the thread's next update(s), once there are any."""
    results: list[dict] = []

    def updated() -> bool:
        results.extend(thread.take_results())
        return bool(results) or thread.error is not None

    wait_until(updated, "an update", poll_s=POLL_S)
    thread.check()
    return results


def run_to_the_end(thread: LearnerThread) -> list[dict]:
    """Start `thread` on what was offered, stop it once it took the last batch (stop
    lets that update finish) -> each update's statistics."""
    thread.start()
    try:
        wait_until(
            lambda: thread.batches.empty() or thread.error is not None, "the queue", poll_s=POLL_S
        )
    finally:
        assert thread.stop() == 0  # nothing left in the queue
    thread.check()
    return thread.take_results()


@pytest.fixture(scope="module")
def worker():
    """A RolloutWorker in this process: fragments of 20 rows, under chosen versions."""
    rollout = RolloutWorker(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_envs=2,
        rollout_fragment_length=10,
        env_config=FAST_SCRIPT,
        seed=0,
    )
    yield rollout
    rollout.stop()


@pytest.fixture(scope="module")
def learners(worker):
    """The learner in this process (num_learners=0)."""
    group = LearnerGroup(
        fakes.ReturnsPGPolicy, worker.observation_space, worker.action_space, CONFIG
    )
    yield group
    group.stop()


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
    group.wait_started()
    yield group
    group.stop()


class CountingLearners:
    """Learners whose weights are the number of updates they made; an update waits
    for `release` (set from the start unless cleared)."""

    num_learners = 0

    def __init__(self):
        self.updates = 0
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()
        self.idle_on_entry: float | None = None
        self.thread: LearnerThread | None = None

    def update_on_fragments(self, shards, version, num_sgd_steps, policy_id):
        if self.thread is not None:
            self.idle_on_entry = self.thread.idle_s
        self.entered.set()
        assert self.release.wait(60)
        self.updates += 1
        return {
            "num_samples_trained": Stat(4, "sum"),
            "policy_lag_mean": Stat(0.0),
            "policy_lag_max": Stat(0, "max"),
        }

    def get_weights(self):
        return {"w": np.array([self.updates])}

    def set_acting_version(self, version: int) -> None:
        pass


class TrainedRows:
    """A LearnerGroup that notes each update's learner version and the
    "weights_version" of every row it trains on; `before_first_update` runs in the
    learner thread before the first update."""

    def __init__(self, learners, before_first_update=None):
        self.learners = learners
        self.before_first_update = before_first_update
        self.updates: list[tuple[int, np.ndarray]] = []

    def __getattr__(self, name):
        return getattr(self.__dict__["learners"], name)

    def update_on_fragments(self, shards, learner_version, num_sgd_steps=1, policy_id=None):
        if self.before_first_update is not None:
            before, self.before_first_update = self.before_first_update, None
            before()
        batches = resolve_fragments([f for shard in shards for f in shard])
        acted = np.concatenate([np.asarray(b["weights_version"]) for b in batches])
        self.updates.append((learner_version, acted))
        return self.learners.update_on_fragments(shards, learner_version, num_sgd_steps, policy_id)

    def lags(self) -> np.ndarray:
        return np.concatenate([version - acted for version, acted in self.updates])

    def acted_versions(self) -> set[int]:
        return {int(v) for _, acted in self.updates for v in acted}


def fragments_acted_with(worker: RolloutWorker, versions: list[int]) -> list[Fragment]:
    """One fragment sampled under each of `versions` (rows and metrics say so)."""
    fragments = []
    for version in versions:
        worker.set_weights(worker.get_weights(), version)
        fragments.append(Fragment.sampled(*worker.sample()))
    return fragments


# ----- broadcast_interval --------------------------------------------------------------------


@pytest.mark.parametrize(
    "interval, taken",
    [
        (1, [1, 2, 3, 4, 5, 6, 7]),
        (3, [None, None, 3, None, None, 6, None]),
        (None, [None] * 7),  # the learners act: nothing to send
    ],
)
def test_the_thread_takes_the_weights_after_every_broadcast_interval_updates(interval, taken):
    learners = CountingLearners()
    thread = LearnerThread(
        {None: learners},
        queue_size=1,
        num_sgd_steps=1,
        broadcast_interval=interval,
        max_policy_lag=None,
    )
    thread.start()
    seen = []
    try:
        for _ in taken:  # one update at a time; its weights, if any, taken after it
            assert thread.offer([Fragment(None, {"env_steps": 4})])
            wait_for_an_update(thread)
            weights = thread.take_weights()
            seen.append(weights)
    finally:
        thread.stop()
    assert [w and w[0] for w in seen] == taken
    for weights in filter(None, seen):  # the weights of that update, not older ones
        version, values = weights
        assert values["w"].tolist() == [version]


@pytest.mark.slow  # Ray and 2 env runners: ~10-20 s on a loaded 2-core machine
def test_runners_act_only_with_the_weights_of_every_third_update(runners, learners):
    runners.sync_weights(learners.get_weights(), version=0)
    recorded = TrainedRows(learners)
    settings = AsyncSettings(train_batch_size=40, broadcast_interval=3)
    training = AsyncLearning(runners, recorded, settings)
    fragment_versions = set()
    try:
        for _ in range(60):  # until rows acted with the second broadcast were trained
            it = training.run(min_steps=40)
            fragment_versions |= {m["weights_version"] for m in it.fragment_metrics}
            if max(recorded.acted_versions()) >= 6:
                break
        acting = runners.weights_versions()
    finally:
        training.stop()
    assert training.version >= 7
    every_third = set(range(0, training.version + 1, 3))
    acted = recorded.acted_versions()
    # which broadcasts a runner catches depends on its speed (a slow one may act with 0 until
    # 6 arrives): never one between them, and the runners did get newer weights
    assert 0 in acted and max(acted) >= 6 and acted <= every_third
    assert fragment_versions <= every_third
    assert set(acting) <= every_third


# ----- max_policy_lag --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "max_lag, lag_maxes, dropped",
    [
        (None, [0, 1, 1, 3], []),
        (0, [0, 0], [2, 4, 5]),
        (1, [0, 1, 1], [5]),
    ],
)
def test_fragments_older_than_max_policy_lag_are_dropped_counted_and_never_trained(
    worker, learners, max_lag, lag_maxes, dropped
):
    """Batches acted with [0, 0], [0, 1], [1], [0], trained in that order: a fragment's
    lag is the updates made so far - its version; a batch left empty is no update.
    `dropped`: the indices of the fragments that must be dropped."""
    f = fragments_acted_with(worker, [0, 0, 0, 1, 1, 0])
    batches = [[f[0], f[1]], [f[2], f[3]], [f[4]], [f[5]]]
    thread = LearnerThread(
        {None: learners},
        queue_size=4,
        num_sgd_steps=1,
        broadcast_interval=1,
        max_policy_lag=max_lag,
    )
    for batch in batches:
        assert thread.offer(batch)
    stats = run_to_the_end(thread)
    assert [s["policy_lag_max"].value for s in stats] == lag_maxes
    assert all(s["policy_lag_max"].value <= (np.inf if max_lag is None else max_lag) for s in stats)
    assert thread.dropped_fragments == len(dropped) and thread.version == len(lag_maxes)
    trained = [f[i].env_steps for i in range(len(f)) if i not in dropped]
    assert sum(s["num_samples_trained"].value for s in stats) == sum(trained)


@pytest.mark.slow  # Ray, 2 env runners and a PolicyActor: ~10-20 s here
def test_a_fragment_acted_partly_with_older_weights_is_judged_by_its_oldest_rows(
    ray_local, learners
):
    """Through a PolicyActor the weights change mid-fragment (a learner's update
    reaches the actor at the env's 5th step): half the rows acted with version 0,
    half with 4. Trained at version 4 with max_policy_lag=0, no row may lag by 4."""
    spaces = learners.observation_space, learners.action_space
    actor = PolicyActor.options(num_cpus=0.25).remote(fakes.ReturnsPGPolicy, *spaces, CONFIG)
    try:
        weights = ray.get(actor.get_weights.remote())

        def env_updated_at_step_5(config):
            return SetsWeightsAtStep(envs.ScriptedEpisodesEnv(config), actor, weights, 5, 4)

        acting = RolloutWorker(
            env_updated_at_step_5,
            fakes.ReturnsPGPolicy,
            CONFIG,
            num_envs=1,
            rollout_fragment_length=10,
            env_config=FAST_SCRIPT,
            policy_actor=actor,
        )
        fragment = Fragment.sampled(*acting.sample())
        acting.stop()
    finally:
        ray.kill(actor)
    acted = np.asarray(fragment.batch["weights_version"])
    assert set(acted.tolist()) == {0, 4}  # the setup: the update landed mid-fragment
    thread = LearnerThread(
        {None: learners},
        queue_size=1,
        num_sgd_steps=1,
        broadcast_interval=1,
        max_policy_lag=0,
        version=4,
    )
    assert thread.offer([fragment])
    stats = run_to_the_end(thread)
    assert [s["policy_lag_max"].value for s in stats] == [0] or not stats  # fails: [4]
    assert fragment.weights_version == acted.min()  # "the oldest weights version that acted"


class SetsWeightsAtStep(gym.Wrapper):
    """At its `at`-th step, `actor` gets `weights` under `version` (an update landing)."""

    def __init__(self, env, actor, weights, at: int, version: int):
        super().__init__(env)
        self.actor, self.weights, self.at, self.version = actor, weights, at, version
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            ray.get(self.actor.set_weights.remote(self.weights, self.version))
        return self.env.step(action)


# ----- a stale batch queued behind an update held back: drops, idle runners, queue fill -------


@pytest.mark.slow  # Ray and 2 env runners: ~10-20 s on a loaded 2-core machine
def test_a_batch_queued_behind_the_first_update_is_dropped_counted_and_the_runners_wait(
    runners, learners
):
    """The first update waits until the next batch is queued (the queue full) and every
    runner has answered all its requests (none is asked again), then RUNNERS_WAIT_S more.
    That queued batch acted with version 0 and is trained after update 1: with
    max_policy_lag=0 every fragment of it is dropped, counted in the reports."""
    runners.sync_weights(learners.get_weights(), version=0)
    loop: dict = {}

    def once_the_queue_is_full_and_the_runners_wait():
        training = loop["training"]
        wait_until(
            lambda: (
                training.thread.queue_fill() == 1.0 and training.stream.requests_in_flight() == 0
            ),
            "a full queue and idle runners",
            poll_s=POLL_S,
        )
        time.sleep(RUNNERS_WAIT_S)

    recorded = TrainedRows(learners, once_the_queue_is_full_and_the_runners_wait)
    settings = AsyncSettings(
        train_batch_size=40, learner_queue_size=1, broadcast_interval=1, max_policy_lag=0
    )
    training = loop["training"] = AsyncLearning(runners, recorded, settings)
    try:
        first = training.run(min_steps=40)
        second = training.run(min_steps=40)  # needs an update after the stale batch
        dropped = training.thread.dropped_fragments
    finally:
        training.stop()
    reports = [first.report, second.report]
    assert sum(r["num_fragments_dropped_for_lag"] for r in reports) == dropped >= 2
    assert all(r["policy_lag_max"] == 0 for r in reports)
    assert recorded.updates[0][0] == 0 and (recorded.lags() == 0).all()
    # both runners waited from their last answer until asked again, after the update
    runner_idle = sum(r["env_runner_idle_time_s"] for r in reports)
    assert runner_idle >= 2 * RUNNERS_WAIT_S
    assert first.report["learner_queue_fill"] > 0  # full while the update was held
    # the thread waited while the first fragments were sampled (10 env steps of 5 ms)
    assert first.report["learner_idle_time_s"] > 0


# ----- idle times, component by component -------------------------------------------------------


def test_the_learner_thread_is_idle_on_an_empty_queue_and_not_while_it_updates():
    learners = CountingLearners()
    learners.release.clear()
    thread = LearnerThread(
        {None: learners}, queue_size=1, num_sgd_steps=1, broadcast_interval=1, max_policy_lag=None
    )
    learners.thread = thread
    born = time.perf_counter()
    thread.start()
    try:
        wait_until(lambda: thread.idle_s > 0, "a first poll of the empty queue", poll_s=POLL_S)
        before = thread.idle_s
        time.sleep(0.4)  # the queue stays empty
        idle_while_empty = thread.idle_s - before
        assert thread.offer([Fragment(None, {"env_steps": 4})])
        assert learners.entered.wait(60)
        time.sleep(0.2)  # the update is held
        idle_while_updating = thread.idle_s - learners.idle_on_entry
    finally:
        learners.release.set()
        thread.stop()
    lifetime = time.perf_counter() - born
    assert idle_while_empty >= 0.3  # 0.4 s waited; the slack is the loop's own bookkeeping
    assert idle_while_updating == 0.0
    assert thread.idle_s <= lifetime


@pytest.mark.slow  # Ray and 2 env runners
def test_runners_not_asked_again_are_idle_until_asked(runners):
    stream = FragmentStream(runners, max_requests_in_flight_per_env_runner=1)
    stream.top_up()
    start = stream.env_runner_idle_s
    stream.top_up()  # both still sampling: no one was idle
    assert stream.env_runner_idle_s == start
    assert len(drain(stream)) == 2
    answered = time.monotonic()  # every runner answered before this
    time.sleep(RUNNERS_WAIT_S)
    asked = time.monotonic()
    stream.top_up()
    assert stream.env_runner_idle_s - start >= 2 * (asked - answered)
    drain(stream)
    stream.forget()
