"""PettingZoo envs as MultiAgentEnvs: a ParallelEnv directly, an AEC env through
PettingZoo's own `aec_to_parallel` where its metadata says it is parallelizable (a
turn-based game is refused in one line for now); and env names "pettingzoo:<module>.<env_fn>".

Such a name imports its module, so it is resolved only from a name the user typed
(algorithms/environments.py refuses one read from a file). "<module>" alone takes the
module's `parallel_env`, as in "pettingzoo:mpe2.simple_spread_v3" (PettingZoo
1.27 moved the MPE envs to the mpe2 package).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from policy_service.errors import UserError, one_line
from policy_service.multi_agent.env import ALL, MultiAgentEnv, StepResult

PREFIX = "pettingzoo:"


class PettingZooEnvError(UserError, ValueError):
    """A "pettingzoo:" name that names no importable env function."""


def is_pettingzoo_name(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def env_function(name: str) -> Callable:
    """The env function a "pettingzoo:<module>[.<env_fn>]" name names (imports it)."""
    target = name[len(PREFIX) :]
    try:
        return importlib.import_module(target).parallel_env
    except (ImportError, AttributeError):
        pass
    module, _, function = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), function) if module else None
    except (ImportError, AttributeError) as err:
        raise PettingZooEnvError(f"unknown environment {name!r}: {one_line(err)}") from None
    if not callable(found):
        raise PettingZooEnvError(
            f"unknown environment {name!r}: expected '{PREFIX}<module>.<env_fn>' naming an "
            f"env function, or a module with parallel_env"
        )
    return found


class PettingZooEnv(MultiAgentEnv):
    """A PettingZoo ParallelEnv (or AEC env, converted) with "__all__" in its done dicts:
    true once no agent is left."""

    def __init__(self, env) -> None:
        from pettingzoo import AECEnv  # (a wrapped AEC env has no agent_selection before reset)

        if isinstance(env, AECEnv):
            if not env.metadata.get("is_parallelizable", False):
                raise PettingZooEnvError(
                    f"{env.metadata.get('name', type(env).__name__)} is a turn-based AEC env "
                    f"(metadata is_parallelizable is not true): only Parallel envs and AEC envs "
                    f"PettingZoo can convert to Parallel are supported yet"
                )
            from pettingzoo.utils.conversions import aec_to_parallel

            env = aec_to_parallel(env)
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.observation_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self.agents = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        return obs, infos

    def step(self, action_dict: dict) -> StepResult:
        obs, rewards, terminateds, truncateds, infos = self.env.step(action_dict)
        self.agents = list(self.env.agents)
        done = not self.agents
        terminateds = {**terminateds, ALL: done and all(terminateds.values())}
        truncateds = {**truncateds, ALL: done and not terminateds[ALL]}
        return obs, rewards, terminateds, truncateds, infos

    def close(self) -> None:
        self.env.close()


def make_pettingzoo_env(name: str, env_config: dict) -> PettingZooEnv:
    """The env a "pettingzoo:" name names, built with env_config as keyword arguments."""
    return PettingZooEnv(env_function(name)(**env_config))
