"""Algorithms on the policy_service stack: `get_algorithm_class("ppo")` -> PPO, and
`get_config_class("ppo")` -> PPOConfig without loading PPO (nor TensorFlow); by class
name too, as RLlib's `ray.rllib.algorithms` gives them: `from algorithms import PPOConfig`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from algorithms.configs.algorithm import AlgorithmConfig
from algorithms.environments import register_env

if TYPE_CHECKING:
    from algorithms.algorithm import Algorithm

# The registry: name -> "module:Class", imported on first use, so `import algorithms`
# stays light (no TensorFlow). A new algorithm is a module in algorithms/, its config
# class in algorithms/configs/, and one line in each dict here; `policy-service train
# NAME` finds it through get_algorithm_class, a Tune driver its config through
# get_config_class.
ALGORITHMS = {
    "ppo": "algorithms.ppo:PPO",
    "dqn": "algorithms.dqn:DQN",
    "impala": "algorithms.impala:IMPALA",
    "appo": "algorithms.appo:APPO",
    "a3c": "algorithms.a3c:A3C",
    "sac": "algorithms.sac:SAC",
    "td3": "algorithms.td3:TD3",
    "bc": "algorithms.bc:BC",
    "marwil": "algorithms.marwil:MARWIL",
    "cql": "algorithms.cql:CQL",
}
CONFIGS = {
    "ppo": "algorithms.configs.ppo:PPOConfig",
    "dqn": "algorithms.configs.dqn:DQNConfig",
    "impala": "algorithms.configs.impala:IMPALAConfig",
    "appo": "algorithms.configs.appo:APPOConfig",
    "a3c": "algorithms.configs.a3c:A3CConfig",
    "sac": "algorithms.configs.sac:SACConfig",
    "td3": "algorithms.configs.td3:TD3Config",
    "bc": "algorithms.configs.bc:BCConfig",
    "marwil": "algorithms.configs.marwil:MARWILConfig",
    "cql": "algorithms.configs.cql:CQLConfig",
}

__all__ = [
    "ALGORITHMS",
    "CONFIGS",
    "Algorithm",
    "AlgorithmConfig",
    "get_algorithm_class",
    "get_config_class",
    "register_env",
]


def get_algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class registered as `name` (case-insensitive)."""
    return _load(ALGORITHMS[_registered(name)])


def get_config_class(name: str) -> type[AlgorithmConfig]:
    """The config class of the algorithm registered as `name`, its module free of
    TensorFlow (the algorithm's `config_class`: tests/test_tune_imports.py checks it)."""
    return _load(CONFIGS[_registered(name)])


def _registered(name: str) -> str:
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(ALGORITHMS)}")
    return key


def _load(path: str) -> Any:
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


# RLlib's `from ray.rllib.algorithms import PPO, PPOConfig`: each registered class by its
# name, loaded when asked (a config class without TensorFlow, an algorithm with it)
_BY_CLASS_NAME = {
    path.partition(":")[2]: path
    for path in (*ALGORITHMS.values(), *CONFIGS.values(), "algorithms.algorithm:Algorithm")
}


def __getattr__(name: str) -> Any:
    """`from algorithms import PPO, PPOConfig, Algorithm`: a registered algorithm, its
    config class or the loop's base class, loaded when first asked for."""
    if name in _BY_CLASS_NAME:
        return _load(_BY_CLASS_NAME[name])
    raise AttributeError(f"module 'algorithms' has no attribute {name!r}")
