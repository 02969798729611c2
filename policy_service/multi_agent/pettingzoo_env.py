"""PettingZoo envs as MultiAgentEnvs: a ParallelEnv directly, an AEC env through
PettingZoo's own `aec_to_parallel` where its metadata says it is parallelizable, and a
turn-based AEC env (a classic game) as `TurnBasedPettingZooEnv`, whose obs dict holds
the agent to move; and env names "pettingzoo:<module>.<env_fn>".

Such a name imports its module, so it is resolved only from a name the user typed
(algorithms/environments.py refuses one read from a file). "<module>" alone takes the
module's `parallel_env`, else its `env`, as in "pettingzoo:mpe2.simple_spread_v3" (PettingZoo
1.27 moved the MPE envs to the mpe2 package) or "pettingzoo:pettingzoo.classic.tictactoe_v3".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from policy_service.errors import UserError, one_line
from policy_service.multi_agent.env import ALL, MultiAgentEnv, MultiAgentEnvError, StepResult

PREFIX = "pettingzoo:"


class PettingZooEnvError(UserError, ValueError):
    """A "pettingzoo:" name that names no importable env function."""


def is_pettingzoo_name(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def env_function(name: str) -> Callable:
    """The env function a "pettingzoo:<module>[.<env_fn>]" name names (imports it)."""
    target = name[len(PREFIX) :]
    try:
        whole = importlib.import_module(target)
    except ImportError:
        whole = None
    for function in ("parallel_env", "env"):
        if callable(getattr(whole, function, None)):
            return getattr(whole, function)
    module, _, function = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), function) if module else None
    except (ImportError, AttributeError) as err:
        raise PettingZooEnvError(f"unknown environment {name!r}: {one_line(err)}") from None
    if not callable(found):
        raise PettingZooEnvError(
            f"unknown environment {name!r}: expected '{PREFIX}<module>.<env_fn>' naming an "
            f"env function, or a module with parallel_env or env"
        )
    return found


class WrappedPettingZoo(MultiAgentEnv):
    """A PettingZoo env's agents and spaces, as PettingZoo gives them per agent."""

    def __init__(self, env) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.observation_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self.agents = []

    def close(self) -> None:
        self.env.close()


class PettingZooEnv(WrappedPettingZoo):
    """A PettingZoo ParallelEnv (or AEC env, converted) with "__all__" in its done dicts:
    true once no agent is left."""

    def __init__(self, env) -> None:
        from pettingzoo import AECEnv  # (a wrapped AEC env has no agent_selection before reset)

        if isinstance(env, AECEnv):
            if not env.metadata.get("is_parallelizable", False):
                raise PettingZooEnvError(
                    f"{env.metadata.get('name', type(env).__name__)} is a turn-based AEC env "
                    f"(metadata is_parallelizable is not true): wrap it in "
                    f"TurnBasedPettingZooEnv (make_pettingzoo_env picks the wrapper)"
                )
            from pettingzoo.utils.conversions import aec_to_parallel

            env = aec_to_parallel(env)
        super().__init__(env)

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


class TurnBasedPettingZooEnv(WrappedPettingZoo):
    """A turn-based PettingZoo AEC env: the obs dict holds the agent to move. Each
    agent's reward is what PettingZoo accumulated for it since its last move (`last()`),
    reported when it is next to move or its game ends; agents whose game ended are
    stepped out with None (as the AEC API asks) and reported done with their last obs.
    "__all__" is true once no agent is left."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.env.reset(seed=seed, options=options)
        obs, _, _, _, infos = self._collect()
        return obs, infos

    def step(self, action_dict: dict) -> StepResult:
        agent = self.env.agent_selection
        if agent not in action_dict:
            raise MultiAgentEnvError(
                f"turn-based env {self.env.metadata.get('name', type(self.env).__name__)}: "
                f"it is {agent!r}'s move, got actions for {sorted(map(str, action_dict))}"
            )
        self.env.step(action_dict[agent])
        return self._collect()

    def _collect(self) -> StepResult:
        """The agent to move next, and before it every agent whose game ended (each
        stepped out): obs, rewards since their last move, done flags, infos."""
        obs, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        while self.env.agents:
            agent = self.env.agent_selection
            obs[agent], reward, terminated, truncated, infos[agent] = self.env.last()
            rewards[agent] = float(reward)
            terminateds[agent], truncateds[agent] = bool(terminated), bool(truncated)
            if not (terminated or truncated):
                break
            self.env.step(None)
        self.agents = list(self.env.agents)
        over = not self.agents
        ended = all(terminateds.values())
        return (
            obs,
            rewards,
            {**terminateds, ALL: over and ended},
            {**truncateds, ALL: over and not ended},
            infos,
        )


def make_pettingzoo_env(name: str, env_config: dict) -> MultiAgentEnv:
    """The env a "pettingzoo:" name names, built with env_config as keyword arguments:
    a TurnBasedPettingZooEnv for an AEC env PettingZoo cannot make parallel."""
    from pettingzoo import AECEnv

    env = env_function(name)(**env_config)
    if isinstance(env, AECEnv) and not env.metadata.get("is_parallelizable", False):
        return TurnBasedPettingZooEnv(env)
    return PettingZooEnv(env)
