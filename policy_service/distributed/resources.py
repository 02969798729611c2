"""What a run's actors ask of Ray, checked against the cluster before any starts
(`check_cluster_fits`), and what each process of a run holds: Ray's reservation,
GPU ids and tower devices.

What a process holds is read inside it, since only there does Ray say which GPUs
it assigned. `result.json` records it for every role of a training run:

    process_resources(policy.devices)                  # in this process (e.g. the driver)
    actor_resources(worker, lambda w: w.policy)        # inside a Ray actor, by its handle
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import ray

from policy_service.errors import RunFailure, UserError


def process_resources(
    tower_devices: list | tuple | None = None, device_note: str | None = None
) -> dict:
    """This process's resources.

    CPU, GPU, gpu_ids: what Ray reserved and assigned (None in a driver, which
    Ray reserves nothing for; a job's driver sees its reserved GPUs through
    cuda_visible_devices). devices: where its towers run (None: no policy).
    device_note: what was asked, found and done instead, when the devices are not
    the GPUs asked for (TowerDevices.note), else None.
    """
    from policy_service.engine import devices  # here: `policy-service submit` loads no TF

    in_worker = devices.in_ray_worker()
    assigned = ray.get_runtime_context().get_assigned_resources() if in_worker else {}
    return {
        "CPU": float(assigned.get("CPU", 0.0)) if in_worker else None,
        "GPU": float(assigned.get("GPU", 0.0)) if in_worker else None,
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()] if in_worker else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": list(tower_devices) if tower_devices is not None else None,
        "device_note": device_note,
        "node_ip": ray.util.get_node_ip_address() if ray.is_initialized() else None,
        "pid": os.getpid(),
    }


def actor_resources(
    actor, policy_of: Callable[[Any], Any] = lambda instance: None, timeout_s: float | None = None
) -> dict:
    """`process_resources` read inside a Ray actor (any class): `policy_of(instance)`
    is the policy whose devices to record, or None."""

    def read(instance):
        policy = policy_of(instance)
        if policy is None:
            return process_resources()
        return process_resources(policy.devices, policy.tower_devices.note)

    return ray.get(actor.__ray_call__.remote(read), timeout=timeout_s)


class ResourcesError(RuntimeError):
    """The actors a run (or a group) asks for cannot be started: one of the two below."""


class ResourcesExceedClusterError(ResourcesError, UserError):
    """The asks exceed what the whole cluster has: no wait helps (exit 2)."""


class ResourcesNotFreedError(ResourcesError, RunFailure):
    """The asks fit the cluster, but others still held what they need when the wait
    ended: a fault of the moment, not of the input (exit 1)."""


class RoleAsk(NamedTuple):
    """`num_actors` actors of `role` ("env runner"), each asking Ray for `bundle`
    ({"CPU": 1.0, "GPU": 0.5}); `keys`: the config keys that set each resource's ask;
    `own_nodes`: the setting that puts each actor on a node of its own (e.g.
    "learner_placement_strategy STRICT_SPREAD"), None when they may share one."""

    role: str
    num_actors: int
    bundle: dict
    keys: dict
    own_nodes: str | None = None


AVAILABLE_WAIT_S = 30.0  # for resources held by actors still stopping, or by other jobs
_POLL_S = 0.2


def check_cluster_fits(asks: list[RoleAsk], wait_s: float = AVAILABLE_WAIT_S) -> None:
    """Refuse, in one line, asks whose sum over every role the cluster cannot hold,
    before any of the actors starts (Ray would leave the ones that do not fit pending
    forever): at once when the sum exceeds the cluster's totals; when it exceeds only
    what is available now (held by other jobs, a job's driver, actors still stopping),
    after waiting `wait_s` for it to be freed. ResourcesError names each role's ask,
    the sum, and what the cluster has."""
    needed: dict[str, float] = {}
    for ask in asks:
        for resource, amount in ask.bundle.items():
            if ask.num_actors > 0 and amount > 0:
                needed[resource] = needed.get(resource, 0.0) + ask.num_actors * float(amount)
    if not needed or not ray.is_initialized():  # no cluster: starting them says so
        return
    total = ray.cluster_resources()
    if _short(needed, total):
        raise ResourcesExceedClusterError(_describe(asks, needed, total, None, wait_s))
    if in_capturing_placement_group():
        return  # a Tune trial: its placement group holds these asks already (algorithms/tune.py)
    _check_own_nodes(asks)
    deadline = time.monotonic() + wait_s
    while _short(needed, available := ray.available_resources()):
        if time.monotonic() >= deadline:
            raise ResourcesNotFreedError(_describe(asks, needed, total, available, wait_s))
        time.sleep(_POLL_S)


def _check_own_nodes(asks: list[RoleAsk]) -> None:
    """Roles whose actors each need a node of their own (STRICT_SPREAD) fit the alive
    nodes; else Ray would wait forever for a placement group it cannot place."""
    spread = [a for a in asks if a.own_nodes and a.num_actors > 1]
    if not spread:
        return
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    for ask in spread:
        if ask.num_actors > alive:
            count_key = next(iter(ask.keys.values()), "").split(",")[0]  # e.g. num_learners
            raise ResourcesExceedClusterError(
                f"{ask.own_nodes} puts each of {_counted(ask.num_actors, ask.role)} on a "
                f"node of its own, but the cluster has {alive} alive "
                f"node{'' if alive == 1 else 's'} ({count_key})"
            )


def in_capturing_placement_group() -> bool:
    """Whether this process runs in a placement group that takes its children's actors
    (a Tune trial's), so that what they ask for is reserved already."""
    return bool(ray.get_runtime_context().should_capture_child_tasks_in_placement_group)


def _short(needed: dict, have: dict) -> list[str]:
    return [r for r, amount in needed.items() if have.get(r, 0.0) + 1e-9 < amount]


def _describe(
    asks: list[RoleAsk], needed: dict, total: dict, available: dict | None, wait_s: float
) -> str:
    """One line over every resource short, e.g. "resources: 2 env runners x 1 CPU +
    1 learner x 1 CPU = 3 CPUs, the cluster has 2 CPUs (num_env_runners, ...)"."""
    parts = []
    for resource in _short(needed, total if available is None else available):
        roles = [a for a in asks if a.num_actors > 0 and a.bundle.get(resource, 0) > 0]
        asked = " + ".join(_role_ask(a, resource) for a in roles)
        has = f"the cluster has {_amount(total.get(resource, 0.0), resource)}"
        if resource not in ("CPU", "GPU") and total.get(resource, 0.0) <= 0:
            has = f"no node of the cluster has the resource {resource!r}"
        if available is not None:
            has += (
                f", {available.get(resource, 0.0):g} free after waiting {wait_s:g} s for "
                "other actors or jobs to release them"
            )
        keys = ", ".join(dict.fromkeys(a.keys[resource] for a in roles))
        parts.append(f"{asked} = {_amount(needed[resource], resource)}, {has} ({keys})")
    return "resources: " + "; ".join(parts)


def _role_ask(ask: RoleAsk, resource: str) -> str:
    return f"{_counted(ask.num_actors, ask.role)} x {_amount(ask.bundle[resource], resource)}"


def _amount(amount: float, resource: str) -> str:
    return f"{amount:g} {resource}{'' if 0 < amount <= 1 else 's'}"


def _counted(count: int, role: str) -> str:
    """A role counted: 2 env runners, 1 learner, 2 learners of policy 'p1'."""
    if count == 1:
        return f"1 {role}"
    noun, of, owner = role.partition(" of ")
    return f"{count} {noun}s{of}{owner}"
