"""A Ray Tune trial's placement group bundles, from its checked config alone: the
trial's own actor (the algorithm's driver) first, then one bundle per actor the run
starts (env runners or the external env's training server, the PolicyActor, learners).

They are the asks the run checks against the cluster before it starts
(`Algorithm.resource_asks`), read from the same TensorFlow-free modules
(policy_service/distributed/role_asks.py and each runner type's `resource_asks`):
Tune asks for them in the sweep's driver, which would otherwise load TensorFlow only
for this (tests/test_tune_imports.py checks it does not).
"""

from __future__ import annotations

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.distributed.role_asks import learner_asks
from policy_service.distributed.runner_types import runner_type, runner_type_module

DRIVER_CPUS = 1.0  # the trial's own actor: it samples (num_env_runners: 0) and may learn


def trial_bundles(config: AlgorithmConfig) -> list[dict]:
    """The driver's bundle (1 CPU, and the learner's GPUs when it learns in the driver),
    then one bundle per actor; actors that ask for nothing take no bundle."""
    driver = {"CPU": DRIVER_CPUS}
    if config.num_learners == 0 and config.num_gpus > 0 and not config._fake_gpus:
        driver["GPU"] = float(config.num_gpus)
    bundles = [driver]
    asks = runner_type_module(runner_type(config)).resource_asks(config) + learner_asks(config)
    for ask in asks:
        kept = {resource: float(n) for resource, n in ask.bundle.items() if n > 0}
        if kept:
            bundles.extend(dict(kept) for _ in range(ask.num_actors))
    return bundles
