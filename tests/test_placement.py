"""Where roles go on a cluster, without one: the placement strategies and custom-resource
keys as config checks and Ray asks, and the head watch of a joined cluster (head_watch).
The same on a real 3-node cluster of network namespaces: test_cluster.py (slow)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
import ray

from policy_service.config import ConfigError, from_dict
from policy_service.distributed import head_watch, resources, role_asks
from policy_service.distributed.env_runner_group import env_runner_ray_options
from policy_service.distributed.resources import ResourcesExceedClusterError, check_cluster_fits
from policy_service.distributed.role_asks import env_runner_asks, policy_actor_ray_options
from policy_service.policy.policy_config import PolicyConfig


@pytest.mark.parametrize("strategy", ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
def test_every_ray_placement_strategy_is_accepted(strategy):
    assert PolicyConfig(learner_placement_strategy=strategy).learner_placement_strategy == strategy


def test_an_unknown_strategy_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as refused:
        from_dict(PolicyConfig, {"learner_placement_strategy": "SPREAD_THIN"})
    assert "learner_placement_strategy" in str(refused.value)
    assert "STRICT_SPREAD" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "key",
    [
        "custom_resources_per_learner",
        "custom_resources_per_env_runner",
        "custom_resources_per_policy_actor",
    ],
)
@pytest.mark.parametrize("bad", [{"CPU": 1}, {"GPU": 1}, {"node_1": -0.5}, {"x": "a"}])
def test_custom_resources_are_checked_where_they_enter(key, bad):
    with pytest.raises(ConfigError) as refused:
        from_dict(PolicyConfig, {key: bad})
    assert str(refused.value).startswith(f"config.{key} must be a dict of custom resource")


def test_custom_resources_reach_each_roles_ray_options_and_asks():
    config = PolicyConfig(
        num_learners=2,
        custom_resources_per_learner={"node_2": 0.5},
        custom_resources_per_env_runner={"node_1": 0.01},
        custom_resources_per_policy_actor={"node_2": 0.01},
    )
    assert role_asks.learner_bundle(config) == {"CPU": 1.0, "node_2": 0.5}
    [learner] = role_asks.learner_asks(config)
    assert learner.keys["node_2"] == "num_learners, custom_resources_per_learner"
    assert env_runner_ray_options(0.5, config) == {"num_cpus": 0.5, "resources": {"node_1": 0.01}}
    actor = policy_actor_ray_options(None, config)
    assert actor["resources"] == {"node_2": 0.01}
    runners, policy_actor = env_runner_asks(2, 0.5, actor, {"node_1": 0.01})
    assert runners.bundle == {"CPU": 0.5, "node_1": 0.01}
    assert policy_actor.bundle["node_2"] == 0.01


def test_a_resource_no_node_has_is_named(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 6.0, "node_1": 1.0})
    monkeypatch.setattr(resources, "in_capturing_placement_group", lambda: False)
    asks = env_runner_asks(2, 0.5, None, {"node_9": 0.01})
    with pytest.raises(ResourcesExceedClusterError) as refused:
        check_cluster_fits(asks)
    assert str(refused.value) == (
        "resources: 2 env runners x 0.01 node_9 = 0.02 node_9, no node of the cluster has the "
        "resource 'node_9' (num_env_runners, custom_resources_per_env_runner)"
    )


def test_strict_spread_over_more_learners_than_alive_nodes_is_one_line(monkeypatch):
    nodes = [{"Alive": True}, {"Alive": True}, {"Alive": False}]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 64.0})
    monkeypatch.setattr(resources, "in_capturing_placement_group", lambda: False)

    def asks(strategy: str, num_learners: int):
        config = PolicyConfig(num_learners=num_learners, learner_placement_strategy=strategy)
        return env_runner_asks(2, 1, None) + role_asks.learner_asks(config)

    check_cluster_fits(asks("STRICT_SPREAD", 2))
    check_cluster_fits(asks("SPREAD", 5))  # best effort: Ray packs what it cannot spread
    with pytest.raises(ResourcesExceedClusterError) as refused:
        check_cluster_fits(asks("STRICT_SPREAD", 3))
    assert str(refused.value) == (
        "learner_placement_strategy STRICT_SPREAD puts each of 3 learners on a node of its "
        "own, but the cluster has 2 alive nodes (num_learners)"
    )


# ----- the head of a joined cluster -------------------------------------------------------


def test_a_head_that_answers_is_watched_until_told_to_stop():
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert head_watch.gcs_answers(address)
        stopping = threading.Event()
        timer = threading.Timer(0.5, stopping.set)
        timer.start()
        assert head_watch.watch_head(address, stopping, lost_after_s=0.1) is None
    assert not head_watch.gcs_answers(address)  # closed: refused


def test_a_head_silent_for_the_limit_is_lost(monkeypatch):
    monkeypatch.setattr(head_watch, "PROBE_EVERY_S", 0.05)
    answers = iter([True, False, True] + [False] * 1000)  # one failure alone is no loss
    silent = head_watch.watch_head(
        "h:1", threading.Event(), lost_after_s=0.2, answers=lambda a: next(answers)
    )
    assert silent is not None and silent >= 0.2


def test_a_lost_head_ends_the_process_in_one_line():
    script = (
        "import time\n"
        "from policy_service.distributed import head_watch\n"
        "head_watch.LOST_AFTER_S = 0.5\n"
        "head_watch.PROBE_EVERY_S = 0.1\n"
        "import socket\n"
        "with socket.create_server(('127.0.0.1', 0)) as s:\n"
        "    port = s.getsockname()[1]\n"  # closed again: nothing answers there
        "with head_watch.head_loss_ends_run(f'127.0.0.1:{port}', '; continue with X'):\n"
        "    time.sleep(30)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.startswith(
        "policy-service: error: the Ray cluster went away: its head's GCS at 127.0.0.1:"
    )
    assert done.stderr.endswith(" has not answered for 0.5 s; continue with X\n")
    assert done.stderr.count("\n") == 1
