"""WeightSync: the one way a learner's weights reach the actors that act with them.

The loop it lives in (EnvRunnerGroup.sync_weights):

    sync = WeightSync()
    version = sync.take({"default_policy": learner.get_weights()}, version, num_grad_updates)
    sync.expect(sync.send(runners))     # one ray.put; each runner's set_weights reads it
    ...
    sync.check_acks()                   # what a runner's code raised on them, once done
    ready = sync.send_to_replacement(slot, new_runner)   # a replacement starts on the latest
    sync.catch_up(slot, new_runner)     # installed: it gets what was sent since it started

What is sent: the weights (policy id -> weights: a send of some policies then holds
every policy's latest, so a replacement acts with all), their version and the learner's
num_grad_updates that made them. One object-store
copy per broadcast, its ref handed to every receiver. A version is the learner
updates made when the weights were taken (docs/glossary.md, "weights version"): the
sender names it; a receiver's `set_weights(weights, version)` takes it, or its
current one + 1 when none is named (`next_version`).
"""

from __future__ import annotations

from typing import Any

import ray

from policy_service.distributed.actor_pool import Outcome, gather, raise_own_error
from policy_service.policy import call_arguments


def next_version(current: int, given: Any = None) -> int:
    """The version of weights set with version `given`: it (an integer >= 0, checked:
    ValueError otherwise), or `current` + 1 when None. Every receiver's rule."""
    checked = call_arguments.weights_version(given)
    return int(current) + 1 if checked is None else checked


class WeightSync:
    """The latest weights of one set of receivers, their version and the calls sent
    with them not yet acknowledged. Weights are a dict, policy id -> weights, and
    `take` merges a partial one into the latest. The external env's replicas take one
    policy's own variables instead (variable name -> value, not by id); each of their
    sends holds every variable, so merging replaces them all."""

    def __init__(self):
        self.weights: Any = None  # the latest, in this process; None before the first
        self.version: int | None = None  # None: nothing taken yet
        self.num_grad_updates: int | None = None  # the SGD steps that made them
        self._ref: ray.ObjectRef | None = None  # their one object-store copy, once put
        self._unacked: list = []  # refs of calls sent without waiting
        self._started_with: dict[Any, int | None] = {}  # a replacement's version

    def take(self, weights: Any, version: Any = None, num_grad_updates: int | None = None) -> int:
        """These weights are the latest from now on -> their version (`next_version`
        of the last; 0 before any). Nothing is sent or put yet."""
        new_version = next_version(self.version or 0, version)
        latest = {**(self.weights or {}), **weights}
        self.version, self.weights, self.num_grad_updates = new_version, latest, num_grad_updates
        self._ref = None
        return new_version

    def ref(self) -> ray.ObjectRef | None:
        """The latest weights in the object store, put once per `take` (None: none yet)."""
        if self._ref is None and self.weights is not None:
            self._ref = ray.put(self.weights)
        return self._ref

    def send(self, receivers: list) -> list:
        """The latest weights (one object-store copy), version and num_grad_updates to
        each receiver's `set_weights` -> their refs, not waited for."""
        ref = self.ref()
        return [r.set_weights.remote(ref, self.version, self.num_grad_updates) for r in receivers]

    # ----- acknowledgements ----------------------------------------------------------

    def expect(self, refs: list) -> None:
        """Calls sent without waiting (set_weights, and what goes with the weights:
        filters, a new acting actor): `check_acks` raises what they raised."""
        self._unacked.extend(refs)

    def check_acks(self) -> None:
        """Raise what a receiver's code raised on a call sent without waiting; calls not
        done yet are kept, and a death is left to the receiver's owner (its next call
        replaces it)."""
        if not self._unacked:
            return
        results = gather(self._unacked, timeout_s=0)  # not done yet: HUNG
        self._unacked = [ref for ref, r in zip(self._unacked, results) if r.outcome is Outcome.HUNG]
        raise_own_error(results)

    def drop_acks(self) -> None:
        """Forget the calls in flight (their receivers are being stopped)."""
        self._unacked = []

    # ----- replacements ----------------------------------------------------------------

    def replacement_started(self, key: Any) -> None:
        """The replacement for `key` starts now, acting with the current version."""
        self._started_with[key] = self.version

    def send_to_replacement(self, key: Any, receiver) -> ray.ObjectRef | None:
        """`replacement_started`, and the latest weights to `receiver` -> the ref of its
        set_weights (None: none were put, as when the receivers act through others)."""
        self.replacement_started(key)
        return None if self._ref is None else self.send([receiver])[0]

    def catch_up(self, key: Any, receiver) -> None:
        """The replacement for `key` takes its place: weights taken since it started go
        to it, not waited for."""
        if key not in self._started_with:  # none recorded: it needs none (acting elsewhere)
            return
        started_with = self._started_with.pop(key)
        if started_with != self.version and self._ref is not None:
            self.expect(self.send([receiver]))


def broadcast_weights(
    receivers: list,
    weights: dict | ray.ObjectRef,
    version: int | None = None,
    wait: bool = True,
    weights_source=None,
):
    """Send one set of weights to many actors through a single object-store copy.

    `weights` is put once (unless it already is an ObjectRef); each receiver's
    `set_weights(ref, version)` reads that same copy. With `weights_source` (a
    restarts.RestartRecord handle) the copy is first published there, for a
    PolicyActor that Ray restarts. -> (weights_ref, the set_weights refs), after
    they finished when `wait`.
    """
    weights_ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
    if weights_source is not None:
        if version is None:
            raise ValueError("broadcast_weights with a weights_source needs an explicit version")
        ray.get(weights_source.publish.remote([weights_ref], version))
    pending = [receiver.set_weights.remote(weights_ref, version) for receiver in receivers]
    if wait:
        ray.get(pending)
    return weights_ref, pending
