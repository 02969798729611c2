"""PolicyActor: one TFPolicy in a Ray actor, serving batched `compute_actions`.

The loop it lives in (central inference, as in SEED RL):

    actor = PolicyActor.options(num_gpus=0.5).remote(
        MyPolicy, obs_space, act_space, config, max_batch_size=32, batch_wait_timeout_s=0.001)
    # many rollout workers, concurrently:
    actions, state_outs, extra = ray.get(actor.compute_actions.remote(obs, states))
    extra["weights_version"]                      # version of the weights that acted
    # the learner, once per update (one object-store copy for every receiver):
    weight_sync.broadcast_weights([actor], learner.get_weights(), version=k)

Concurrent calls with the same (explore, timestep) become one forward pass
(`RequestBatcher`); every caller gets back exactly its own rows, and an error reaches
only the caller that caused it. All policy work runs in one PolicyThread, so a pass
never sees half-assigned weights; a short pass runs on the event loop while that
thread is idle. Batching and threads: docs/distributed.md.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import os
import time
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import ray
import tree

from policy_service.config import config_for, is_config, on_cpu
from policy_service.data import nests, spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.batching import RequestBatcher
from policy_service.distributed.policy_thread import PolicyThread
from policy_service.distributed.resources import process_resources
from policy_service.distributed.served_policy import WEIGHTS_VERSION
from policy_service.distributed.weight_sync import next_version
from policy_service.engine import devices
from policy_service.policy import call_arguments

logger = logging.getLogger(__name__)

_LATENCY_WINDOW = 100_000  # latencies kept for the percentiles


class _ActionRequest(NamedTuple):
    """One caller's checked inputs: obs <B rows>, states [k x <float32>[B, ...]] or None."""

    obs: Any
    states: list | None
    prev_actions: Any  # None, or arrays nested like the action space
    prev_rewards: np.ndarray | None
    num_rows: int


