"""The two ways a LearnerGroup holds its learners, called alike.

`LocalLearners`: one Learner (learner.py) in this process. `RemoteLearners`: N
LearnerHost Ray actors, reserved as one placement group before any starts (or, when
this process runs in one, e.g. a Tune trial's, placed in that group's bundles),
each called with a deadline; a death or a hang ends the wait at once. The
group calls either one the same way, naming a Learner method itself (not a string),
so a type checker sees the method and its arguments:

    results = learners.call_each(Learner.update, shards, num_epochs, ...)  # shard i: learner i
    learners.call_all(Learner.set_state, state); learners.call_first(Learner.get_weights)
    learners.keep_state_copy()          # after a call that changed the state
    learners.latest_state()             # the state to restart from after a death
    learners.stop()
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from policy_service.distributed.acting_learner import ActingLearnerHost, serves_actions
from policy_service.distributed.actor_pool import ActorDied, Outcome, PoolStopped, gather
from policy_service.distributed.learner import Learner
from policy_service.distributed.learner_actor import LearnerHost
from policy_service.distributed.learner_state_copy import LearnerStateCopy
from policy_service.distributed.resources import (
    AVAILABLE_WAIT_S,
    ResourcesNotFreedError,
    check_cluster_fits,
)
from policy_service.distributed.role_asks import learner_asks, learner_bundle, learner_key
from policy_service.engine.collectives import CollectivePeerError
from policy_service.errors import RunFailure, UserError, one_line, own_error
from policy_service.policy import models
from policy_service.policy.policy_spec import PolicySpec

CONNECT_TIMEOUT_S = 180.0

L = TypeVar("L", bound=Learner)  # the learner class whose method is called
A = TypeVar("A")  # call_each: the argument that differs between learners
P = ParamSpec("P")
R = TypeVar("R")


class LearnerResourcesError(ResourcesNotFreedError):
    """The learners' placement group was not ready in time (their sum fits the
    cluster, but not as placed, e.g. PACK on no node big enough): exit 1."""


class LearnerDiedError(ActorDied):
    """A learner actor died, or a collective with a dead one failed: the group
    must be restarted (`LearnerGroup.restart`). `rank`: the learner seen first."""

    def __init__(self, message: str, rank: int = 0):
        super().__init__(message, f"learner {rank}")
        self.rank = rank


class LearnerStartError(UserError, ValueError):
    """A learner actor refused its config where it was placed (its node's devices): one
    line, at the start, before any training (exit 2)."""


class LearnerFailure(RunFailure, RuntimeError):
    """The learners' restart budget is spent: the run cannot go on (one line)."""


class LearnersStoppedError(PoolStopped):
    """A call on learners already stopped (by the caller, or replaced by another thread)."""


class LearnerTimeoutError(LearnerDiedError):
    """A call to the learners gave no result within `learner_update_timeout_s`."""


class LocalLearners:
    """One learner, a policy in this process: it never dies, so its live state is
    the copy a restart would start from."""

    def __init__(self, spec: PolicySpec, call_timeout_s: float):
        self.learner = Learner(spec.build())
        self.call_timeout_s = call_timeout_s  # unused: a call in this process has no deadline
        self.info = {**self.learner.info(), "devices": [self.learner.policy.devices]}

    @property
    def local_policy(self):
        return self.learner.policy

    @property
    def actors(self) -> list:
        return []

    def call_each(
        self,
        method: Callable[Concatenate[Learner, A, P], R],
        firsts: Sequence[A],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[R]:
        [first] = firsts
        return [method(self.learner, first, *args, **kwargs)]

    def call_all(
        self, method: Callable[Concatenate[Learner, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        return [method(self.learner, *args, **kwargs)]

    def call_first(
        self, method: Callable[Concatenate[Learner, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        return method(self.learner, *args, **kwargs)

    def keep_state_copy(self) -> None:
        """Nothing to copy: the state lives here."""

    def latest_state(self) -> dict:
        return self.learner.get_state()

    def newest_state(self) -> dict | None:
        return self.learner.get_state()

    def stop(self) -> None:
        """Nothing runs apart from this process."""


class RemoteLearners:
    """N LearnerHost actors in one collective group, and the driver's last full copy
    of their state (LearnerStateCopy), asked for after every change.

    call_timeout_s: the deadline of every call (from `learner_update_timeout_s`)."""

    local_policy = None

    def __init__(self, spec: PolicySpec, call_timeout_s: float, ready_timeout_s: float):
        if not ray.is_initialized():
            raise RuntimeError(
                f"num_learners={spec.config.num_learners} needs Ray: call ray.init() "
                "(or distributed.ray_runtime.start_ray) before the LearnerGroup"
            )
        self.call_timeout_s = call_timeout_s
        self.actors: list = []
        self._placement_group = None
        try:
            self.info = self._start(spec, ready_timeout_s)
            self._state_copy = LearnerStateCopy(
                functools.partial(remote_call, self.actors[0], Learner.get_state)
            )
        except BaseException:
            self.stop()
            raise

    def _start(self, spec: PolicySpec, ready_timeout_s: float) -> dict:
        """Reserve, start and connect the actors -> learner 0's Learner.info()."""
        config = spec.config
        num_learners = int(config.num_learners)
        bundle = learner_bundle(config)
        deadline = time.monotonic() + ready_timeout_s
        enclosing = capturing_placement_group()
        if enclosing is not None:  # a Tune trial's group: its bundles hold the learners
            check_group_holds(enclosing, bundle, num_learners)
        else:
            check_cluster_fits(learner_asks(config), wait_s=min(ready_timeout_s, AVAILABLE_WAIT_S))
            if bundle:
                self._placement_group = reserve_placement_group(
                    bundle,
                    num_learners,
                    config.learner_placement_strategy,
                    max(1.0, round(deadline - time.monotonic(), 1)),
                )
        actor_cls = ray.remote(ActingLearnerHost if serves_actions(config) else LearnerHost)
        registry = models.custom_model_registry()
        for rank in range(num_learners):
            options = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0)}
            custom = {r: a for r, a in bundle.items() if r not in ("CPU", "GPU")}
            if custom:
                options["resources"] = custom
            if enclosing is not None:  # any bundle of it: the group's strategy placed them
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    enclosing,
                    placement_group_bundle_index=-1,
                    placement_group_capture_child_tasks=True,
                )
            elif self._placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=rank
                )
            self.actors.append(actor_cls.options(**options).remote(spec, registry))
        addresses = ray.get(
            [remote_call(actor, LearnerHost.address) for actor in self.actors],
            timeout=CONNECT_TIMEOUT_S,
        )
        try:
            infos = ray.get(
                [
                    remote_call(actor, LearnerHost.connect, rank, addresses)
                    for rank, actor in enumerate(self.actors)
                ],
                timeout=CONNECT_TIMEOUT_S,
            )
        except RayTaskError as err:
            if not isinstance(own_error(err), ValueError):
                raise
            # what the learner's node gave it cannot build the policy (e.g. a GPU Ray
            # assigned that TensorFlow does not see): the same on every try, so no restart
            raise LearnerStartError(
                f"a learner actor could not build its policy where Ray placed it: {one_line(err)}"
            ) from None
        if num_learners > 1:  # a seedless config initializes each learner differently
            # the whole state, not only the weights: a target network starts as a copy too
            state = ray.put(ray.get(remote_call(self.actors[0], Learner.get_state)))
            # an ObjectRef argument reaches the actor as its value
            ray.get([remote_call(a, Learner.set_state, state) for a in self.actors[1:]])  # type: ignore[arg-type]
        return {**infos[0], "devices": [info["devices"] for info in infos]}

    def call_each(
        self,
        method: Callable[Concatenate[L, A, P], R],
        firsts: Sequence[A],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[R]:
        """Learner i's `method(firsts[i], *args, **kwargs)` -> the results, by rank."""
        return self._results(
            [
                remote_call(actor, method, first, *args, **kwargs)
                for actor, first in zip(self.actors, firsts)
            ]
        )

    def call_all(
        self, method: Callable[Concatenate[L, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        """The same call on every learner (dict arguments put in the object store once)."""
        shared = [ray.put(a) if isinstance(a, dict) else a for a in args]
        # an ObjectRef reaches the actors as its value: the arguments' types hold
        calls = [remote_call(a, method, *shared, **kwargs) for a in self.actors]  # type: ignore[arg-type]
        return self._results(calls)

    def call_first(
        self, method: Callable[Concatenate[L, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Learner 0's `method` (for what every learner holds alike)."""
        return self._results([remote_call(self.actors[0], method, *args, **kwargs)])[0]

    def keep_state_copy(self) -> None:
        self._state_copy.refresh(self.call_timeout_s)

    def latest_state(self) -> dict:
        return self._state_copy.latest(self.call_timeout_s)

    def newest_state(self) -> dict | None:
        return self._state_copy.newest(self.call_timeout_s)

    def stop(self) -> None:
        """End the actors and free their reservation (idempotent)."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None

    def _results(self, refs: list[ray.ObjectRef[R]]) -> list[R]:
        """Every learner's result, by rank; the first death seen ends the wait (the
        others may be blocked in a collective with the dead one), and so does
        `call_timeout_s` without all results (LearnerTimeoutError)."""
        if not self.actors:
            raise LearnersStoppedError("this LearnerGroup is stopped")
        count = len(self.actors)
        results = gather(refs, self.call_timeout_s, stop_at_failure=True)
        for result in results:
            rank, error = result.slot, result.error
            if result.outcome is Outcome.DIED:
                raise LearnerDiedError(
                    f"learner {rank} of {count} died: {type(error).__name__}", rank
                ) from error
            if result.outcome is Outcome.RAISED:
                cause = getattr(error, "cause", None)
                if isinstance(cause, CollectivePeerError):
                    raise LearnerDiedError(f"learner {rank} of {count}: {cause}", rank) from error
                result.get()
        hung = [result.slot for result in results if result.outcome is Outcome.HUNG]
        if hung:
            raise LearnerTimeoutError(
                f"learner(s) {', '.join(map(str, hung))} of {count} gave no result within "
                f"learner_update_timeout_s={self.call_timeout_s:g} s: hung (e.g. in a "
                "collective with a stopped peer); the group must be restarted",
                hung[0],
            )
        return [result.value for result in results]


def remote_call(
    actor, method: Callable[Concatenate[L, P], R], *args: P.args, **kwargs: P.kwargs
) -> ray.ObjectRef[R]:
    """`method` (a Learner class's, e.g. `Learner.set_state`) on a learner actor: Ray
    calls an actor's method by its name, the caller names the method itself."""
    return getattr(actor, method.__name__).remote(*args, **kwargs)


# ----- reserving the learners' resources -------------------------------------------------


def capturing_placement_group():
    """The placement group this process runs in when its children go in it too (a Tune
    trial's: placement_group_capture_child_tasks), else None."""
    if not ray.get_runtime_context().should_capture_child_tasks_in_placement_group:
        return None
    return ray.util.get_current_placement_group()


def check_group_holds(group, bundle: dict, count: int) -> None:
    """Refuse, in one line, learners started inside a placement group (a Tune trial's)
    that has fewer than `count` bundles holding a learner's `bundle`: their own group
    would wait for what the enclosing one holds, and theirs in it would never start."""
    fitting = [
        spec
        for spec in group.bundle_specs
        if all(spec.get(resource, 0.0) + 1e-9 >= amount for resource, amount in bundle.items())
    ]
    if len(fitting) < count:
        raise LearnerResourcesError(
            f"{count} learner(s) asking {bundle} each run inside a placement group with "
            f"{len(fitting)} bundle(s) that hold one (its bundles: {group.bundle_specs}); a "
            "Tune trial's group has one per learner (algorithms.trial_bundles)"
        )


def reserve_placement_group(bundle: dict, count: int, strategy: str, timeout_s: float):
    """One placement group of `count` learner bundles, ready, or LearnerResourcesError
    after `timeout_s` (their sum is checked first: check_cluster_fits)."""
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if ready:
        return group
    remove_placement_group(group)
    available = ray.available_resources()
    asked = ", ".join(f"{r} {a * count:g} ({learner_key(r)}={a:g} each)" for r, a in bundle.items())
    have = ", ".join(f"{r} {available.get(r, 0.0):g}" for r in bundle)
    raise LearnerResourcesError(
        f"{count} learner(s) ({strategy}) not placed within {timeout_s:g} s: asked {asked}; "
        f"available now {have}"
    )
