"""A run with `policies`: its multi-agent env, every policy's spec resolved against the
env's agents, and `multi_agent_env_runners`, its EnvRunnerGroup (sampling in the driver,
or in env runner actors each acting with a CPU copy of every policy, or through one
MultiPolicyActor). Its learners are algorithms/policy_learners.py's, a LearnerGroup per
policy.

A checkpoint of such a run holds policies/<policy id>/ for every policy (each as a
single-agent checkpoint's policy/) and, in algorithm_state.json, "policy_ids" and
"agent_policy_ids" (each possible agent's policy, what `evaluate` maps them by)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from algorithms.environments import env_maker
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.multi_agent import pettingzoo_env
from policy_service.multi_agent.env import MultiAgentEnv, MultiAgentEnvError
from policy_service.multi_agent.policies import (
    AgentPolicies,
    agent_policies,
    mapping_function_registered,
    registered_mapping_name,
)

if TYPE_CHECKING:
    from policy_service.distributed.env_runner_group import EnvRunnerGroup

MULTI_AGENT_KEYS = (
    "policies",
    "policy_mapping_fn",
    "policies_to_train",
    "count_steps_by",
    "frozen_copies",
    "frozen_copies_every",
)
# what a policy's own config leaves out of the run's: the keys above, and the env, which
# is every agent's (a policy config naming a "pettingzoo:" env without policies is refused)
RUN_ONLY_KEYS = (*MULTI_AGENT_KEYS, "env", "env_config")


def multi_agent_env_creator(name: str) -> Callable[[dict], MultiAgentEnv]:
    """What env runners make the env from: a register_env name's creator, resolved here
    (an actor's registry is empty), or a "pettingzoo:" name's maker."""
    if pettingzoo_env.is_pettingzoo_name(name):
        return functools.partial(pettingzoo_env.make_pettingzoo_env, name)
    maker = env_maker(name)
    if not callable(maker):
        raise _not_multi_agent(name, "a gymnasium id")
    return maker


def make_multi_agent_env(name: str, env_config: dict) -> MultiAgentEnv:
    """A register_env name's creator(env_config), or a "pettingzoo:" name's env."""
    env = multi_agent_env_creator(name)(env_config)
    if not isinstance(env, MultiAgentEnv):
        raise _not_multi_agent(name, type(env).__name__)
    return env


def _not_multi_agent(name: str, made: str) -> MultiAgentEnvError:
    return MultiAgentEnvError(
        f"config.policies needs a multi-agent env, but {name!r} made {made}; give a name "
        f"passed to register_env whose creator returns a policy_service.MultiAgentEnv, or "
        f"'pettingzoo:<module>.<env_fn>'"
    )


def resolve_policies(config, default_class: type) -> tuple[MultiAgentEnv, AgentPolicies]:
    """The env and every policy's complete spec (its config: the run's, less
    RUN_ONLY_KEYS, updated with the PolicySpec's), checked against the env's agents
    before the run."""
    env = make_multi_agent_env(config.env, dict(config.env_config))
    base = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_KEYS}
    found = agent_policies(
        config.policies,
        config.policy_mapping_fn,
        config.policies_to_train,
        env,
        default_class,
        base,
    )
    return env, found


def json_config(config) -> dict:
    """The multi-agent keys of `config` as JSON for a checkpoint: a PolicySpec as its
    class ("module:QualName") and config (its spaces are in its policy's state), the
    mapping function by name (a prefix dict as itself); code is never loaded from these
    (`from_checkpoint`)."""
    mapping_fn = config.policy_mapping_fn
    return {
        "policies": {
            policy_id: None
            if spec is None
            else {
                "policy_class": spec.policy_class and checkpoints.class_path(spec.policy_class),
                "config": spec.config,
            }
            for policy_id, spec in config.policies.items()
        },
        "policy_mapping_fn": mapping_fn
        if mapping_fn is None or isinstance(mapping_fn, dict | str)
        else registered_mapping_name(mapping_fn)
        or f"{mapping_fn.__module__}:{mapping_fn.__qualname__}",
    }


def loadable_config(config: dict, checkpoint: str) -> dict:
    """A checkpoint's config (json_config's form), if it builds the run again: every
    policy None and no mapping function (a prefix dict, or the name of a mapping this
    process registered, is data); else a one-line CheckpointFileError."""
    policies = config.get("policies")
    mapping = config.get("policy_mapping_fn")
    if isinstance(mapping, str) and mapping_function_registered(mapping):
        mapping = None  # a registered mapping's name is data
    if not (mapping is None or isinstance(mapping, dict)) or any((policies or {}).values()):
        raise CheckpointFileError(
            f"{checkpoint}: its run had a policy_mapping_fn or PolicySpecs (code, not loaded "
            "from a file); build the algorithm with that config, then call restore(), or "
            "--import the module that registers its mapping by name"
        )
    return config


def multi_agent_env_runners(
    config,
    policies: AgentPolicies,
    seed: int | None,
    inference_actors: dict | None = None,
    callbacks: list | None = None,
) -> EnvRunnerGroup:
    """The run's env runners (AlgorithmConfig.env_runner_settings); `seed` seeds the
    episodes and the acting copies' sampling (None: the policies' config seed);
    `inference_actors` (MultiAgentLearners.actors): each policy acts through its learners;
    `callbacks`: the classes whose runner hooks run in the env runners."""
    from policy_service.distributed.env_runner_group import EnvRunnerGroup

    return EnvRunnerGroup(
        multi_agent_env_creator(config.env),
        policies,
        inference_actors=inference_actors,
        callbacks=callbacks,
        **config.env_runner_settings(seed),
    )
