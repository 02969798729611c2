"""MultiAgentRolloutWorker: a MultiAgentSampler over `num_envs` copies of a multi-agent
env; the worker of a MultiAgentEnvRunnerGroup, in the driver or as a Ray actor.

    worker = MultiAgentRolloutWorker(make_env, agent_policies, num_envs=4,
                                     rollout_fragment_length=50)
    for version in itertools.count(1):
        batch, metrics = worker.sample()       # MultiAgentBatch, {"env_steps", "agent_steps", ...}
        ...                                    # each policy learns on its own rows
        worker.set_weights({"attacker": w_a, "defender": w_d}, version)

Every policy of `agent_policies` acts here as a CPU copy (seeded per worker, as a
single-agent worker's copy is), or, given `policy_actor` (a MultiPolicyActor), through
it: one request per policy and vector step, batched there with the other workers'; or,
given a dict of policy id -> actor (inference: learners), each policy through its own
learner actor, with the weights it trains.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from policy_service.distributed.policy_actor import WEIGHTS_VERSION
from policy_service.distributed.restarts import call_retrying_once
from policy_service.distributed.rollout_worker import (
    ActingWeights,
    check_fragment_sizes,
    prepare_acting_threads,
    rollout_policy_config,
)
from policy_service.distributed.served_policy import ServedPolicy
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.env import MultiAgentEnv
from policy_service.multi_agent.policies import AgentPolicies
from policy_service.multi_agent.sampler import MultiAgentSampler
from policy_service.offline.output import ExperienceOutput
from policy_service.policy import models
from policy_service.runs.callbacks import end_fragment, make_callbacks
from policy_service.runs.metrics_logger import MetricsLogger, Stat


class MultiAgentRolloutWorker(ActingWeights):
    """Samples multi-agent fragments; RolloutWorker's methods, weights by policy id.

    env_creator: env_config -> a MultiAgentEnv (a register_env creator, resolved in
      the process that starts the worker: an actor's registry is empty).
    agent_policies: every policy's complete spec and the mapping from agents to them.
    seed: seeds the episodes and the acting copies' sampling (seed + worker_index);
      None: the policies' config seed + worker_index, episodes unseeded.
    custom_models: `models.custom_model_registry()` of the starting process.
    """

    def __init__(
        self,
        env_creator: Callable[[dict], MultiAgentEnv],
        agent_policies: AgentPolicies,
        *,
        worker_index: int = 0,
        num_envs: int = 1,
        rollout_fragment_length: int = 200,
        vectorize_mode: str = "sync",
        seed: int | None = None,
        policy_actor=None,
        env_config: dict | None = None,
        custom_models: dict | None = None,
        callbacks: type | list | None = None,
    ):
        models.register_custom_models(custom_models)
        check_fragment_sizes(num_envs, rollout_fragment_length)
        self.callbacks = make_callbacks(callbacks)
        self.metrics_logger = MetricsLogger()
        if vectorize_mode != "sync":
            raise ValueError(
                f"vectorize_mode: multi-agent sub-envs step in the worker's process ('sync'), "
                f"got {vectorize_mode!r}"
            )
        self.worker_index = int(worker_index)
        self.envs = [env_creator(dict(env_config or {})) for _ in range(num_envs)]
        self._policy_actor = policy_actor
        self.policies: dict
        if policy_actor is None:
            prepare_acting_threads()
            self.policies = {
                policy_id: spec._replace(
                    config=rollout_policy_config(
                        spec.built_class(), spec.config, seed, self.worker_index
                    )
                ).build()
                for policy_id, spec in agent_policies.specs.items()
            }
        elif isinstance(policy_actor, dict):  # policy id -> its acting learner
            self.policies = {p: ServedPolicy(policy_actor[p]) for p in agent_policies.specs}
        else:
            self.policies = {p: ServedPolicy(policy_actor, p) for p in agent_policies.specs}
        self.sampler = MultiAgentSampler(
            self.envs,
            agent_policies,
            self.policies,
            int(rollout_fragment_length),
            seed=None if seed is None else seed + self.worker_index,
        )
        self._weights_version = 0
        # config.output (each policy's config holds the run's keys): this worker's writer
        first = next(iter(agent_policies.specs.values()))
        self._output = ExperienceOutput.from_config(first.config)
        if self.callbacks.members:
            self.sampler.callbacks = self.callbacks
            self.sampler.hook_arguments = {
                "worker": self,
                "env_runner": self,
                "policies": self.policies,
                "metrics_logger": self.metrics_logger,
            }

    @property
    def policy(self):
        """A policy acting here, whose devices are this worker's (None: a PolicyActor acts)."""
        return None if self._policy_actor is not None else next(iter(self.policies.values()))

    def sample(self) -> tuple[MultiAgentBatch, dict]:
        """One fragment of every sub-env -> (MultiAgentBatch, metrics). Every row
        carries the weights version that acted (an asynchronous learner's policy lag),
        the metrics the oldest ("weights_version") and each policy's rows
        ("policy_agent_steps"); counts and times are Stats, as RolloutWorker.sample's."""
        start = time.perf_counter()
        batch, metrics = self.sampler.sample()
        for rows in batch.policy_batches.values():
            if WEIGHTS_VERSION not in rows:  # acting copies: weights set between fragments
                rows[WEIGHTS_VERSION] = np.full(rows.count, self._weights_version, np.int64)
        # the lag that matters is the trained rows' (a policy not trained may act through
        # a learner of its own whose version never moves)
        trained = set(self.sampler.agent_policies.policies_to_train)
        versions = [
            int(rows[WEIGHTS_VERSION].min())
            for policy_id, rows in batch.policy_batches.items()
            if policy_id in trained
        ]
        metrics.update(
            env_steps=Stat(batch.env_steps(), "sum"),
            agent_steps=Stat(batch.agent_steps(), "sum"),
            num_episodes=Stat(len(metrics["episode_returns"]), "sum"),
            weights_version=Stat(min(versions, default=self._weights_version), "min"),
            policy_agent_steps={p: rows.count for p, rows in batch.policy_batches.items()},
            worker_index=self.worker_index,
            sample_time_s=Stat(time.perf_counter() - start, "max"),  # the slowest worker's
        )
        if self._output is not None:
            observation_spaces, action_spaces = self.get_spaces()
            spaces = {p: (observation_spaces[p], action_spaces[p]) for p in observation_spaces}
            self._output.write(batch, spaces, self.weights_version())
        if self.callbacks.members:
            metrics["callbacks"] = end_fragment(
                self.callbacks,
                self,
                batch,
                self.metrics_logger,
                metrics.pop("custom_metrics", {}),
                metrics.pop("hist_data", {}),
            )
        return batch, metrics

    def sample_and_compute_gradients(self) -> tuple[dict, dict]:
        """One fragment (`sample`), then each trained policy's gradients on its own rows
        of it, computed by its copy here (RolloutWorker.sample_and_compute_gradients;
        a policy without rows in the fragment gives none) -> (policy id -> gradients,
        metrics with "gradient_stats" as "<policy id>/<stat>" and "gradient_time_s")."""
        if self._policy_actor is not None:
            raise RuntimeError(
                f"worker {self.worker_index} acts through a remote policy actor: "
                "sample_and_compute_gradients needs its own policy copies (no remote inference)"
            )
        batch, metrics = self.sample()
        start = time.perf_counter()
        gradients, stats = {}, {}
        for policy_id in self.sampler.agent_policies.policies_to_train:
            rows = batch.policy_batches.get(policy_id)
            if rows is None or not rows.count:
                continue
            gradients[policy_id], policy_stats = self.policies[policy_id].compute_gradients(rows)
            stats.update({f"{policy_id}/{k}": v for k, v in policy_stats.items()})
        metrics["gradient_stats"] = stats
        metrics["gradient_time_s"] = time.perf_counter() - start
        return gradients, metrics

    def own_weights(self) -> dict:
        """policy id -> the acting copy's weights."""
        return {policy_id: policy.get_weights() for policy_id, policy in self.policies.items()}

    def set_own_weights(self, weights: dict) -> None:
        """policy id -> weights, for some or all acting copies; an unknown id changes none."""
        unknown = sorted(set(weights) - set(self.policies))
        if unknown:
            raise ValueError(
                f"weights for policies {unknown}, which are not among {sorted(self.policies)}"
            )
        for policy_id, policy_weights in weights.items():
            self.policies[policy_id].set_weights(policy_weights)

    def get_weights(self) -> dict:
        """policy id -> the weights acting here (with acting learners: theirs)."""
        if isinstance(self._policy_actor, dict):
            return {
                policy_id: call_retrying_once(actor.get_weights)
                for policy_id, actor in self._policy_actor.items()
            }
        return super().get_weights()

    def weights_version(self) -> int:
        """The version acting here; with acting learners, the oldest trained policy's."""
        if isinstance(self._policy_actor, dict):
            return min(
                (
                    call_retrying_once(self._policy_actor[policy_id].weights_version)
                    for policy_id in self.sampler.agent_policies.policies_to_train
                ),
                default=self._weights_version,
            )
        return super().weights_version()

    def set_weights(
        self, weights: dict, version: int | None = None, num_grad_updates: int | None = None
    ) -> int:
        """ActingWeights.set_weights; refused with acting learners, which act with the
        weights they train (nothing is sent to such a worker)."""
        if isinstance(self._policy_actor, dict):
            raise ValueError(
                f"worker {self.worker_index} acts through each policy's learners, which "
                "hold their own weights: set them on the learners"
            )
        return super().set_weights(weights, version, num_grad_updates)

    def set_acting_actor(self, actors: dict) -> None:
        """Act through `actors` (policy id -> actor) from now on: the learners acting for
        this worker were replaced after a death (RolloutWorker.set_acting_actor)."""
        if not isinstance(self._policy_actor, dict):
            raise ValueError(
                f"worker {self.worker_index}: set_acting_actor needs a worker built with "
                "an acting actor per policy (inference: learners)"
            )
        for policy_id, actor in actors.items():
            self.policies[policy_id].actor = actor
        self._policy_actor = dict(actors)

    def acting_actor(self):
        """Who acts for this worker: the MultiPolicyActor, policy id -> actor, or None."""
        return self._policy_actor

    def set_global_timestep(self, timestep: int) -> None:
        """Where the acting copies' exploration schedules stand (a PolicyActor keeps its own)."""
        if self._policy_actor is None:
            for policy in self.policies.values():
                policy.global_timestep = int(timestep)

    def get_spaces(self) -> tuple[dict, dict]:
        """(policy id -> observation space, policy id -> action space)."""
        return self.sampler.agent_policies.spaces()

    def ping(self) -> int:
        return self.worker_index

    def stop(self) -> None:
        for env in self.envs:
            env.close()
        if self._output is not None:
            self._output.close()
