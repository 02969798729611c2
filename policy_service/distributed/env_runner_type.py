"""The runner type "env": env runners stepping the run's envs (EnvRunnerGroup), in the
driver or as Ray actors, acting with their own policy copies, a PolicyActor or the
learners (runner_types.py)."""

from __future__ import annotations

from typing import Any

from policy_service.config import on_cpu
from policy_service.distributed.lazy_policy_class import LazyPolicyClass
from policy_service.distributed.resources import RoleAsk
from policy_service.distributed.role_asks import env_runner_asks, policy_actor_ray_options


def build(
    config: Any,
    policy_cls: type,
    seed: int | None,
    *,
    env: Any,
    inference_actors: list | None = None,
    callbacks: list | None = None,
):
    from policy_service.distributed.env_runner_group import EnvRunnerGroup

    # loaded where a policy is built: a runner acting through an actor loads no TensorFlow
    return EnvRunnerGroup(
        env,
        LazyPolicyClass(policy_cls),  # type: ignore[arg-type]  # builds as the class does
        on_cpu(config),
        inference_actors=inference_actors,
        callbacks=callbacks,
        **config.env_runner_settings(seed),
    )


def resource_asks(config: Any) -> list[RoleAsk]:
    options = policy_actor_ray_options(None, on_cpu(config)) if config.remote_inference else None
    return env_runner_asks(
        config.num_env_runners,
        config.num_cpus_per_env_runner,
        options,
        config.custom_resources_per_env_runner,
    )
