"""A Ray Tune trial's placement group bundles, from its checked config alone: the
trial's own actor (the algorithm's driver) first, then one bundle per actor the run
starts (env runners or the external env's training server, the PolicyActor, learners).

Without TensorFlow, because Tune asks for them in the sweep's driver, which would
otherwise load it only for this. The asks a run checks against the cluster before it
starts (`Algorithm.resource_asks`) come from the modules that start those actors, which
load TensorFlow; tests/test_tune_imports.py checks that both give the same bundles.
"""

from __future__ import annotations

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.distributed.runner_types import runner_type, runner_type_module

DRIVER_CPUS = 1.0  # the trial's own actor: it samples (num_env_runners: 0) and may learn
POLICY_ACTOR_CPUS = 1.0  # a PolicyActor's CPU (EnvRunnerGroup's default)


def trial_bundles(config: AlgorithmConfig) -> list[dict]:
    """The driver's bundle (1 CPU, and the learner's GPUs when it learns in the driver),
    then one bundle per actor; actors that ask for nothing take no bundle."""
    driver = {"CPU": DRIVER_CPUS}
    if config.num_learners == 0 and config.num_gpus > 0 and not config._fake_gpus:
        driver["GPU"] = float(config.num_gpus)
    bundles = [driver]
    for count, bundle in runner_bundles(config) + learner_bundles(config):
        kept = {resource: float(n) for resource, n in bundle.items() if n > 0}
        if kept:
            bundles.extend(dict(kept) for _ in range(count))
    return bundles


def runner_bundles(config: AlgorithmConfig) -> list[tuple[int, dict]]:
    """(count, bundle) of the actors that make the run's samples: env runners and the
    PolicyActor they act through (remote_inference), or another runner type's asks
    (those modules load no TensorFlow)."""
    kind = runner_type(config)
    if kind != "env":
        return [(a.num_actors, a.bundle) for a in runner_type_module(kind).resource_asks(config)]
    runners = {"CPU": config.num_cpus_per_env_runner, **config.custom_resources_per_env_runner}
    bundles = [(config.num_env_runners, runners)]
    if config.remote_inference:
        actor = {
            "CPU": POLICY_ACTOR_CPUS,
            "GPU": config.num_gpus_per_policy_actor,
            **config.custom_resources_per_policy_actor,
        }
        bundles.append((1, actor))
    return bundles


def learner_bundles(config: AlgorithmConfig) -> list[tuple[int, dict]]:
    """(count, bundle) of the learner actors: their CPUs, GPUs unless fake, and custom
    resources (none with num_learners 0: the learner is in the driver)."""
    bundle = {
        "CPU": config.num_cpus_per_learner,
        "GPU": 0.0 if config._fake_gpus else config.num_gpus_per_learner,
        **config.custom_resources_per_learner,
    }
    return [(config.num_learners, bundle)]
