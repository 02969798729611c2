"""What each role of a run asks of Ray (env runners, the PolicyActor, learners), from
its config alone.

Without TensorFlow: a Ray Tune sweep's driver reserves each trial's placement group
from these asks (algorithms/trial_bundles.py) and would otherwise load TensorFlow
only for them. The modules that start the actors check the same asks against the
cluster before they start any (resources.check_cluster_fits), so a trial's bundles
and a run's check cannot disagree.
"""

from __future__ import annotations

from typing import Any

from policy_service.config import config_value
from policy_service.distributed.resources import RoleAsk

LEARNER_KEYS = {"CPU": "num_cpus_per_learner", "GPU": "num_gpus_per_learner"}
LEARNER_CUSTOM_KEY = "custom_resources_per_learner"


def learner_key(resource: str) -> str:
    """The config key that sets a learner's ask of `resource`."""
    return LEARNER_KEYS.get(resource, LEARNER_CUSTOM_KEY)


def learner_bundle(config: Any) -> dict:
    """Ray resources of one learner: its CPUs, its GPUs unless they are fake, and its
    custom resources (custom_resources_per_learner)."""
    bundle = {}
    if config.num_cpus_per_learner > 0:
        bundle["CPU"] = float(config.num_cpus_per_learner)
    if config.num_gpus_per_learner > 0 and not config._fake_gpus:
        bundle["GPU"] = float(config.num_gpus_per_learner)
    for resource, amount in config.custom_resources_per_learner.items():
        if amount > 0:
            bundle[resource] = float(amount)
    return bundle


def learner_asks(config: Any) -> list[RoleAsk]:
    """What the learner actors ask of Ray (none when the learner is in the driver)."""
    bundle = learner_bundle(config)
    keys = {resource: f"num_learners, {learner_key(resource)}" for resource in bundle}
    strategy = config.learner_placement_strategy
    own_nodes = f"learner_placement_strategy {strategy}" if strategy == "STRICT_SPREAD" else None
    return [RoleAsk("learner", int(config.num_learners), bundle, keys, own_nodes)]


def env_runner_asks(
    num_env_runners: int,
    num_cpus_per_env_runner: float,
    policy_actor_options: dict | None,
    custom_resources_per_env_runner: dict | None = None,
) -> list[RoleAsk]:
    """What a group asks of Ray: its env runners (CPUs and custom resources each), and
    the PolicyActor started with these Ray options (`policy_actor_ray_options`; None:
    no PolicyActor)."""
    custom = dict(custom_resources_per_env_runner or {})
    asks = [
        RoleAsk(
            "env runner",
            num_env_runners,
            {"CPU": float(num_cpus_per_env_runner), **custom},
            {"CPU": "num_env_runners, num_cpus_per_env_runner"}
            | {r: "num_env_runners, custom_resources_per_env_runner" for r in custom},
        )
    ]
    if policy_actor_options is not None:
        actor_custom = dict(policy_actor_options.get("resources") or {})
        asks.append(
            RoleAsk(
                "policy actor",
                1,
                {
                    "CPU": float(policy_actor_options.get("num_cpus") or 0),
                    "GPU": float(policy_actor_options.get("num_gpus") or 0),
                    **actor_custom,
                },
                {"CPU": "remote_inference", "GPU": "num_gpus_per_policy_actor"}
                | {r: "custom_resources_per_policy_actor" for r in actor_custom},
            )
        )
    return asks


def policy_actor_ray_options(options: dict | None, policy_config: dict | Any) -> dict:
    """The PolicyActor's Ray options: `options`, by default 1 CPU, the policy config's
    num_gpus_per_policy_actor GPUs and custom_resources_per_policy_actor."""
    options = dict(options or {})
    options.setdefault("num_cpus", 1)
    if "num_gpus" not in options:
        options["num_gpus"] = config_value(policy_config, "num_gpus_per_policy_actor", 0)
    custom = config_value(policy_config, "custom_resources_per_policy_actor", None)
    if "resources" not in options and custom:
        options["resources"] = dict(custom)
    return options
