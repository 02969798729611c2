"""What each process of a run holds: Ray's reservation, GPU ids and tower devices.

Read inside the process itself, since only there does Ray say which GPUs it
assigned. `result.json` records it for every role of a training run:

    process_resources(policy.devices)                  # in this process (e.g. the driver)
    actor_resources(worker, lambda w: w.policy)        # inside a Ray actor, by its handle
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray


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


def resource_shortfall(
    role: str, bundle: dict, count: int, key_of: dict, total: dict, available: dict
) -> str | None:
    """A one-line description of the first resource the cluster's totals cannot
    give `count` actors of `role` asking `bundle` each (None when all suffice);
    `key_of` names the config key of each resource. Checked before they start,
    since Ray would leave the ones that do not fit pending forever."""
    for resource, amount in bundle.items():
        asked = amount * count
        if total.get(resource, 0.0) + 1e-9 < asked:
            return (
                f"{count} {role}(s) need {resource} {asked:g} in total "
                f"({key_of.get(resource, resource)}={amount:g} each); the cluster has "
                f"{resource} {total.get(resource, 0.0):g} "
                f"({available.get(resource, 0.0):g} available)"
            )
    return None
