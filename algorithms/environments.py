"""Environments by name: gymnasium ids, "module:EnvId", "ALE/<Game>-v5" (ale-py, with
DeepMind's preprocessing unless preprocessor_pref is None), "pettingzoo:<module>.<env_fn>"
and names given to register_env; and the checks that a name and its env_config fit,
before a run starts."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from policy_service.envs import atari
from policy_service.errors import UserError, one_line
from policy_service.multi_agent import pettingzoo_env

_ENV_CREATORS: dict[str, Callable[[dict], object]] = {}


class EnvironmentSetupError(UserError, ValueError):
    """An environment name or env_config that cannot work."""


def register_env(name: str, creator: Callable[[dict], object]) -> None:
    """Make `config["env"] = name` build envs with `creator(env_config)`.

    The creator travels to remote env runners with the worker (cloudpickle),
    so it works there too. Any other name is a gymnasium id (`gym.make`);
    "module:EnvId" imports module first, so its own registrations apply.
    """
    if not callable(creator):
        raise TypeError(f"env creator for {name!r} must be callable, got {creator!r}")
    _ENV_CREATORS[name] = creator


def is_registered_env(name: str) -> bool:
    """Whether `name` was given to register_env in this process."""
    return name in _ENV_CREATORS


def env_maker(name: str, preprocessor_pref: str | None = "deepmind", dim: int = atari.SCREEN_SIZE):
    """What env runners build envs from: the registered creator; for an ALE id an
    AtariEnvCreator (DeepMind's preprocessing into dim x dim frames when
    preprocessor_pref is "deepmind"; dim: the config's model.dim, as in RLlib); else the
    name itself (gym.make)."""
    if name in _ENV_CREATORS:
        return _ENV_CREATORS[name]
    if atari.is_atari_id(name):
        return atari.AtariEnvCreator(
            name, deepmind=preprocessor_pref == "deepmind", screen_size=dim
        )
    return name


def check_env_id(env: str) -> None:
    """A gymnasium id (or "module:EnvId") that gymnasium knows, or a name given to
    algorithms.register_env in this process; else an error naming it."""

    if is_registered_env(env):
        return
    if pettingzoo_env.is_pettingzoo_name(env):
        try:
            pettingzoo_env.env_function(env)
        except pettingzoo_env.PettingZooEnvError as err:
            raise EnvironmentSetupError(str(err)) from None
        return
    if atari.is_atari_id(env):
        try:
            atari.register_ale_envs(env)
        except atari.AtariSetupError as err:
            raise EnvironmentSetupError(str(err)) from None
    module, sep, env_id = env.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise EnvironmentSetupError(
                f"unknown environment {env!r}: cannot import {module!r} ({err})"
            ) from None
    try:
        gym.spec(env_id)
    except gym.error.Error as err:
        raise EnvironmentSetupError(f"unknown environment {env!r}: {one_line(err)}") from None


def check_env_from_file(env, source, allowed: tuple[str, ...] = ()) -> None:
    """An environment name read from a file (`source`: a checkpoint's or a run's) is
    allowed only when nothing is imported for it: a name given to register_env, a
    gymnasium id already registered (a "module:EnvId" whose module is already
    imported), an ALE id (importing ale-py, the one module such a name imports), or one
    of `allowed`, the names the user gave on this command line.
    Else an error naming the file and the environment; nothing was imported."""
    if not isinstance(env, str) or not env:
        raise EnvironmentSetupError(f"{source}: 'env' must be an environment name, got {env!r}")
    if env in allowed or is_registered_env(env):
        return
    if atari.is_atari_id(env):
        try:
            atari.register_ale_envs(env)
        except atari.AtariSetupError as err:
            raise EnvironmentSetupError(f"{source}: {err}") from None
    module, sep, env_id = env.rpartition(":")
    if env_id in gym.registry and (not sep or module in sys.modules):
        return
    raise EnvironmentSetupError(
        f"{source}: environment {env!r} is not a name given to register_env or a "
        f"registered gymnasium id, and a module named in a file is not imported; "
        f"pass --env {env} to use it"
    )


def check_env_config(env: str, env_config: dict) -> None:
    """Every env_config key is a keyword that gym.make or the env's constructor takes;
    else an error naming the keys. Envs whose constructor takes **kwargs, and names
    given to register_env (their creator takes the whole dict), are not checked."""

    if not env_config or is_registered_env(env):
        return
    if pettingzoo_env.is_pettingzoo_name(env):  # check_env_id resolved it already
        _check_keywords(env, env_config, [pettingzoo_env.env_function(env)])
        return
    spec = gym.spec(env.rpartition(":")[2])  # check_env_id imported "module:" already
    if spec.entry_point is None:  # a spec registered without one cannot be made either
        return
    try:
        creator = (
            spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
        )
    except (ImportError, AttributeError, ValueError) as err:
        raise EnvironmentSetupError(
            f"cannot load environment {env!r} ({spec.entry_point}): {one_line(err)}"
        ) from None
    _check_keywords(env, env_config, [gym.make, creator])


def _check_keywords(env: str, env_config: dict, functions: list) -> None:
    """Every env_config key is a keyword of one of `functions` (the last may take **kwargs)."""
    takes = set()
    for function in functions:
        parameters = inspect.signature(function).parameters.values()
        if function is functions[-1] and any(p.kind is p.VAR_KEYWORD for p in parameters):
            return
        takes |= {
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "id"
        }
    unknown = sorted(map(str, set(env_config) - takes))
    if unknown:
        raise EnvironmentSetupError(
            f"config.env_config key(s) {unknown} are not options of {env}; it takes {sorted(takes)}"
        )
