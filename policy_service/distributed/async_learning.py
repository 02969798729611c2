"""AsyncLearning: env runners and learners working at once (IMPALA, APPO).

    training = AsyncLearning(env_runners, learners, AsyncSettings(train_batch_size=500))
    while True:
        it = training.run(min_steps=500)       # until >= 500 env steps and >= 1 update
        it.fragment_metrics                    # each fragment's sample() metrics
        it.learner_stats                       # each update's Stats (metrics_logger.py)
        it.report                              # policy lag, queue fill, idle times, losses
    training.stop()

The driver only moves references and metrics: a FragmentStream keeps requests
in flight on every env runner; fragments gather into train batches of
`train_batch_size` env steps (agent steps with count_steps_by="agent_steps") that a
LearnerThread's bounded queue takes; when it is full no runner is asked again, so
memory stays bounded and the runners wait (their idle time is reported). Weights
the thread took after every `broadcast_interval` updates go to the runners without
waiting for them. With `trained` (multi-agent runs) each trained policy's learners
train on its own rows of the same fragments (LearnerThread).

When the learners act for the runners (inference: learners), learners replaced
after a death, by whichever thread found it, are handed to every runner
(EnvRunnerGroup.set_inference_actors); a runner that found its learner dead first
waits for that, and has the driver replace the learners if no one did yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.fragment_stream import Fragment, FragmentStream
from policy_service.distributed.learner_thread import LearnerThread
from policy_service.runs.metrics_logger import reduce_stats, stat_values

_POLL_S = 0.01


@dataclass(frozen=True)
class AsyncSettings:
    """How the asynchronous loop runs (the algorithms' config keys of these names)."""

    train_batch_size: int
    max_requests_in_flight_per_env_runner: int = 2
    learner_queue_size: int = 4
    num_sgd_steps: int = 1
    broadcast_interval: int | None = 1  # None: the learners act, nothing to send
    max_policy_lag: int | None = None
    count_steps_by: str = "env_steps"  # what train_batch_size and run's minimum count


def makes_train_batch(
    fragments: list[Fragment], settings: AsyncSettings, num_learners: int
) -> bool:
    """Whether `fragments` hold train_batch_size steps (counted by count_steps_by) and
    at least one fragment for each learner."""
    steps = sum(f.steps(settings.count_steps_by) for f in fragments)
    return steps >= settings.train_batch_size and len(fragments) >= max(1, num_learners)


@dataclass
class AsyncIteration:
    """What one `run` saw."""

    fragment_metrics: list[dict] = field(default_factory=list)
    learner_stats: list[dict] = field(default_factory=list)  # reduced by their rules
    report: dict = field(default_factory=dict)


class AsyncLearning:
    """The asynchronous actor-learner loop over an EnvRunnerGroup and a LearnerGroup.

    trained: multi-agent runs' policy id -> LearnerGroup of each policy trained on its
    own rows (`learners`, theirs and the others', gives the weights to resume with);
    None: `learners` trains on every row."""

    def __init__(
        self,
        env_runners: EnvRunnerGroup,
        learners,
        settings: AsyncSettings,
        trained: dict | None = None,
    ):
        self.env_runners = env_runners
        self.learners = learners
        self.trained = {None: learners} if trained is None else trained
        self.settings = settings
        self.stream = FragmentStream(env_runners, settings.max_requests_in_flight_per_env_runner)
        self.thread = self._start_thread(version=0)
        self._pending: list[Fragment] = []
        self.dropped_fragments = 0  # queued or pending fragments dropped by a pause

    def _start_thread(self, version: int) -> LearnerThread:
        s = self.settings
        thread = LearnerThread(
            self.trained,
            queue_size=s.learner_queue_size,
            num_sgd_steps=s.num_sgd_steps,
            broadcast_interval=s.broadcast_interval,
            max_policy_lag=s.max_policy_lag,
            version=version,
        )
        thread.start()
        return thread

    @property
    def version(self) -> int:
        """Updates the learners made so far."""
        return self.thread.version

    def run(self, min_steps: int) -> AsyncIteration:
        """Sample and train until >= min_steps steps (counted by count_steps_by) were
        sampled and the learners finished at least one update -> what happened meanwhile."""
        it = AsyncIteration()
        steps, fills = 0, []
        idle_runners = self.stream.env_runner_idle_s
        idle_learner = self.thread.idle_s
        dropped = self.thread.dropped_fragments
        lost = self.stream.lost_fragments
        start = time.perf_counter()
        while steps < min_steps or not it.learner_stats:
            self.thread.check()
            self._act_through_current_learners()
            self._send_weights()
            if not self._batch_waiting():
                self.stream.top_up()
            for fragment in self.stream.collect(_POLL_S):
                self._pending.append(fragment)
                it.fragment_metrics.append(fragment.metrics)
                steps += fragment.steps(self.settings.count_steps_by)
            if self._batch_waiting() and self.thread.offer(self._pending):
                self._pending = []
            fills.append(self.thread.queue_fill())
            it.learner_stats += self.thread.take_results()
        elapsed = time.perf_counter() - start
        it.report = {
            "learner_queue_fill": sum(fills) / len(fills),
            "learner_idle_time_s": self.thread.idle_s - idle_learner,
            "learner_idle_fraction": (self.thread.idle_s - idle_learner) / max(elapsed, 1e-9),
            "env_runner_idle_time_s": self.stream.env_runner_idle_s - idle_runners,
            "num_fragments_dropped_for_lag": self.thread.dropped_fragments - dropped,
            "num_fragments_lost": self.stream.lost_fragments - lost,
            "num_learner_updates": len(it.learner_stats),
            "learner_version": self.version,
            **stat_values(reduce_stats(it.learner_stats)),
        }
        return it

    def _batch_waiting(self) -> bool:
        """Whether the pending fragments make a train batch for every learner."""
        return makes_train_batch(self._pending, self.settings, self.learners.num_learners)

    def _act_through_current_learners(self) -> None:
        """Inference by the learners: the runners act through the learner actors there
        are now; when a runner found its own dead, dead learners are replaced first
        (before the runners are asked again: the new handles reach them first)."""
        if not self.env_runners.inference_actors:
            return
        if self.stream.runners_without_acting():
            self.learners.replace_dead_learners()
            self.stream.acting_restored()
        actors = self.learners.actors
        if actors != self.env_runners.inference_actors:
            self.env_runners.set_inference_actors(actors)

    def _send_weights(self) -> None:
        weights = self.thread.take_weights()
        if weights is not None:
            version, values = weights
            self.env_runners.sync_weights(values, version=version, wait=False)

    def last_gradients(self) -> dict:
        """The learners' last gradients (LearnerThread.last_gradients)."""
        return self.thread.last_gradients()

    def updates_held(self):
        """A context in which no learner update runs (LearnerThread.updates_held):
        sampling, the fragments in flight and the queue go on untouched (a save)."""
        return self.thread.updates_held()

    def pause(self) -> None:
        """Stop learning and forget the requests in flight (before a restore, or env
        runners rebuilt); the updates made so far are kept."""
        self.dropped_fragments += self.thread.stop() + len(self._pending)
        self.stream.forget()
        self._pending = []
        self.thread.check()

    def set_version(self, version: int) -> None:
        """While paused: the update count to go on from (a restored checkpoint's)."""
        if self.thread.is_alive():
            raise RuntimeError("set_version needs a paused AsyncLearning (call pause() first)")
        self.thread.version = int(version)

    def resume(self, env_runners: EnvRunnerGroup) -> None:
        """Go on after `pause` with these env runners (maybe rebuilt), acting with the
        learners' weights under the current version."""
        self.env_runners = env_runners
        self.stream = FragmentStream(
            env_runners, self.settings.max_requests_in_flight_per_env_runner
        )
        env_runners.sync_weights(self.learners.get_weights(), version=self.version)
        self.learners.set_acting_version(self.version)  # learners acting: nothing was sent
        self.thread = self._start_thread(version=self.version)

    def stop(self) -> None:
        """End learning and read the requests in flight; runners still starting are
        left to the env runners' stop."""
        self.thread.stop()
        self.stream.forget(install=False)
