"""Algorithms on the policy_service stack: `get_algorithm_class("ppo")` -> PPO."""

from __future__ import annotations

import importlib

from algorithms.algorithm import Algorithm, AlgorithmConfig
from algorithms.environments import register_env

# The registry: name -> "module:Class", imported on first use, so `import algorithms`
# stays light. A new algorithm is a module in algorithms/ and one line here;
# `policy-service train NAME` finds it through get_algorithm_class.
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

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "get_algorithm_class", "register_env"]


def get_algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class registered as `name` (case-insensitive)."""
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(ALGORITHMS)}")
    module_name, _, class_name = ALGORITHMS[key].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
