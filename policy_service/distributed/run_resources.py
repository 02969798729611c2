"""The resources each role of a training run held, for result.json.

    {"driver": {...}, "learners": [{...}, ...], "env_runners": [{...}, ...],
     "inference_actor": {...} or None}

Each entry is `policy_service.distributed.resources.process_resources`, read
inside that role's process: Ray's CPU/GPU reservation and the GPU ids it
assigned (None for the driver, which Ray reserves nothing for), the GPUs
CUDA lets it see, and its towers' devices. The driver's entry carries the
learner's devices when the learner lives there (num_learners 0, holds_learner). A role that does not
answer in time is recorded with the error, not left out. Each learner actor of a
multi-agent run (config `policies`) names its "policy_id".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from policy_service.distributed.resources import actor_resources, process_resources
from policy_service.errors import one_line

ANSWER_TIMEOUT_S = 30.0


def role_resources(algo) -> dict:
    """What the driver, each learner actor, each env runner and the inference actor held."""
    if algo.policy_learners.keyed:
        return _multi_agent_resources(algo.env_runners, algo.policy_learners)
    learner_group, runner_group = algo.learners, algo.env_runners
    local = learner_group.local_policy if learner_group is not None else None
    driver = (
        process_resources(local.devices, local.tower_devices.note)
        if local is not None
        else process_resources()
    )
    driver["holds_learner"] = local is not None
    learners = [
        _answer(partial(actor_resources, a, lambda host: host.policy, ANSWER_TIMEOUT_S))
        for a in (learner_group.actors if learner_group is not None else [])
    ]
    return {"driver": driver, "learners": learners, **_runner_resources(runner_group)}


def _runner_resources(runner_group) -> dict:
    """The env runners' and the inference actor's entries (each worker's acting
    policy's devices: its `policy`, None when a PolicyActor acts)."""
    env_runners = []
    if runner_group is not None:
        runner_group.wait_started()  # a run shorter than their start: up first, then asked
    if runner_group is not None and runner_group.local_worker is not None:
        env_runners.append(
            process_resources(_devices(runner_group.local_worker.policy)) | {"in_driver": True}
        )
    env_runners += [
        _answer(partial(actor_resources, w, lambda worker: worker.policy, ANSWER_TIMEOUT_S))
        for w in (runner_group.workers if runner_group is not None else [])
    ]
    inference = None
    if runner_group is not None and runner_group.policy_actor is not None:
        import ray

        inference = _answer(
            lambda: ray.get(runner_group.policy_actor.resources.remote(), timeout=ANSWER_TIMEOUT_S)
        )
    return {"env_runners": env_runners, "inference_actor": inference}


def _multi_agent_resources(runners, learners) -> dict:
    """role_resources of a multi-agent run: its env runners as a single-agent run's,
    and the driver holding the learners of the policies with num_learners 0."""
    local = [g.local_policy for g in learners.groups.values() if g.local_policy is not None]
    driver = (
        process_resources(local[0].devices, local[0].tower_devices.note)
        if local
        else process_resources()
    )
    driver["holds_learner"] = bool(local)
    return {
        "driver": driver,
        "learners": [
            _answer(partial(actor_resources, a, lambda host: host.policy, ANSWER_TIMEOUT_S))
            | {"policy_id": policy_id}
            for policy_id, group in learners.groups.items()
            for a in group.actors
        ],
        **_runner_resources(runners),
    }


def _devices(policy) -> list | None:
    return policy.devices if policy is not None else None


def _answer(read: Callable[[], Any]) -> dict:
    try:
        return read()
    except Exception as err:  # noqa: BLE001 - a dead actor is recorded, not fatal at the end
        return {"error": f"{type(err).__name__}: {one_line(err, first_line=True)}"}
