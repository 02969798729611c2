"""LearnerHost: one learner of a LearnerGroup, a Learner in its own process.

Its tower stack combines every step with the other learners' through a
`CollectiveGroup` (TF collective ops inside the compiled step), so all
learners apply the same update and their weights stay identical. The driver
(`LearnerGroup`) runs it as a Ray actor:

    spec = PolicySpec(policy_cls, obs_space, act_space, config)
    hosts = [ray.remote(LearnerHost).options(num_cpus=1, num_gpus=1, ...).remote(
        spec, custom_models) for _ in range(n)]
    addresses = ray.get([h.address.remote() for h in hosts])
    # connect builds each learner's policy
    ray.get([h.connect.remote(rank, addresses) for rank, h in enumerate(hosts)])
    ray.get([h.update.remote(shard, None, True, 0, None) for h, shard in zip(hosts, shards)])

TensorFlow must not run before `connect`: the collective setup, and the fake
GPUs made in `__init__`, have to be fixed before TF initializes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import ray

from policy_service.config import config_for
from policy_service.distributed.learner import Learner
from policy_service.engine import devices
from policy_service.engine.collectives import CollectiveGroup
from policy_service.policy import models
from policy_service.policy.policy_spec import PolicySpec


def learner_policy_config(policy_cls: type, config: Any):
    """The policy config a learner actor builds its policy with: its towers are
    `num_gpus_per_learner` (the driver's `num_gpus` is for a learner in the driver)."""
    typed = config_for(policy_cls, config)
    return dataclasses.replace(typed, num_gpus=typed.num_gpus_per_learner)


def prepare_learner_process(config) -> None:
    """Fake GPUs as logical CPU devices, and thread pools sized to the CPUs Ray
    gave this actor; before TensorFlow initializes."""
    fake = config._fake_gpus and config.num_gpus > 0
    if fake:
        devices.prepare_process(max(1, math.ceil(config.num_gpus)))
    else:
        devices.prepare_process(
            1, intra_op_threads=devices.assigned_cpu_threads() if devices.in_ray_worker() else None
        )


class LearnerHost(Learner):
    """A Learner (learner.py) in step with the other members of its collective group.

    collective_timeout_s: None (default), the all-reduces inside the SGD loop
    wait without a per-op deadline (a timeout would hold two TF threads per
    all-reduce for its length); the driver bounds each call instead.
    """

    def __init__(
        self,
        spec: PolicySpec,
        custom_models: dict | None = None,
        collective_timeout_s: float | None = None,
    ):
        models.register_custom_models(custom_models)
        self._spec = spec._replace(config=learner_policy_config(spec.built_class(), spec.config))
        prepare_learner_process(self._spec.config)
        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        self.group = CollectiveGroup(host=host, timeout_s=collective_timeout_s)
        super().__init__(None)  # the policy is built in `connect`

    def address(self) -> str:
        return self.group.address

    def connect(self, rank: int, addresses: list[str]) -> dict:
        """Join the group (blocks until every learner has), then build the policy.
        -> what the driver needs to shard batches for this learner (Learner.info)."""
        self.group.connect(rank, addresses)
        self.policy = self._spec.build()
        self.policy.towers.set_collective_group(self.group)
        return {**self.info(), "collective": self.group.implementation}

    def weights_identical(self) -> bool:
        """True when every learner holds bit-identical weights (a collective: all
        learners must call it together)."""
        with self._collective():
            return bool(self.group.all_identical(list(self.policy.get_weights().values())))

    def process_status(self) -> dict:
        """This process's id and thread count (Linux /proc; -1 elsewhere): for
        tests and benchmarks that watch a learner's threads or signal it."""
        return {"pid": os.getpid(), "threads": thread_count()}

    def _collective(self):
        return self.group.peer_errors()


def thread_count() -> int:
    """Threads of this process, from /proc/self/status (-1 where there is none)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    except (OSError, StopIteration):
        return -1
