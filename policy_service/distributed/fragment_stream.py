"""FragmentStream: env runners sampling without pause, fragments left in the object store.

    stream = FragmentStream(env_runners, max_requests_in_flight_per_env_runner=2)
    while training:
        if learners_have_room:
            stream.top_up()                    # every runner: 2 sample requests queued
        for fragment in stream.collect(timeout_s=0.01):
            fragment.batch                     # an ObjectRef; the driver never fetches it
            fragment.metrics                   # env steps, episodes, weights_version
    stream.lost_fragments                      # requests lost with a dead runner

Each request is `RolloutWorker.sample` with two returns: the metrics come to the
driver, the batch stays in the object store until a learner reads it. `request`
names another worker method of that shape, e.g. "sample_and_compute_gradients"
(A3C): each Fragment's payload is then its gradients. A runner
whose requests are all answered and that is not asked again (the learners' queue
is full) waits: its idle time is counted. A dead runner is replaced with the
latest weights (EnvRunnerGroup's budgets) while the others go on sampling: its
replacement starts in the background and is asked once up; the dead one's requests
in flight are lost and counted, none is half-delivered. A runner whose acting actor
died (inference by the learners) lives on: its failed requests are lost and counted,
and it is not asked again until the acting actors answer again (`runners_without_acting`,
`acting_restored`). A request lost with a PolicyActor that Ray restarted is counted
and asked again; a PolicyActor dead for good ends the stream in the group's one
line (EnvRunnerFailure), as synchronous sampling does, once Ray's restarts settled.
With no remote runner (num_env_runners=0) the local worker samples the one fragment
`top_up` asked for in the next `collect`.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import ray

from policy_service.distributed.actor_pool import CallResult, Outcome, gather
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.rollout_worker import fragment_metrics

SETTLE_S = 30.0  # longest wait, when forgetting, for the requests in flight to finish


class Fragment(NamedTuple):
    """One sampled fragment: its batch (ObjectRef, or a SampleBatch sampled here;
    with another `request`, that method's first return) and the worker's sample()
    metrics as its values."""

    batch: Any
    metrics: dict

    @classmethod
    def sampled(cls, batch: Any, metrics: dict) -> Fragment:
        """From a worker's two returns: its Stats as this fragment's values."""
        return cls(batch, fragment_metrics(metrics))

    @property
    def env_steps(self) -> int:
        return int(self.metrics["env_steps"])

    def steps(self, count_steps_by: str) -> int:
        """Its env steps, or with "agent_steps" its agents' steps (a multi-agent
        fragment's rows of every agent; a single-agent one's are its env steps)."""
        if count_steps_by == "agent_steps":
            return int(self.metrics.get("agent_steps", self.env_steps))
        return self.env_steps

    def rows(self, policy_id: str | None) -> int:
        """The rows of `policy_id` in a multi-agent fragment; None: every row (env steps)."""
        if policy_id is None:
            return self.env_steps
        return int(self.metrics["policy_agent_steps"].get(policy_id, 0))

    @property
    def weights_version(self) -> int:
        """The oldest weights version that acted in it."""
        version = self.metrics.get("weights_version")
        return 0 if version is None else int(version)


class _Request(NamedTuple):
    """A sample request in flight: the runner's slot, the worker asked, the batch's
    ref, and the inference actors acting for the runners when it was asked."""

    slot: int
    worker: Any
    batch: ray.ObjectRef
    acting: list | dict


class FragmentStream:
    """`max_requests_in_flight_per_env_runner` sample requests kept queued on
    every remote env runner of `env_runners`; `request`: the RolloutWorker method
    asked, one returning (payload, metrics) as `sample` does."""

    def __init__(
        self,
        env_runners: EnvRunnerGroup,
        max_requests_in_flight_per_env_runner: int,
        request: str = "sample",
    ):
        if max_requests_in_flight_per_env_runner < 1:
            raise ValueError(
                "max_requests_in_flight_per_env_runner must be >= 1, got "
                f"{max_requests_in_flight_per_env_runner}"
            )
        self.env_runners = env_runners
        self.request = request
        self.max_in_flight = int(max_requests_in_flight_per_env_runner)
        self.lost_fragments = 0
        self._local_asked = False
        self.env_runner_idle_s = 0.0
        self._in_flight: dict[ray.ObjectRef, _Request] = {}  # by the metrics' ref
        self._without_acting: set[int] = set()  # slots that found their acting actor dead
        now = time.monotonic()
        self._idle_since: dict[int, float] = {s: now for s in range(len(env_runners.workers))}

    def runners_starting(self) -> list[int]:
        """Slots whose dead runner's replacement is starting (not asked until it is up)."""
        return self.env_runners.runners_starting()

    def requests_in_flight(self) -> int:
        return len(self._in_flight) + int(self._local_asked)

    def runners_without_acting(self) -> list[int]:
        """Slots of the runners that found their acting actor dead: not asked again
        until `acting_restored`."""
        return sorted(self._without_acting)

    def acting_restored(self) -> None:
        """The acting actors answer again (replaced and handed over, or found alive):
        the runners that found theirs dead are asked again."""
        self._without_acting.clear()

    def top_up(self) -> None:
        """Ask every remote runner for fragments until it has the maximum in flight
        (the worker in this process, when it samples: for one, sampled by the next
        `collect`); not those waiting for a new acting actor or starting."""
        self._install_started(wait=False)
        self._local_asked = self.env_runners.samples_in_driver()
        now = time.monotonic()
        if self._local_asked:  # no remote runners, or they are starting: not idle
            self._idle_since = {slot: now for slot in self._idle_since}
            return
        counts = [0] * len(self.env_runners.workers)
        for request in self._in_flight.values():
            counts[request.slot] += 1
        starting = self.env_runners.runners_starting()
        for slot, count in enumerate(counts):
            if slot in self._without_acting or slot in starting:
                continue
            for _ in range(self.max_in_flight - count):
                self._ask(slot)
            if count < self.max_in_flight and slot in self._idle_since:
                self.env_runner_idle_s += now - self._idle_since.pop(slot)

    def collect(self, timeout_s: float) -> list[Fragment]:
        """The fragments finished by now, waiting at most `timeout_s` for the first."""
        local = self.env_runners.local_worker
        if self._local_asked and local is not None:
            self._local_asked = False
            payload, metrics = getattr(local, self.request)()
            return [Fragment.sampled(payload, metrics)]
        if not self._in_flight:
            time.sleep(timeout_s)  # nothing asked (the learners are full): let them work
            return []
        ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
        fragments = []
        for ref in ready:
            if ref not in self._in_flight:  # lost with a dead runner, counted already
                continue
            fragment = self._receive(ref)
            if fragment is not None:
                fragments.append(fragment)
        return fragments

    def forget(self, install: bool = True) -> int:
        """Drop every request in flight (runners rebuilt, training paused, or the run
        ended) -> how many. A runner still starting is waited for, so that every slot
        holds a live one (`install`; False when the run ends: the pool's stop ends the
        ones starting), and so are the requests in flight (at most SETTLE_S): Ray
        logs the traceback of a request that fails after it was dropped."""
        if install:
            self._install_started(wait=True)
        count = self.requests_in_flight()
        self._settle_requests()
        self._in_flight.clear()
        self._without_acting.clear()
        self._local_asked = False
        now = time.monotonic()
        self._idle_since = {s: now for s in range(len(self.env_runners.workers))}
        return count

    def _settle_requests(self) -> None:
        """Wait for the requests in flight to finish (at most SETTLE_S; a hung env is
        not waited for longer) and read the errors of those that failed, so that
        dropping them makes Ray log nothing."""
        if not self._in_flight:
            return
        refs = list(self._in_flight)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)
        for ref in done:
            try:
                ray.get(ref)  # the metrics: small
            except Exception:  # noqa: BLE001 - failed: its batch holds the same error
                _read_error(self._in_flight[ref].batch)

    def _ask(self, slot: int) -> None:
        worker = self.env_runners.workers[slot]
        method = getattr(worker, self.request)
        batch_ref, metrics_ref = method.options(num_returns=2).remote()
        self._in_flight[metrics_ref] = _Request(
            slot, worker, batch_ref, self.env_runners.inference_actors
        )

    def _receive(self, ref: ray.ObjectRef) -> Fragment | None:
        slot, asked, batch_ref, acting = self._in_flight.pop(ref)
        [result] = gather([ref])
        if result.error is not None:
            _read_error(batch_ref)
            self._lost(slot, asked, acting, result)
        starting = slot in self.env_runners.runners_starting()
        if not starting and all(r.slot != slot for r in self._in_flight.values()):
            self._idle_since.setdefault(slot, time.monotonic())
        return Fragment.sampled(batch_ref, result.value) if result.ok else None

    def _lost(self, slot: int, asked, acting: list | dict, result: CallResult) -> None:
        """The failed request `result` of the runner `asked` in `slot`: counted lost
        with its acting actor, the PolicyActor (once Ray restarted it) or the runner
        (replaced); else the runner's own error raised."""
        error = result.error
        assert error is not None
        if self.env_runners.acting_actor_died(error):
            self.lost_fragments += 1
            if acting == self.env_runners.inference_actors:  # none handed over since
                self._without_acting.add(slot)
        elif result.outcome is Outcome.DIED:
            self._lost_with_runner(slot, asked, error)
        elif self.env_runners.policy_actor_is_back(error):
            self.lost_fragments += 1  # lost with the PolicyActor, which Ray restarted
        else:
            result.get()  # the worker's own code raised

    def _lost_with_runner(self, slot: int, asked, error: BaseException) -> None:
        """A request of the dead runner `asked` failed: counted, and at the first one
        its replacement starts and its other requests are counted lost at once."""
        self.lost_fragments += 1
        if self.env_runners.workers[slot] is asked and slot not in self.runners_starting():
            self.env_runners.replace_in_background(slot, "async sampling", error)
            self._idle_since.pop(slot, None)  # starting, not idle
            for key, request in list(self._in_flight.items()):
                if request.slot == slot and request.worker is asked:  # lost with it
                    del self._in_flight[key]
                    self.lost_fragments += 1

    def _install_started(self, wait: bool) -> None:
        """The runners' replacements that are up take their slots (the env runners'
        pool: all of them when `wait`ing), idle from now until asked."""
        for slot in self.env_runners.install_started(wait):
            self._idle_since.setdefault(slot, time.monotonic())


def _read_error(ref: ray.ObjectRef) -> None:
    """Read a failed request's other return, so Ray does not log its error as unhandled."""
    try:
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - the error is the one its first return raised
        pass
