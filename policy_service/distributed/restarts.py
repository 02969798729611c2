"""A PolicyActor that Ray restarts, and that comes back with its weights (the death
test, the retry and the budget line are the actor pool's: actor_pool.py).

    served = RestartablePolicyActor(MyPolicy, obs_space, act_space, config, max_restarts=3)
    served.set_weights(learner.get_weights(), version=7)   # also kept for a restart
    actions, states, extra = served.compute_actions(obs)    # retried once if the actor died
    served.num_restarts()                                   # restarts so far

Ray restarts a PolicyActor made with `max_restarts` by running its `__init__`
again. Ray keeps the constructor's arguments for that only when they are small
and hold no handle: larger ones live in the object store, where they may be gone
by the time of a restart (ray-project/ray#53727; Ray logs an error line when such
an actor is made). So the arguments are kept by a small `RestartRecord` actor, as
pickled bytes, and the PolicyActor is given only the record's name: it reads its
arguments there in `__init__`, on its first start and on every restart. Every
weight update is published to the record too, as an object-store reference the
record keeps alive, so a restarted PolicyActor acts with the latest weights and
version before it serves anything. Callers holding the handle (rollout workers)
send a call that was lost with the dead process once more (`call_retrying_once`);
Ray queues it until the restarted actor is up. When the restarts are spent the
actor stays dead: a call through RestartablePolicyActor then ends in
PolicyActorFailure, the env runners' and learners' budget line; a caller holding
the bare handle gets Ray's error.
"""

from __future__ import annotations

import logging
import uuid
from typing import NamedTuple, cast

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# RESTART_WAIT_S moved to actor_pool: the fault tests read it here, beside the line it is in
from policy_service.distributed.actor_pool import (
    RESTART_WAIT_S,  # noqa: F401 - re-exported
    Outcome,
    RestartBudget,
    call_retrying_once,
    gather,
    is_actor_death,
    restarted_in_place_failure,
    restarts_by_ray,
)
from policy_service.distributed.actor_pool import (
    gcs_actor_info as _gcs_actor_info,
)  # tests patch it
from policy_service.distributed.multi_policy_actor import MultiPolicyHost
from policy_service.distributed.policy_actor import PolicyHost
from policy_service.distributed.weight_sync import broadcast_weights
from policy_service.errors import RunFailure

logger = logging.getLogger(__name__)

DEFAULT_POLICY_ACTOR_RESTARTS = 3


class PolicyActorFailure(RunFailure, RuntimeError):
    """A RestartablePolicyActor is dead for good, its restarts spent (one line, the
    env runners' and learners' budget line), or not back from a restart in time.
    `death` is the call's own error."""

    def __init__(self, message: str, death: BaseException):
        super().__init__(message)
        self.death = death


@ray.remote(num_cpus=0)
class RestartRecord:
    """What a restartable actor is built from, kept outside it: its constructor's
    arguments (pickled by the driver, so this process never imports what they name)
    and the newest weights (a reference this record keeps alive) with their version.
    Named, so that the actor is given a string, not a handle."""

    def __init__(self, pickled_arguments: bytes):
        self._arguments = pickled_arguments
        self._boxed_ref: list | None = None  # [ObjectRef], boxed so Ray passes the ref itself
        self._version = 0
        self._starts = 0

    def publish(self, boxed_ref: list, version: int) -> None:
        self._boxed_ref, self._version = boxed_ref, int(version)

    def start(self) -> tuple[bytes, list | None, int, int]:
        """-> (pickled (args, kwargs), [weights ref] or None, version, starts so far,
        this one included); called once per start of the actor."""
        self._starts += 1
        return self._arguments, self._boxed_ref, self._version, self._starts


class RecordName(NamedTuple):
    """Where a RestartRecord is found: a plain value, kept inline by Ray."""

    name: str
    namespace: str

    @classmethod
    def new(cls) -> RecordName:
        return cls(f"policy_service_restart_record_{uuid.uuid4().hex}", _namespace())


def recorded_start(record: RecordName) -> tuple[tuple, dict]:
    """In the actor: the constructor arguments kept by `record`, with initial_weights
    the latest published there (none on a first start before any were)."""
    handle = ray.get_actor(record.name, namespace=record.namespace)
    started = cast(tuple[bytes, list | None, int, int], ray.get(handle.start.remote()))
    pickled_arguments, boxed_ref, version, starts = started
    args, kwargs = ray.cloudpickle.loads(pickled_arguments)
    initial = None if boxed_ref is None else (ray.get(boxed_ref[0]), int(version))
    if starts > 1:
        logger.warning(
            "PolicyActor restarted (start %d); acting with weights version %s",
            starts,
            version if initial is not None else "0 (none published)",
        )
    return args, {**kwargs, "initial_weights": initial}


class RecordedPolicyHost(PolicyHost):
    """A PolicyHost built from a RestartRecord (restartable without lost arguments)."""

    def __init__(self, record: RecordName):
        args, kwargs = recorded_start(record)
        super().__init__(*args, **kwargs)


