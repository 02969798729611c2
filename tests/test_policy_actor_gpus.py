"""The inference PolicyActor's own GPUs (`num_gpus_per_policy_actor`), on a real
local Ray that advertises one GPU (`ray.init(num_gpus=1)`: no device behind it,
so the policy acts on the CPU, but Ray reserves and assigns the GPU as on a GPU host)."""

import time

import envs
import fakes
import pytest
import ray

from policy_service.config import ConfigError
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.resources import ResourcesError
from policy_service.policy.policy_config import PolicyConfig

CONFIG = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "lr": 0.01}
RAY_RESOURCES = {"num_gpus": 1}  # read by conftest.ray_local
SCRIPT = {"lengths": [4, 6], "endings": ["terminated", "truncated"]}


def _group(num_gpus: float) -> EnvRunnerGroup:
    return EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        {**CONFIG, "num_gpus_per_policy_actor": num_gpus},
        rollout_fragment_length=10,
        env_config=SCRIPT,
        seed=0,
        remote_inference=True,
        policy_actor_options={"num_cpus": 0.5},
    )


@pytest.mark.slow  # a policy actor on fake GPUs in its own Ray: ~26 s here
def test_the_policy_actor_holds_the_fractional_gpu_it_asked_for(ray_local):
    group = _group(0.5)
    try:
        held = ray.get(group.policy_actor.resources.remote())
        assert (held["GPU"], held["CPU"], held["gpu_ids"]) == (0.5, 0.5, ["0"])
        assert held["cuda_visible_devices"] == "0"  # what TF in the actor would use
        assert held["devices"] == ["/CPU:0"]  # no device behind the advertised GPU
        assert held["device_note"] == (
            "Ray assigned GPU(s) ['0'] but TensorFlow sees no GPU in this process; "
            "the policy acts on /CPU:0 instead"
        )
        assert ray.available_resources().get("GPU", 0.0) == pytest.approx(0.5)
        batch, _ = group.sample()  # and it acts
        assert batch.count >= 10
    finally:
        group.stop()
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0.0) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0.0) == 1.0


@pytest.mark.slow  # a policy actor in its own Ray: ~8 s here
def test_without_the_key_the_policy_actor_holds_no_gpu(ray_local):
    group = _group(0)
    try:
        held = ray.get(group.policy_actor.resources.remote())
        assert (held["GPU"], held["gpu_ids"]) == (0.0, [])
    finally:
        group.stop()


def test_more_gpus_than_the_cluster_has_fail_at_once_in_one_line(ray_local):
    start = time.monotonic()
    with pytest.raises(ResourcesError) as info:
        _group(2)
    assert time.monotonic() - start < 60  # fails at once, no hang: a bound, not a timing
    assert str(info.value) == (
        "resources: 1 policy actor x 2 GPUs = 2 GPUs, the cluster has 1 GPU "
        "(num_gpus_per_policy_actor)"
    )


def test_the_key_takes_fractions_up_to_one_and_whole_numbers_above():
    assert PolicyConfig(num_gpus_per_policy_actor=0.25).num_gpus_per_policy_actor == 0.25
    assert PolicyConfig(num_gpus_per_policy_actor=2).num_gpus_per_policy_actor == 2.0
    with pytest.raises(
        ConfigError,
        match=r"^config.num_gpus_per_policy_actor must be a "
        r"finite number >= 0, and a whole number when above 1, got 1.5$",
    ):
        PolicyConfig(num_gpus_per_policy_actor=1.5)
