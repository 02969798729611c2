"""Algorithms on the policy_service stack: `get_algorithm_class("ppo")` -> PPO, and
`get_config_class("ppo")` -> PPOConfig without loading PPO (nor TensorFlow); by class
name too, as RLlib's `ray.rllib.algorithms` gives them: `from algorithms import PPOConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from algorithms.configs.algorithm import AlgorithmConfig
from algorithms.environments import register_env
from algorithms.registry import (  # the registry: name -> class, see algorithms/registry.py
    ALGORITHMS,
    CONFIGS,
    get_algorithm_class,
    get_config_class,
    load_class,
)

if TYPE_CHECKING:
    from algorithms.algorithm import Algorithm

__all__ = [
    "ALGORITHMS",
    "CONFIGS",
    "Algorithm",
    "AlgorithmConfig",
    "get_algorithm_class",
    "get_config_class",
    "register_env",
]


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
        return load_class(_BY_CLASS_NAME[name])
    raise AttributeError(f"module 'algorithms' has no attribute {name!r}")
