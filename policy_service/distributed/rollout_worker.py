"""RolloutWorker: steps copies of an env with one policy or several, returns postprocessed
fragments: a gymnasium vector env with one policy (VectorEnvSampler), or multi-agent envs
with a policy per agent by the mapping (MultiAgentSampler; fragments as MultiAgentBatches:
docs/multi_agent.md). Weights, spaces and gradients are by policy id, for one policy too
("default_policy").

The loop it lives in:

    worker = RolloutWorker("CartPole-v1", MyPolicy, config, num_envs=4,
                           rollout_fragment_length=128)        # or ray.remote(RolloutWorker)
    for version in itertools.count(1):
        batch, metrics = worker.sample()       # SampleBatch, {"env_steps": Stat, ...}
        learner.learn_on_batch(batch)
        worker.set_weights({"default_policy": learner.get_weights()}, version)

`sample_and_compute_gradients()` returns a fragment's gradients instead, computed by
the worker's own policy copy, for a learner that applies them (A3C).

Inference runs on a local copy of the policy (CPU), or on a `PolicyActor`
(`policy_actor=`: central inference, as in SEED RL, through a ServedPolicy). The
worker holds the weights, the output writer, the callbacks and the metrics; its
sampler steps the envs. A vector env's contract: a fragment holds
exactly `rollout_fragment_length * num_envs` transitions (autoreset steps are never
recorded, so a last vector step may record more than the fragment lacks: those rows
start the next fragment); episodes carry over between fragments, `unroll_id` is new
per (fragment, sub-env); each chunk (one sub-env, one episode, one fragment) goes through
`policy.postprocess_trajectory`, which bootstraps from the last row's new_obs unless
the episode terminated; every row's "weights_version" is the version that acted, and
a fragment names the SGD steps of the weights it was sampled with when they were
synced with their count (`SampleBatch.num_grad_updates`).
Autoreset, fragments, the columns and the postprocessing contract in full:
docs/distributed.md, "RolloutWorker".
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from policy_service.config import config_for, is_config, on_cpu
from policy_service.data import observation_filters
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.actor_pool import call_retrying_once
from policy_service.distributed.served_policy import WEIGHTS_VERSION, ServedPolicy
from policy_service.distributed.vector_env_sampler import VectorEnvSampler
from policy_service.distributed.weight_sync import next_version
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.policies import (
    DEFAULT_POLICY_ID,
    AgentPolicies,
    refuse_policy_config_beside,
)
from policy_service.multi_agent.sampler import MultiAgentSampler
from policy_service.offline.output import ExperienceOutput
from policy_service.runs.callbacks import end_fragment, make_callbacks
from policy_service.runs.metrics_logger import MetricsLogger, Stat

VECTORIZE_MODES = ("sync", "async")


class ActingWeights:
    """A worker's weights (policy id -> weights) and their version: its own policy
    copies' (`own_weights`, `set_own_weights`), or those of the actor acting for it
    (`_policy_actor`). An actor serving one policy alone (a PolicyActor, an acting
    learner) takes and gives that policy's weights, not by id: `_served_alone` names
    it (None: the actor's weights are by policy id, or no actor acts)."""

    _policy_actor: Any
    _served_alone: str | None = None
    _weights_version: int
    _num_grad_updates: int | None

    def own_weights(self) -> dict:
        raise NotImplementedError

    def set_own_weights(self, weights: dict) -> None:
        raise NotImplementedError

    def set_weights(
        self, weights: dict, version: int | None = None, num_grad_updates: int | None = None
    ) -> int:
        """New weights for the local policy (or the remote one) -> the version now in use.
        num_grad_updates: the SGD steps that made them, which this worker's fragments
        name from now on (SampleBatch.num_grad_updates); not through a policy actor,
        whose weights change apart from this call."""
        if self._policy_actor is not None:
            served = weights if self._served_alone is None else self._served_weights(weights)
            self._weights_version = call_retrying_once(
                self._policy_actor.set_weights, served, version
            )
            return self._weights_version
        self.set_own_weights(weights)
        self._weights_version = next_version(self._weights_version, version)
        self._num_grad_updates = num_grad_updates
        return self._weights_version

    def _served_weights(self, weights: dict) -> dict:
        """The served policy's weights out of `weights` (by policy id), or a ValueError
        naming the id expected and the keys that came."""
        if self._served_alone not in weights:
            raise ValueError(
                f"weights must be by policy id, with {self._served_alone!r}; got keys "
                f"{sorted(map(str, weights))[:5]}"
            )
        return weights[self._served_alone]

    def get_weights(self) -> dict:
        if self._policy_actor is not None:
            served = call_retrying_once(self._policy_actor.get_weights)
            return served if self._served_alone is None else {self._served_alone: served}
        return self.own_weights()

    def weights_version(self) -> int:
        if self._policy_actor is not None:
            return call_retrying_once(self._policy_actor.weights_version)
        return self._weights_version


class RolloutWorker(ActingWeights):
    """Samples fragments of experience from `num_envs` copies of an env, with one policy
    or several.

    env, policy_cls: a gymnasium env and the TFPolicy class acting in it (one policy,
      "default_policy"; a VectorEnvSampler steps them), or a MultiAgentEnv creator
      (`env_config -> MultiAgentEnv`, resolved in the process that starts the worker)
      and an AgentPolicies: every policy's spec and the mapping from agents to them (a
      MultiAgentSampler steps them). Weights, spaces and gradients are by policy id
      either way.
      A gymnasium env is an id ("CartPole-v1", made with `gym.make(id, **env_config)`)
      or a callable `env_config -> gymnasium.Env`.
    policy_config: the one policy's config (or the remote policy's, when `policy_actor`
      is given); an AgentPolicies holds each policy's.
    policy_actor: who acts instead of copies here: a PolicyActor or an acting learner
      (one policy), a MultiPolicyActor, or policy id -> its acting learner.
    seed: seeds the sub-envs (a vector env: seed + worker_index * num_envs + i; a
      multi-agent env: each reset, from seed + worker_index) and the acting copies'
      sampling (seed + worker_index).
    async_context: multiprocessing start method for vectorize_mode="async".
    custom_models: `models.custom_model_registry()` of the process that starts
      the worker, since an actor's process starts with an empty registry.
    callbacks: config key `callbacks` (classes; policy_service/runs/callbacks.py): their
      episode, postprocessing and sample hooks run here, on this worker's instances.
    """

    def __init__(
        self,
        env: str | Callable[[dict], Any],
        policy_cls: type | AgentPolicies,
        policy_config: dict | Any = None,
        *,
        worker_index: int = 0,
        num_envs: int = 1,
        rollout_fragment_length: int = 200,
        vectorize_mode: str = "sync",
        seed: int | None = None,
        policy_actor=None,
        env_config: dict | None = None,
        async_context: str = "spawn",
        custom_models: dict | None = None,
        callbacks: type | list | None = None,
    ):
        if policy_actor is None:  # acting copies here; else no model and no TensorFlow
            prepare_acting_copies(custom_models)
        self.callbacks = make_callbacks(callbacks)
        self.metrics_logger = MetricsLogger()
        check_fragment_sizes(num_envs, rollout_fragment_length)
        self.worker_index = int(worker_index)
        self.num_envs = int(num_envs)
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.env_name = env_name(env)
        self._policy_actor = policy_actor
        self._weights_version = 0
        self._num_grad_updates: int | None = None  # synced with the weights; batches name it
        # one policy of a gymnasium env: its fragments are SampleBatches (with their
        # metrics and gradient statistics not by policy id)
        self._one_policy = not isinstance(policy_cls, AgentPolicies)
        self.policies: dict  # policy id -> the acting policy (a copy here or a ServedPolicy)
        self.sampler: VectorEnvSampler | MultiAgentSampler
        if isinstance(policy_cls, AgentPolicies):
            refuse_policy_config_beside(policy_config, "worker")
            self._sample_multi_agent_env(env, policy_cls, env_config, vectorize_mode, seed)
        else:
            self._sample_vector_env(
                env, policy_cls, policy_config, env_config, vectorize_mode, async_context, seed
            )

    def _sample_vector_env(
        self, env, policy_cls, policy_config, env_config, vectorize_mode, async_context, seed
    ) -> None:
        """A VectorEnvSampler of `num_envs` copies of a gymnasium env, one policy."""
        venv = make_vector_env(env, env_config or {}, self.num_envs, vectorize_mode, async_context)
        self.observation_space = venv.single_observation_space
        self.action_space = venv.single_action_space
        # this runner's own statistics (observation_filters.py); its acting policy,
        # local or remote, gets observations filtered already
        self.observation_filter = observation_filters.make_filter(
            getattr(config_for(policy_cls, policy_config), "observation_filter", "NoFilter"),
            self.observation_space,
        )
        acting: Any
        if self._policy_actor is None:
            acting_config = rollout_policy_config(
                policy_cls, policy_config, seed, self.worker_index
            )
            acting = policy_cls(self.observation_space, self.action_space, acting_config)
            acting.act_with_xla(self.num_envs)  # every step acts on <= num_envs rows
        else:
            self._check_remote_spaces(call_retrying_once(self._policy_actor.get_spaces))
            acting = ServedPolicy(self._policy_actor)
            self._served_alone = DEFAULT_POLICY_ID
        self.policies = {DEFAULT_POLICY_ID: acting}
        self._policies_to_train = [DEFAULT_POLICY_ID]
        self._spaces = (
            {DEFAULT_POLICY_ID: self.observation_space},
            {DEFAULT_POLICY_ID: self.action_space},
        )
        # config.output: this worker's own writer of what it acts on (offline/output.py)
        self._output = ExperienceOutput.from_config(config_for(policy_cls, policy_config))
        self.sampler = VectorEnvSampler(
            venv,
            self.policies,
            rollout_fragment_length=self.rollout_fragment_length,
            acting_version=lambda: self._weights_version,
            env_actions_rule=EnvActionRule.of(  # an unsupported leaf is named here, once
                self.action_space, config_for(policy_cls, policy_config)
            ),
            observation_filter=self.observation_filter,
            worker_index=self.worker_index,
            seed=seed,
            record_infos=self._output is not None,
            env_name=self.env_name,
            callbacks=self.callbacks,
            hook_arguments={
                "worker": self,
                "env_runner": self,
                "policies": {DEFAULT_POLICY_ID: self.policy},
                "metrics_logger": self.metrics_logger,
            },
        )

    def _sample_multi_agent_env(
        self, env_creator, agent_policies: AgentPolicies, env_config, vectorize_mode, seed
    ) -> None:
        """A MultiAgentSampler of `num_envs` copies of a MultiAgentEnv, a policy per
        agent by the mapping; no observation filter (refused with `policies`)."""
        if vectorize_mode != "sync":
            raise ValueError(
                f"vectorize_mode: multi-agent sub-envs step in the worker's process ('sync'), "
                f"got {vectorize_mode!r}"
            )
        envs = [env_creator(dict(env_config or {})) for _ in range(self.num_envs)]
        policy_actor = self._policy_actor
        if policy_actor is None:
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
        self.observation_filter = observation_filters.NoFilter()
        self._policies_to_train = list(agent_policies.policies_to_train)
        self._spaces = agent_policies.spaces()
        self.sampler = MultiAgentSampler(
            envs,
            agent_policies,
            self.policies,
            self.rollout_fragment_length,
            seed=None if seed is None else seed + self.worker_index,
        )
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
        """A policy acting here, whose devices are this worker's (None: an actor acts):
        the one policy's copy, or the first policy's."""
        return None if self._policy_actor is not None else next(iter(self.policies.values()))

    # ----- public API --------------------------------------------------------------

    def sample(self) -> tuple[Any, dict]:
        """One fragment: every chunk postprocessed, then concatenated -> (batch, metrics):
        a SampleBatch (one policy) or a MultiAgentBatch; counts and times are Stats with
        the rule that combines workers' fragments (`fragment_metrics` gives one
        fragment's values), episodes are lists. Every row carries the weights version
        that acted; "weights_version" is the oldest (of the trained policies' rows)."""
        start = time.perf_counter()
        batch: Any  # a SampleBatch from a VectorEnvSampler, a MultiAgentBatch from the other
        batch, sampled = self.sampler.sample()
        if self._one_policy:
            metrics = self._one_policy_metrics(batch, sampled, start)
        else:
            metrics = self._policies_metrics(batch, sampled, start)
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

    def _one_policy_metrics(self, batch: SampleBatch, sampled: dict, start: float) -> dict:
        """A vector env's fragment: its num_grad_updates, its rows written (infos too),
        and the acted versions (with an actor acting: each, and the oldest)."""
        batch.num_grad_updates = self._num_grad_updates
        if self._output is not None:
            space = self.observation_space
            self._output.write_one(batch, space, self.action_space, self.weights_version())
            batch.pop(SampleBatch.INFOS)  # kept for the files only
        versions = sampled["versions"]
        metrics: dict[str, Any] = {
            "env_steps": Stat(batch.count, "sum"),
            "episode_returns": sampled["episode_returns"],
            "episode_lengths": sampled["episode_lengths"],
            "num_episodes": Stat(len(sampled["episode_returns"]), "sum"),
            # the oldest version that acted: what max_policy_lag judges a fragment by
            "weights_version": Stat(
                self.weights_version()
                if self._policy_actor is None
                else min(versions, default=None),
                "min",
            ),
            "worker_index": self.worker_index,
            "sample_time_s": Stat(time.perf_counter() - start, "max"),  # the slowest worker's
            **{
                timer: Stat(sampled[timer], "sum")
                for timer in ("postprocess_time_s", "inference_time_s", "env_time_s")
            },
        }
        if self._policy_actor is not None:
            metrics["weights_versions"] = sorted(versions)
        if self.callbacks.members:
            metrics["custom_metrics"] = sampled["custom_metrics"]
            metrics["hist_data"] = sampled["hist_data"]
        return metrics

    def _policies_metrics(self, batch: MultiAgentBatch, sampled: dict, start: float) -> dict:
        """A multi-agent fragment: acting copies' rows get the version set between
        fragments; agent steps, each policy's rows; the batch written."""
        for rows in batch.policy_batches.values():
            if WEIGHTS_VERSION not in rows:  # acting copies: weights set between fragments
                rows[WEIGHTS_VERSION] = np.full(rows.count, self._weights_version, np.int64)
        # the lag that matters is the trained rows' (a policy not trained may act through
        # a learner of its own whose version never moves)
        versions = [
            int(rows[WEIGHTS_VERSION].min())
            for policy_id, rows in batch.policy_batches.items()
            if policy_id in self._policies_to_train
        ]
        metrics = dict(sampled)
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
            observation_spaces, action_spaces = self._spaces
            spaces = {p: (observation_spaces[p], action_spaces[p]) for p in observation_spaces}
            self._output.write(batch, spaces, self.weights_version())
        return metrics

    def sample_and_compute_gradients(self) -> tuple[dict, dict]:
        """One fragment (`sample`), then each trained policy's gradients on its own rows
        of it, computed by its copy here (`TFPolicy.compute_gradients`: combined, clipped,
        no weights changed; a policy without rows in the fragment gives none) ->
        (policy id -> gradients, metrics): `sample`'s metrics, whose "weights_version" is
        the version the gradients were computed with, plus "gradient_stats" (the loss
        statistics; with an AgentPolicies "<policy id>/<stat>") and "gradient_time_s".
        For learners that apply gradients computed where the data is (A3C); the worker
        must act with its own policy copies."""
        if self._policy_actor is not None:
            raise RuntimeError(
                f"worker {self.worker_index} acts through a remote policy actor: "
                "sample_and_compute_gradients needs its own policy copy (no remote inference)"
            )
        batch, metrics = self.sample()
        start = time.perf_counter()
        policy_batches = {DEFAULT_POLICY_ID: batch} if self._one_policy else batch.policy_batches
        gradients, stats = {}, {}
        for policy_id in self._policies_to_train:
            rows = policy_batches.get(policy_id)
            if rows is None or not rows.count:
                continue
            gradients[policy_id], policy_stats = self.policies[policy_id].compute_gradients(rows)
            stats[policy_id] = policy_stats
        if self._one_policy:
            metrics["gradient_stats"] = stats[DEFAULT_POLICY_ID]
        else:
            metrics["gradient_stats"] = {
                f"{p}/{k}": v for p, policy_stats in stats.items() for k, v in policy_stats.items()
            }
        metrics["gradient_time_s"] = time.perf_counter() - start
        return gradients, metrics

    def own_weights(self) -> dict:
        """The acting copies' weights by policy id."""
        return {p: policy.get_weights() for p, policy in self.policies.items()}

    def set_own_weights(self, weights: dict) -> None:
        """Weights for some or all acting copies, by policy id; an unknown id changes none."""
        unknown = sorted(set(weights) - set(self.policies))
        if unknown:
            raise ValueError(
                f"weights for policies {unknown}, which are not among {sorted(self.policies)}"
            )
        for policy_id, policy_weights in weights.items():
            self.policies[policy_id].set_weights(policy_weights)

    def get_weights(self) -> dict:
        """The weights acting here (with acting learners by policy id: theirs)."""
        if isinstance(self._policy_actor, dict):
            return {
                policy_id: call_retrying_once(actor.get_weights)
                for policy_id, actor in self._policy_actor.items()
            }
        return super().get_weights()

    def weights_version(self) -> int:
        """The version acting here; with acting learners by policy id, the oldest
        trained policy's."""
        if isinstance(self._policy_actor, dict):
            return min(
                (
                    call_retrying_once(self._policy_actor[policy_id].weights_version)
                    for policy_id in self._policies_to_train
                ),
                default=self._weights_version,
            )
        return super().weights_version()

    def set_weights(
        self, weights: dict, version: int | None = None, num_grad_updates: int | None = None
    ) -> int:
        """ActingWeights.set_weights; refused with acting learners by policy id, which act
        with the weights they train (nothing is sent to such a worker)."""
        if isinstance(self._policy_actor, dict):
            raise ValueError(
                f"worker {self.worker_index} acts through each policy's learners, which "
                "hold their own weights: set them on the learners"
            )
        return super().set_weights(weights, version, num_grad_updates)

    def set_acting_actor(self, actor: Any) -> None:
        """Act through `actor` from now on (policy id -> actor when built so): the one
        that acted is gone and this one serves the same policies and spaces (learner
        actors replaced after a death). The episodes in progress go on; a fragment lost
        with the old actor is the caller's to count."""
        if self._policy_actor is None:
            raise ValueError(
                f"worker {self.worker_index} acts with its own policy copy: "
                "set_acting_actor needs a worker built with a policy_actor"
            )
        by_policy = isinstance(self._policy_actor, dict)
        if isinstance(actor, dict) != by_policy:
            raise ValueError(
                f"worker {self.worker_index} acts through "
                + ("an actor per policy" if by_policy else "one actor")
                + f": set_acting_actor got {type(actor).__name__}"
            )
        if isinstance(actor, dict):
            for policy_id, one in actor.items():
                self.policies[policy_id].actor = one
            self._policy_actor = dict(actor)
        else:
            for policy in self.policies.values():
                policy.actor = actor
            self._policy_actor = actor

    def acting_actor(self) -> Any:
        """Who acts for this worker: a PolicyActor or learner, a MultiPolicyActor,
        policy id -> actor, or None (its own policy copies act)."""
        return self._policy_actor

    def set_global_timestep(self, timestep: int) -> None:
        """Where the acting copies' exploration schedules stand (RLlib's
        global_vars["timestep"]), e.g. the run's env steps for workers rebuilt at a
        restore; a remote policy keeps its own count."""
        if self._policy_actor is None:
            for policy in self.policies.values():
                policy.global_timestep = int(timestep)

    def get_spaces(self) -> tuple[dict, dict]:
        """(observation spaces, action spaces), each by policy id."""
        observation_spaces, action_spaces = self._spaces
        return dict(observation_spaces), dict(action_spaces)

    def flush_filter_buffer(self) -> observation_filters.RunningStat | None:
        """The observation statistics gathered since the last flush (None: NoFilter)."""
        return self.observation_filter.flush_buffer()

    def sync_filter(self, stats: observation_filters.RunningStat) -> None:
        """Normalize with the driver's merged statistics from now on."""
        self.observation_filter.sync(stats)

    def ping(self) -> int:
        return self.worker_index

    def stop(self) -> None:
        self.sampler.close()
        if self._output is not None:
            self._output.close()

    def _check_remote_spaces(self, remote_spaces) -> None:
        obs_space, action_space = remote_spaces
        if obs_space != self.observation_space or action_space != self.action_space:
            raise ValueError(
                f"env {self.env_name!r} has spaces ({self.observation_space}, "
                f"{self.action_space}) but the policy actor serves ({obs_space}, {action_space})"
            )


# ----- helpers ----------------------------------------------------------------------


def make_vector_env(
    env, env_config: dict, num_envs: int, vectorize_mode: str, async_context: str = "spawn"
) -> gym.vector.VectorEnv:
    """A gymnasium vector env of `num_envs` copies (NEXT_STEP autoreset)."""
    if isinstance(env, str):
        env_fns = [functools.partial(gym.make, env, **env_config) for _ in range(num_envs)]
    elif callable(env):
        env_fns = [functools.partial(env, dict(env_config)) for _ in range(num_envs)]
    else:
        raise TypeError(
            f"env must be a gymnasium id or a callable env_config -> Env, "
            f"got {type(env).__name__}: {env!r}"
        )
    mode = gym.vector.AutoresetMode.NEXT_STEP
    if vectorize_mode == "sync":
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=mode)
    if vectorize_mode == "async":
        return gym.vector.AsyncVectorEnv(env_fns, context=async_context, autoreset_mode=mode)
    raise ValueError(
        f"vectorize_mode must be one of {list(VECTORIZE_MODES)}, got {vectorize_mode!r}"
    )