class RecordedMultiPolicyHost(MultiPolicyHost):
    """A MultiPolicyHost built from a RestartRecord."""

    def __init__(self, record: RecordName):
        args, kwargs = recorded_start(record)
        super().__init__(*args, **kwargs)


# as PolicyActor and MultiPolicyActor (Ray's stubs list only task options)
RecordedPolicyActor = ray.remote(num_cpus=1, max_concurrency=1000)(RecordedPolicyHost)  # type: ignore[call-overload]
RecordedMultiPolicyActor = ray.remote(num_cpus=1, max_concurrency=1000)(  # type: ignore[call-overload]
    RecordedMultiPolicyHost
)


def _namespace() -> str:
    return ray.get_runtime_context().namespace


class RestartablePolicyActor:
    """A PolicyActor that Ray restarts up to `max_restarts` times, with its weights.

    `actor` is the handle to give callers (e.g. rollout workers); weights must go
    through `set_weights` here (or `broadcast_weights(..., weights_source=
    self.weights_source)`) so a restart can find them. Keep this object as long as
    the actor: its record lives as long as it does. Learning done inside the actor
    since the last published weights is lost with it.
    """

    def __init__(
        self,
        policy_cls: type,
        observation_space,
        action_space,
        config=None,
        *,
        max_restarts: int = DEFAULT_POLICY_ACTOR_RESTARTS,
        actor_options: dict | None = None,
        **host_kwargs,
    ):
        self._start(
            RecordedPolicyActor,
            (policy_cls, observation_space, action_space, config),
            max_restarts,
            actor_options,
            host_kwargs,
        )

    @classmethod
    def of_policies(
        cls,
        specs: dict,
        *,
        max_restarts: int = DEFAULT_POLICY_ACTOR_RESTARTS,
        actor_options: dict | None = None,
        **host_kwargs,
    ) -> RestartablePolicyActor:
        """A MultiPolicyActor serving the policies of `specs` (policy id -> complete
        PolicySpec), restarted likewise; its weights are a dict by policy id."""
        served = cls.__new__(cls)
        served._start(RecordedMultiPolicyActor, (specs,), max_restarts, actor_options, host_kwargs)
        return served

    def _start(
        self, actor_cls, args: tuple, max_restarts: int, actor_options, host_kwargs: dict
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.max_restarts = int(max_restarts)
        record = RecordName.new()
        # on this (the driver's) node: a record on another node would die with that node,
        # and the actor restarted elsewhere could then not read what to start from
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # Ray types @ray.remote(options) on a class as the class itself, without .remote
        self.weights_source = RestartRecord.options(  # type: ignore[attr-defined]
            name=record.name, namespace=record.namespace, scheduling_strategy=here
        ).remote(ray.cloudpickle.dumps((args, host_kwargs)))
        options = {
            **(actor_options or {}),
            "max_restarts": self.max_restarts,
            "max_task_retries": 0,
        }
        self.actor = actor_cls.options(**options).remote(record)

    def set_weights(self, weights, version: int | None = None) -> int:
        """Publish, then assign: one object-store copy. -> the version in use.
        PolicyActorFailure once the actor is dead for good."""
        if version is None:
            version = self._call("set_weights()", self.actor.weights_version) + 1
        _, pending = broadcast_weights(
            [self.actor], weights, version, wait=False, weights_source=self.weights_source
        )
        [result] = gather(pending)
        if result.outcome is not Outcome.DIED:
            return result.get()
        # restored from the source, when Ray restarted it
        return self._call("set_weights()", self.actor.weights_version)

    def compute_actions(self, obs_batch, state_batches=None, **kwargs):
        """The PolicyActor's compute_actions, sent once more if it died meanwhile;
        PolicyActorFailure once it is dead for good."""
        return self._call(
            "compute_actions()", self.actor.compute_actions, obs_batch, state_batches, **kwargs
        )

    def weights_version(self) -> int:
        """The version the actor acts with, once it answers: waits while Ray restarts
        it (`call_retrying_once`); PolicyActorFailure once it is dead for good."""
        return self._call("weights_version()", self.actor.weights_version)

    def _call(self, during: str, method, *args, **kwargs):
        """method(*args, **kwargs), sent once more after Ray restarts the actor
        (actor_pool.call_retrying_once); found gone again: PolicyActorFailure, the
        pool's line for an actor Ray restarts in place."""
        try:
            return call_retrying_once(method, *args, **kwargs)
        except RayActorError as error:
            if not is_actor_death(error):
                raise
            budget = RestartBudget(in_all=self.max_restarts, in_all_key="max_restarts")
            line = restarted_in_place_failure(
                "the PolicyActor", _gcs_actor_info(self.actor), budget, during, error
            )
            raise PolicyActorFailure(line, error) from None

    def num_restarts(self) -> int:
        return restarts_by_ray(self.actor)

    def kill(self) -> None:
        """End the actor for good (no restart) and its weights source."""
        for handle in (self.actor, self.weights_source):
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