class PolicyHost:
    """Hosts one TFPolicy and serves batched inference; `PolicyActor` is its Ray actor.

    max_batch_size: rows that make a forward pass run at once (1: batching off).
    batch_wait_timeout_s: longest wait after a request arrives for others to
      join its pass (0: batching off); none after a pass of one request, so a
      lone caller never waits. 1 ms measured best on two cores.
    intra_op_threads: TensorFlow threads per op inside a Ray actor; defaults
      to the CPUs Ray assigned the actor.
    custom_models: `models.custom_model_registry()` of the process that starts
      the actor, since an actor's process starts with an empty registry.
    initial_weights: (weights, version) to act with from the start instead of the
      policy's initial weights: a restarted actor's latest (restarts.RestartRecord).

    Usable in-process too (its methods are coroutines), which is how its
    batching is unit-tested without Ray.
    """

    def __init__(
        self,
        policy_cls: type,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | Any = None,
        *,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.001,
        intra_op_threads: int | None = None,
        custom_models: dict | None = None,
        initial_weights: tuple[Any, int] | None = None,
    ):
        # here, not at import: a process given this actor's handle (an env runner acting
        # through it) loads this module, and no TensorFlow with it
        from policy_service.engine.fixed_rows import row_ladder
        from policy_service.policy import models

        models.register_custom_models(custom_models)
        ray_gpu_ids, visible_gpus = devices.ray_gpu_ids(), devices.visible_gpus()
        policy_config = hosted_policy_config(
            policy_cls, config, visible_gpus=visible_gpus, ray_gpu_ids=ray_gpu_ids
        )
        prepare_tensorflow(policy_config, intra_op_threads)
        policy = policy_cls(observation_space, action_space, policy_config)
        policy.act_with_xla(*row_ladder(max_batch_size), when_first_used=True)  # unless off
        self._serve(policy, max_batch_size, batch_wait_timeout_s)
        # what resources() reports beside the devices; the policy logged its own note
        self.device_note = self.policy.tower_devices.note or unseen_gpus_note(
            ray_gpu_ids, visible_gpus, self.policy.devices
        )
        if initial_weights is not None:
            weights, version = initial_weights
            self.policy.set_weights(weights)
            self._weights_version = int(version)

    @classmethod
    def for_policy(
        cls,
        policy,
        *,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.001,
        thread: PolicyThread | None = None,
    ) -> PolicyHost:
        """A host serving a policy that already lives in this process (a learner's,
        SEED style; or one of several, which share one `thread`); the owner
        runs its own policy work through `in_policy_thread`."""
        host = cls.__new__(cls)
        host._serve(policy, max_batch_size, batch_wait_timeout_s, thread)
        host.device_note = policy.tower_devices.note
        return host

    def _serve(
        self,
        policy,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        thread: PolicyThread | None = None,
    ) -> None:
        self.policy = policy
        self._initial_state = self.policy.get_initial_state()
        self._thread = thread or PolicyThread()
        self._batcher = RequestBatcher(
            self._forward,
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            executor=self._thread,
            thread_idle=lambda: self._thread.idle,
        )
        self._weights_version = 0
        self._reset_counters()

    # ----- inference ---------------------------------------------------------------

    async def compute_actions(
        self,
        obs_batch,
        state_batches=None,
        *,
        explore=None,
        timestep=None,
        prev_action_batch=None,
        prev_reward_batch=None,
    ):
        """-> (actions [B, ...], state_outs [k x [B, ...]], extra {column: [B, ...],
        "weights_version": int}) for this caller's B rows only. Keyword-only after the
        states: TFPolicy.compute_actions takes prev_action_batch third."""
        arrived = time.perf_counter()
        self._num_requests += 1
        try:
            request = self._check_request(
                obs_batch, state_batches, prev_action_batch, prev_reward_batch
            )
            explore = (
                self.policy.config.explore
                if explore is None
                else call_arguments.flag(explore, "explore")
            )
            timestep = None if timestep is None else call_arguments.count(timestep, "timestep")
            result = await self._batcher.submit((explore, timestep), request, request.num_rows)
        except Exception:
            self._num_failed_requests += 1
            raise
        self._latencies_s.append(time.perf_counter() - arrived)
        return result

    def _check_request(
        self, obs_batch, state_batches, prev_actions, prev_rewards
    ) -> _ActionRequest:
        """Reject a malformed request here, before it can spoil a batch."""
        self.policy.preprocessor.check(obs_batch, column="obs_batch")
        num_rows = int(np.shape(tree.flatten(obs_batch)[0])[0])
        if num_rows == 0:
            raise ValueError("obs_batch has no rows")
        states = None
        initial = self._initial_state
        if state_batches is not None and len(state_batches) > 0:
            if len(state_batches) != len(initial):
                raise ValueError(
                    f"state_batches: expected {len(initial)} state tensors, "
                    f"got {len(state_batches)}"
                )
            states = []
            for i, (state, init) in enumerate(zip(state_batches, initial)):
                state = np.asarray(state, np.float32)
                if state.shape != (num_rows,) + init.shape:
                    raise ValueError(
                        f"state_batches[{i}]: expected shape "
                        f"{(num_rows,) + init.shape}, got {state.shape}"
                    )
                if not np.all(np.isfinite(state)):
                    raise ValueError(f"state_batches[{i}] has NaN or inf")
                states.append(state)
        if prev_actions is not None:
            prev_actions = self.policy.checked_actions(prev_actions, "prev_action_batch", num_rows)
        if prev_rewards is not None:
            prev_rewards = np.asarray(prev_rewards, np.float32)
            if prev_rewards.shape != (num_rows,):
                raise ValueError(
                    f"prev_reward_batch: expected shape {(num_rows,)}, got {prev_rewards.shape}"
                )
        return _ActionRequest(obs_batch, states, prev_actions, prev_rewards, num_rows)

    def _forward(self, key: tuple, requests: list[_ActionRequest]) -> list[tuple]:
        """One forward pass over the requests' rows (the policy thread, or the event loop
        while that is idle) -> per-request results."""
        explore, timestep = key
        obs = nests.join_rows([r.obs for r in requests])
        states = self._concat_states(requests)
        prev_actions = self._concat_optional(
            requests,
            "prev_actions",
            lambda rows: spaces.zero_actions(self.policy.action_space, rows),
        )
        prev_rewards = self._concat_optional(
            requests, "prev_rewards", lambda rows: np.zeros(rows, np.float32)
        )
        actions, state_outs, extra = self.policy.compute_actions(
            obs, states, prev_actions, prev_rewards, explore=explore, timestep=timestep
        )
        version = self._weights_version
        self._num_forward_passes += 1
        self._num_rows += sum(r.num_rows for r in requests)
        if len(requests) == 1:
            return [(actions, state_outs, {**extra, WEIGHTS_VERSION: version})]
        results, start = [], 0
        for request in requests:
            end = start + request.num_rows
            own_extra = {k: v[start:end] for k, v in extra.items()}
            own_extra[WEIGHTS_VERSION] = version
            own_actions = nests.row_range(actions, start, end)
            results.append((own_actions, [s[start:end] for s in state_outs], own_extra))
            start = end
        return results

    def _concat_states(self, requests: list[_ActionRequest]) -> list | None:
        if not self.policy.is_recurrent():
            return None
        per_request = [
            r.states
            if r.states is not None
            else [np.repeat(s[None], r.num_rows, axis=0) for s in self._initial_state]
            for r in requests
        ]
        return [np.concatenate(parts, axis=0) for parts in zip(*per_request)]

    @staticmethod
    def _concat_optional(requests, field: str, zeros):
        """Concatenate an optional input (maybe nested); callers that left it out get
        `zeros(rows)`, which sets the dtypes."""
        values = [getattr(r, field) for r in requests]
        if all(v is None for v in values):
            return None
        parts = [zeros(r.num_rows) if v is None else v for r, v in zip(requests, values)]
        return nests.map_arrays(
            lambda like, joined: np.asarray(joined, like.dtype), zeros(0), nests.join_rows(parts)
        )

    # ----- weights, learning, state --------------------------------------------------

    async def set_weights(self, weights: dict, version: int | None = None) -> int:
        """Replace the weights; `version` defaults to the current one + 1
        (weight_sync.next_version). -> the version. A bad version is refused before
        the weights change."""
        checked = call_arguments.weights_version(version)

        def assign():
            self.policy.set_weights(weights)
            self._weights_version = next_version(self._weights_version, checked)
            return self._weights_version

        return await self.in_policy_thread(assign)

    async def get_weights(self) -> dict:
        return await self.in_policy_thread(self.policy.get_weights)

    async def weights_version(self) -> int:
        return self._weights_version

    async def learn_on_batch(self, batch: SampleBatch) -> dict:
        """One SGD step; the weights change, so the version goes up by one."""

        def learn():
            stats = self.policy.learn_on_batch(batch)
            self._weights_version += 1
            return stats

        return await self.in_policy_thread(learn)

    async def postprocess_trajectories(self, batches: list) -> list[SampleBatch]:
        """`policy.postprocess_trajectory` on each trajectory chunk, with this actor's weights."""

        def postprocess():
            return [self.policy.postprocess_trajectory(SampleBatch(b)) for b in batches]

        return await self.in_policy_thread(postprocess)

    async def get_state(self) -> dict:
        def state():
            return {**self.policy.get_state(), WEIGHTS_VERSION: self._weights_version}

        return await self.in_policy_thread(state)

    async def set_state(self, state: dict) -> None:
        checked = call_arguments.weights_version(
            state.get(WEIGHTS_VERSION) if isinstance(state, dict) else None
        )

        def assign():
            self.policy.set_state(state)
            self._weights_version = next_version(self._weights_version, checked)

        await self.in_policy_thread(assign)
        self._batcher.forget_pass_times()  # its XLA twins may compile anew, off the loop

    async def log_likelihoods(
        self, actions, obs_batch, state_batches=None, prev_action_batch=None, prev_reward_batch=None
    ) -> np.ndarray:
        """log pi(a|s) <float32>[B] of given actions under these weights (for actions a
        caller chose itself, as an external client logs them)."""
        return await self.in_policy_thread(
            lambda: self.policy.compute_log_likelihoods(
                actions, obs_batch, state_batches, prev_action_batch, prev_reward_batch
            )
        )

    async def set_global_timestep(self, timestep: int) -> None:
        """Where the policy's exploration schedule stands (the run's env steps)."""

        def assign():
            self.policy.global_timestep = int(timestep)

        await self.in_policy_thread(assign)

    async def export_saved_model(self, export_dir: str) -> tuple[int, int]:
        """Write the acting SavedModel (io.export) -> (the weights version it holds, the
        policy's global timestep: where its exploration schedule stands)."""

        def export():
            from policy_service.io.export import export_saved_model

            export_saved_model(self.policy, export_dir)
            return self._weights_version, int(self.policy.global_timestep)

        return await self.in_policy_thread(export)

    async def get_initial_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self._initial_state]

    async def get_spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.policy.observation_space, self.policy.action_space

    async def in_policy_thread(self, fn):
        """fn() in the one thread all policy work runs in (between forward passes)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    def mark_version(self, version: int) -> None:
        """The weights changed in place (a learner's step): results now carry `version`."""
        self._weights_version = int(version)

    # ----- statistics ----------------------------------------------------------------

    async def stats(self) -> dict:
        """Requests, forward passes, rows, mean batch size and latency percentiles.

        Latency is measured inside the actor, from a request's arrival to its
        result: queueing, batching wait and the forward pass.
        """
        latencies_ms = np.asarray(self._latencies_s, np.float64) * 1e3
        passes = self._num_forward_passes
        return {
            "num_requests": self._num_requests,
            "num_failed_requests": self._num_failed_requests,
            "num_forward_passes": passes,
            "num_rows": self._num_rows,
            "mean_batch_size": self._num_rows / passes if passes else 0.0,
            "p50_latency_ms": float(np.percentile(latencies_ms, 50)) if len(latencies_ms) else None,
            "p99_latency_ms": float(np.percentile(latencies_ms, 99)) if len(latencies_ms) else None,
            "weights_version": self._weights_version,
            "batching": self._batcher.enabled,
            "max_batch_size": self._batcher.max_batch_size,
            "batch_wait_timeout_s": self._batcher.batch_wait_timeout_s,
            "devices": self.policy.devices,
            "pid": os.getpid(),
        }

    async def resources(self) -> dict:
        """What Ray reserved for this actor and what the policy acts on (see
        `process_resources`)."""
        return process_resources(self.policy.devices, self.device_note)

    async def reset_stats(self) -> None:
        self._reset_counters()

    def _reset_counters(self) -> None:
        self._num_requests = 0
        self._num_failed_requests = 0
        self._num_forward_passes = 0
        self._num_rows = 0
        self._latencies_s: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)