def fragment_metrics(metrics: dict) -> dict:
    """A worker's sample() metrics as one fragment's: each Stat's value (its rule is
    for combining fragments, EnvRunnerGroup.sample); episodes and the rest as they are."""
    return {key: v.value if isinstance(v, Stat) else v for key, v in metrics.items()}


def env_name(env) -> str:
    if isinstance(env, str):
        return env
    return getattr(env, "__qualname__", None) or getattr(env, "__name__", None) or repr(env)


def check_fragment_sizes(num_envs: int, rollout_fragment_length: int) -> None:
    """A worker's sub-env count and fragment length, each >= 1."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if rollout_fragment_length < 1:
        raise ValueError(f"rollout_fragment_length must be >= 1, got {rollout_fragment_length}")


def prepare_acting_copies(custom_models: dict | None) -> None:
    """Before this process builds acting policy copies: the run's custom models registered
    and, in a Ray actor, TensorFlow's thread pools sized to the CPUs Ray assigned it.
    Imported here: a worker acting through an actor builds no model and loads no
    TensorFlow."""
    from policy_service.engine import devices
    from policy_service.policy import models

    models.register_custom_models(custom_models)
    if devices.in_ray_worker():
        threads = devices.assigned_cpu_threads()
        devices.prepare_process(1, intra_op_threads=threads, inter_op_threads=threads)


def rollout_policy_config(
    policy_cls: type, config: dict | Any, seed: int | None, worker_index: int
):
    """The acting copy's config: CPU only, its own sampling seed per worker, acting on
    observations the worker filtered already."""
    typed = observation_filters.unfiltered(config_for(policy_cls, config))
    if not is_config(typed):
        return typed
    base_seed = seed if seed is not None else typed.seed
    return on_cpu(typed, seed=typed.seed if base_seed is None else int(base_seed) + worker_index)
