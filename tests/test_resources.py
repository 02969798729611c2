"""policy_service/distributed/resources.py: every role's asks summed and checked
against what the cluster has, before any actor starts, on a cluster Ray is made
to report here (the same on a real local Ray: test_faults.py)."""

from __future__ import annotations

import time

import pytest
import ray

from policy_service.distributed import resources
from policy_service.distributed.resources import (
    ResourcesExceedClusterError,
    ResourcesNotFreedError,
    check_cluster_fits,
)
from policy_service.distributed.role_asks import (
    env_runner_asks,
    learner_asks,
    policy_actor_ray_options,
)
from policy_service.policy.policy_config import PolicyConfig


@pytest.fixture
def cluster(monkeypatch):
    """A cluster of 2 CPUs and no GPU, all free unless a test says otherwise:
    `views["available"]` is what each ray.available_resources() call returns next
    (the last one repeats)."""
    views = {"total": {"CPU": 2.0}, "available": [{"CPU": 2.0}]}
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: dict(views["total"]))

    def available():
        seen = views["available"]
        return dict(seen.pop(0) if len(seen) > 1 else seen[0])

    monkeypatch.setattr(ray, "available_resources", available)
    monkeypatch.setattr(resources, "_POLL_S", 0.01)
    monkeypatch.setattr(resources, "in_capturing_placement_group", lambda: False)
    return views


def run_asks(num_env_runners, cpus_per_runner, policy_actor_cpus, num_learners, cpus_per_learner):
    options = None if policy_actor_cpus is None else {"num_cpus": policy_actor_cpus}
    config = PolicyConfig(num_learners=num_learners, num_cpus_per_learner=cpus_per_learner)
    return env_runner_asks(num_env_runners, cpus_per_runner, options) + learner_asks(config)


def test_roles_that_fit_alone_but_not_together_are_refused_at_once_in_one_line(cluster):
    start = time.monotonic()
    with pytest.raises(ResourcesExceedClusterError) as refused:
        check_cluster_fits(run_asks(2, 1, 1, 1, 1))
    assert time.monotonic() - start < 5  # the totals fall short: no wait
    assert str(refused.value) == (
        "resources: 2 env runners x 1 CPU + 1 policy actor x 1 CPU + 1 learner x 1 CPU "
        "= 4 CPUs, the cluster has 2 CPUs (num_env_runners, num_cpus_per_env_runner, "
        "remote_inference, num_learners, num_cpus_per_learner)"
    )


@pytest.mark.parametrize(
    "asks",
    [
        (2, 0.25, 1, 1, 0.5),  # fractions summing to the 2 CPUs exactly
        (6, 0.2, 0.6, 1, 0.2),  # summed in floats: 2.0000000000000004
        (0, 1, 1, 2, 0.5),  # the driver samples: no runner asks anything
        (3, 0, 1, 1, 1),  # runners asking 0 CPUs
    ],
)
def test_what_fits_exactly_is_accepted(cluster, asks):
    check_cluster_fits(run_asks(*asks), wait_s=0)


def test_every_resource_short_is_named_with_the_roles_asking_for_it(cluster):
    gpu_actor = policy_actor_ray_options(None, {"num_gpus_per_policy_actor": 0.5})
    config = PolicyConfig(num_learners=2, num_gpus_per_learner=1, num_cpus_per_learner=1)
    asks = env_runner_asks(1, 0.5, gpu_actor) + learner_asks(config)
    with pytest.raises(ResourcesExceedClusterError) as refused:
        check_cluster_fits(asks)
    assert str(refused.value) == (
        "resources: 1 env runner x 0.5 CPU + 1 policy actor x 1 CPU + 2 learners x 1 CPU "
        "= 3.5 CPUs, the cluster has 2 CPUs (num_env_runners, num_cpus_per_env_runner, "
        "remote_inference, num_learners, num_cpus_per_learner); 1 policy actor x 0.5 GPU "
        "+ 2 learners x 1 GPU = 2.5 GPUs, the cluster has 0 GPUs "
        "(num_gpus_per_policy_actor, num_learners, num_gpus_per_learner)"
    )


def test_resources_held_by_others_are_waited_for_then_refused_naming_what_is_free(cluster):
    cluster["available"] = [{"CPU": 0.5}]
    start = time.monotonic()
    with pytest.raises(ResourcesNotFreedError) as refused:
        check_cluster_fits(run_asks(1, 1, None, 0, 1), wait_s=0.2)
    assert time.monotonic() - start >= 0.2
    assert str(refused.value) == (
        "resources: 1 env runner x 1 CPU = 1 CPU, the cluster has 2 CPUs, 0.5 free after "
        "waiting 0.2 s for other actors or jobs to release them "
        "(num_env_runners, num_cpus_per_env_runner)"
    )


def test_resources_released_while_waiting_are_taken(cluster):
    cluster["available"] = [{"CPU": 0.0}, {"CPU": 1.0}, {"CPU": 2.0}]  # actors stopping
    check_cluster_fits(run_asks(2, 1, None, 0, 1), wait_s=10)
    assert cluster["available"] == [{"CPU": 2.0}]


def test_nothing_asked_needs_no_cluster(monkeypatch):
    def asked(*args):
        raise AssertionError("the cluster was asked")

    monkeypatch.setattr(ray, "cluster_resources", asked)
    check_cluster_fits(run_asks(0, 1, None, 0, 1))