# Ray's stubs list only task options for ray.remote(...); max_concurrency is an actor's
PolicyActor = ray.remote(num_cpus=1, max_concurrency=1000)(PolicyHost)  # type: ignore[call-overload]
PolicyActor.__doc__ = PolicyHost.__doc__


# ----- devices and threads in the hosting process ---------------------------------------


def hosted_policy_config(
    policy_cls: type, config: dict | Any, visible_gpus: int, ray_gpu_ids: list | None
):
    """The policy config adjusted to the devices this process was given.

    With no GPU visible the policy runs on the CPU (num_gpus=0) unless fake GPUs
    are asked for; with GPUs assigned by Ray and num_gpus=0 in the config, it
    uses them (Ray numbers them from 0 inside the actor).
    """
    typed = config_for(policy_cls, config)
    if not is_config(typed):
        return typed
    if visible_gpus == 0 and not typed._fake_gpus:
        return on_cpu(typed)
    if ray_gpu_ids and typed.num_gpus == 0 and visible_gpus > 0:
        return dataclasses.replace(typed, num_gpus=min(len(ray_gpu_ids), visible_gpus))
    return typed


def unseen_gpus_note(ray_gpu_ids: list | None, visible_gpus: int, acting_on: list) -> str | None:
    """One line (logged) when Ray assigned this actor GPUs that TensorFlow cannot see."""
    if not ray_gpu_ids or visible_gpus > 0:
        return None
    note = (
        f"Ray assigned GPU(s) {[str(i) for i in ray_gpu_ids]} but TensorFlow sees no GPU "
        f"in this process; the policy acts on {', '.join(acting_on)} instead"
    )
    logger.warning("PolicyActor: %s", note)
    return note


def prepare_tensorflow(config, intra_op_threads: int | None) -> None:
    """Inside a Ray worker, size TF's thread pools to the CPUs Ray assigned.

    In a driver process TensorFlow is left as the caller configured it.
    """
    if not devices.in_ray_worker():
        return
    fake = is_config(config) and config._fake_gpus and config.num_gpus > 0
    num_devices = max(1, math.ceil(config.num_gpus)) if fake else 1
    threads = intra_op_threads or devices.assigned_cpu_threads()
    devices.prepare_process(num_devices, intra_op_threads=None if fake else threads)
