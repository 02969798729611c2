"""The runner type "external_env": episodes sent by clients outside Ray over HTTP to the
training server (ExternalEnvRunners); the run's `env` only gives the spaces
(policy_service/distributed/runner_types.py)."""

from __future__ import annotations

import os
from typing import Any

from policy_service.config import ConfigError, on_cpu
from policy_service.data import spaces
from policy_service.distributed.resources import RoleAsk


def build(
    config: Any,
    policy_cls: type,
    seed: int | None,
    *,
    env: Any,
    inference_actors: list | None = None,
    callbacks: list | None = None,
):
    """The training server; `seed` is the clients' to use, `inference_actors` and
    `callbacks` are refused here (the server acts and records in its own process)."""
    from policy_service.distributed.env_runner_group import probe_spaces
    from policy_service.offline.output import ExperienceOutput
    from policy_service.serving.external_env_runners import ExternalEnvRunners
    from policy_service.serving.server import ServerAddress, read_token

    if inference_actors:
        raise ConfigError("config.external_env: the training server acts itself, not the learners")
    if callbacks:
        raise ConfigError(
            "config.callbacks: with external_env the episodes are played by the clients, so "
            "no env runner runs episode hooks; use on_train_result / on_learn_on_batch instead"
        )
    observation_space, action_space = probe_spaces(env, dict(config.env_config))
    if spaces.is_nested_action_space(action_space):
        raise ConfigError(
            f"config.external_env: the env's action space {action_space} is nested; "
            "external episodes take flat action spaces (`policy-service serve` serves "
            "nested ones)"
        )
    return ExternalEnvRunners(
        policy_cls,
        observation_space,
        action_space,
        on_cpu(config),
        address=ServerAddress(config.external_env_host, config.external_env_port),
        token=read_token(config.external_env_token_file, os.environ),
        rollout_fragment_length=config.fragment_length(),
        episode_timeout_s=config.episode_timeout_s,
        output=ExperienceOutput.from_config(config),  # config.output: the clients' steps
    )


def resource_asks(config: Any) -> list[RoleAsk]:
    from policy_service.serving.deployment import ServingSettings

    cpus = ServingSettings().num_cpus_per_replica
    return [RoleAsk("training server", 1, {"CPU": cpus}, {"CPU": "external_env"})]
