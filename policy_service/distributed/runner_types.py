"""Where a run's samples come from: a registered runner type, chosen once from the config.

    kind = runner_type(config)                  # "env", "external_env" or "offline"
    runners = runner_type_module(kind).build(config, policy_cls, seed, env=..., ...)
    asks = runner_type_module(kind).resource_asks(config)

A type is a module with `build(config, policy_cls, seed, *, env, inference_actors,
callbacks) -> runners` (an EnvRunnerGroup, or an object that samples as one does) and
`resource_asks(config) -> list[RoleAsk]`; runners that act through a PolicyActor also
have `num_policy_actor_restarts()` (read by `policy_actor_restarts`). A new source of
samples is a module and a line in RUNNER_TYPES (or `register_runner_type`); the
algorithm does not change.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

RUNNER_TYPES: dict[str, str] = {
    "env": "policy_service.distributed.env_runner_type",  # envs: in the driver or in actors
    "external_env": "policy_service.serving.external_env_runner_type",  # HTTP clients' episodes
    "offline": "policy_service.offline.offline_runner_type",  # logged experiences (`input`)
}


def register_runner_type(name: str, module: str) -> None:
    """Make `module` (a dotted module name) the runner type `name`."""
    if not name or not isinstance(module, str):
        raise ValueError(f"register_runner_type: expected a name and a module name, got {module!r}")
    RUNNER_TYPES[name] = module


def runner_type(config: Any) -> str:
    """The runner type a config asks for."""
    if getattr(config, "input", "sampler") != "sampler":
        return "offline"
    return "external_env" if getattr(config, "external_env", False) else "env"


def runner_type_module(kind: str) -> ModuleType:
    if kind not in RUNNER_TYPES:
        raise ValueError(f"unknown runner type {kind!r}; known: {sorted(RUNNER_TYPES)}")
    return importlib.import_module(RUNNER_TYPES[kind])


def policy_actor_restarts(runners: Any) -> int:
    """How often Ray restarted the PolicyActor acting for `runners` (a runner type's
    build()); 0 for the types that act without one (they leave the method out)."""
    count = getattr(runners, "num_policy_actor_restarts", None)
    return 0 if count is None else int(count())
