"""Algorithms on the policy_service stack: `get_algorithm_class("ppo")` -> PPO."""
from __future__ import annotations

import importlib

from algorithms.algorithm import Algorithm, AlgorithmConfig
from algorithms.environments import register_env

# name -> "module:Class"; imported on first use, so `import algorithms` stays light
_ALGORITHMS = {"ppo": "algorithms.ppo:PPO"}

__all__ = ["Algorithm", "AlgorithmConfig", "get_algorithm_class", "register_env"]


def get_algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class registered as `name` (case-insensitive)."""
    key = str(name).lower()
    if key not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(_ALGORITHMS)}")
    module_name, _, class_name = _ALGORITHMS[key].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
