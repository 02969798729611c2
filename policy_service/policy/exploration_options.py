"""The built-in exploration types' options with their rules, and the check of an
exploration_config against a type's options. Without TensorFlow: checking a config that
names a built-in type (every algorithm's default) needs no exploration class, so a Ray
Tune driver checks a trial's config without loading TensorFlow. The classes themselves
(policy_service/policy/exploration.py) take their `option_rules` from here."""

from __future__ import annotations

import math
from typing import Any

from policy_service.config_rules import Rule, finite, integer, is_number

NUMBER_LIST = Rule(
    "a list of finite numbers",
    lambda v: isinstance(v, list) and all(is_number(x) and math.isfinite(x) for x in v),
)

# type name -> each option it takes (its keyword arguments besides the action space) and
# that option's rule
BUILT_IN_OPTIONS: dict[str, dict[str, Any]] = {
    "StochasticSampling": {"random_timesteps": integer(ge=0)},
    "GaussianNoise": {
        "stddev": finite(ge=0),
        "random_timesteps": integer(ge=0),
        "initial_scale": finite(ge=0),
        "final_scale": finite(ge=0),
        "scale_timesteps": integer(ge=0),
    },
    "OrnsteinUhlenbeckNoise": {
        "ou_theta": finite(ge=0, le=1),
        "ou_sigma": finite(ge=0),
        "ou_base_scale": finite(ge=0),
        "random_timesteps": integer(ge=0),
        "initial_scale": finite(ge=0),
        "final_scale": finite(ge=0),
        "scale_timesteps": integer(ge=0),
        "ou_state": NUMBER_LIST,
    },
    "EpsilonGreedy": {
        "initial_epsilon": finite(ge=0, le=1),
        "final_epsilon": finite(ge=0, le=1),
        "epsilon_timesteps": integer(ge=0),
    },
}


def options_error(name: str, takes: list[str], rules: dict, exploration_config: dict) -> str | None:
    """None when `exploration_config` gives only options of `takes` (the type `name`'s),
    each within its rule; else what the config must be (a one-line error's middle)."""
    unknown = sorted(map(str, set(exploration_config) - {"type"} - set(takes)))
    if unknown:
        return f"'type' plus options from {takes} for {name} (unknown: {unknown})"
    for option in sorted(set(exploration_config) & set(rules)):
        expected = rules[option](exploration_config[option])
        if expected is not None:
            return f"{name} options with {option} {expected}"
    return None
