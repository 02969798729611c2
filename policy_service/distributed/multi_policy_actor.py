"""MultiPolicyActor: several TFPolicies in one Ray actor, serving batched
`compute_actions` per policy (remote inference for a multi-agent run).

    actor = MultiPolicyActor.remote({"attacker": spec_a, "defender": spec_d})
    # many rollout workers, concurrently; each call names its policy:
    actions, state_outs, extra = ray.get(
        actor.compute_actions.remote(obs, policy_id="attacker"))
    actor.set_weights.remote({"attacker": w_a, "defender": w_d}, version=k)

Each policy is a PolicyHost of its own (its RequestBatcher: a forward pass holds one
policy's rows, gathered from every caller), and all of them share one PolicyThread,
so no pass sees half-assigned weights of any policy. One weights version counts the
updates of all of them.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import ray

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.policy_actor import (
    PolicyHost,
    hosted_policy_config,
    prepare_tensorflow,
)
from policy_service.distributed.policy_thread import PolicyThread
from policy_service.distributed.resources import process_resources
from policy_service.distributed.weight_sync import next_version
from policy_service.engine import devices
from policy_service.policy.policy_spec import PolicySpec


class MultiPolicyHost:
    """Hosts a PolicyHost per policy id, built from complete PolicySpecs (class, spaces,
    config); the keyword arguments are PolicyHost's, for every policy (initial_weights:
    (policy id -> weights, version))."""

    def __init__(
        self,
        specs: dict[str, PolicySpec],
        *,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.001,
        intra_op_threads: int | None = None,
        custom_models: dict | None = None,
        initial_weights: tuple[dict, int] | None = None,
    ):
        if not specs:
            raise ValueError("MultiPolicyHost needs at least one policy, got {}")
        from policy_service.policy import models  # here: as PolicyHost's (no TF at import)

        models.register_custom_models(custom_models)
        ray_gpu_ids, visible_gpus = devices.ray_gpu_ids(), devices.visible_gpus()
        configs = {
            policy_id: hosted_policy_config(
                spec.built_class(), spec.config, visible_gpus=visible_gpus, ray_gpu_ids=ray_gpu_ids
            )
            for policy_id, spec in specs.items()
        }
        prepare_tensorflow(next(iter(configs.values())), intra_op_threads)
        self._thread = PolicyThread("policies")
        self.hosts = {
            policy_id: PolicyHost.for_policy(
                spec._replace(config=configs[policy_id]).build(),
                max_batch_size=max_batch_size,
                batch_wait_timeout_s=batch_wait_timeout_s,
                thread=self._thread,
            )
            for policy_id, spec in specs.items()
        }
        self._weights_version = 0
        if initial_weights is not None:
            weights, version = initial_weights
            self._assign(self._checked_weights(weights), version)

    def _host(self, policy_id) -> PolicyHost:
        if policy_id not in self.hosts:
            raise ValueError(
                f"policy_id: this PolicyActor serves policies {sorted(self.hosts)}, "
                f"got {policy_id!r}"
            )
        return self.hosts[policy_id]

    # ----- inference ---------------------------------------------------------------

    async def compute_actions(
        self,
        obs_batch,
        state_batches=None,
        *,
        policy_id: str,
        explore=None,
        timestep=None,
        prev_action_batch=None,
        prev_reward_batch=None,
    ):
        """PolicyHost.compute_actions of `policy_id`'s host: batched with the other
        callers' rows of that policy."""
        return await self._host(policy_id).compute_actions(
            obs_batch,
            state_batches,
            explore=explore,
            timestep=timestep,
            prev_action_batch=prev_action_batch,
            prev_reward_batch=prev_reward_batch,
        )

    async def postprocess_trajectories(self, batches: list, policy_id: str) -> list[SampleBatch]:
        """`policy_id`'s policy.postprocess_trajectories (together) with these weights."""
        host = self._host(policy_id)
        return await host.in_policy_thread(
            lambda: host.policy.postprocess_trajectories([SampleBatch(b) for b in batches])
        )

    # ----- weights -----------------------------------------------------------------

    async def set_weights(self, weights: dict, version: int | None = None) -> int:
        """policy id -> weights, for some or all policies; `version` (default: the
        current one + 1) is every policy's from now on. -> the version. An unknown id
        or a bad version is refused before any weights change."""
        new_version = next_version(self._weights_version, version)
        weights = self._checked_weights(weights)
        await self.hosts[next(iter(self.hosts))].in_policy_thread(
            lambda: self._assign(weights, new_version)
        )
        return new_version

    def _checked_weights(self, weights) -> dict:
        if not isinstance(weights, dict):
            raise TypeError(
                f"weights: expected a dict of policy id -> weights, got {type(weights).__name__}"
            )
        for policy_id in weights:
            self._host(policy_id)
        return weights

    def _assign(self, weights: dict, version: int) -> None:
        for policy_id, policy_weights in weights.items():
            self.hosts[policy_id].policy.set_weights(policy_weights)
        self._weights_version = int(version)
        for host in self.hosts.values():
            host.mark_version(version)

    async def get_weights(self) -> dict:
        return {policy_id: await host.get_weights() for policy_id, host in self.hosts.items()}

    async def weights_version(self) -> int:
        return self._weights_version

    async def set_global_timestep(self, timestep: int) -> None:
        """Where every policy's exploration schedule stands (the run's env steps)."""
        for host in self.hosts.values():
            await host.set_global_timestep(timestep)

    # ----- spaces, statistics ------------------------------------------------------

    async def get_initial_state(self, policy_id: str) -> list[np.ndarray]:
        return await self._host(policy_id).get_initial_state()

    async def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """policy id -> (observation space, action space)."""
        return {policy_id: await host.get_spaces() for policy_id, host in self.hosts.items()}

    async def stats(self) -> dict:
        """Requests, forward passes and rows summed over the policies, and each
        policy's own PolicyHost.stats() under "policies"."""
        each = {policy_id: await host.stats() for policy_id, host in self.hosts.items()}
        totals = {
            key: sum(s[key] for s in each.values())
            for key in ("num_requests", "num_failed_requests", "num_forward_passes", "num_rows")
        }
        passes = totals["num_forward_passes"]
        return {
            **totals,
            "mean_batch_size": totals["num_rows"] / passes if passes else 0.0,
            "weights_version": self._weights_version,
            "policies": each,
            "pid": os.getpid(),
        }

    async def reset_stats(self) -> None:
        for host in self.hosts.values():
            await host.reset_stats()

    async def resources(self) -> dict:
        """What Ray reserved for this actor and what its first policy acts on."""
        first = next(iter(self.hosts.values()))
        return process_resources(first.policy.devices, first.device_note)


# Ray's stubs list only task options for ray.remote(...); max_concurrency is an actor's
MultiPolicyActor = ray.remote(num_cpus=1, max_concurrency=1000)(MultiPolicyHost)  # type: ignore[call-overload]
MultiPolicyActor.__doc__ = MultiPolicyHost.__doc__
