"""The algorithms by name: `get_algorithm_class("ppo")` -> PPO, `get_config_class("ppo")`
-> PPOConfig without loading PPO (nor TensorFlow). A module of its own that imports no
other of the package's, so config_builder can look a config class's algorithm up
without an import circle through `algorithms`."""

from __future__ import annotations

import importlib
from typing import Any

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


def get_algorithm_class(name: str) -> Any:
    """The Algorithm class registered as `name` (case-insensitive)."""
    return load_class(ALGORITHMS[registered_name(name)])


def get_config_class(name: str) -> Any:
    """The config class of the algorithm registered as `name`, its module free of
    TensorFlow (the algorithm's `config_class`: tests/test_tune_imports.py checks it)."""
    return load_class(CONFIGS[registered_name(name)])


def registered_name(name: str) -> str:
    """`name` as the registry holds it (lower case), or the error naming the known ones;
    nothing is loaded."""
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(ALGORITHMS)}")
    return key


def load_class(path: str) -> Any:
    """The class a "module:Class" path names, its module imported."""
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
