"""RolloutWorker: steps a gymnasium vector env with a policy, returns postprocessed fragments.

The loop it lives in:

    worker = RolloutWorker("CartPole-v1", MyPolicy, config, num_envs=4,
                           rollout_fragment_length=128)        # or ray.remote(RolloutWorker)
    for version in itertools.count(1):
        batch, metrics = worker.sample()       # SampleBatch, {"env_steps": Stat, ...}
        learner.learn_on_batch(batch)
        worker.set_weights(learner.get_weights(), version)

`sample_and_compute_gradients()` returns a fragment's gradients instead, computed by
the worker's own policy copy, for a learner that applies them (A3C).

Inference runs on a local copy of the policy (CPU), or on a `PolicyActor`
(`policy_actor=`: central inference, as in SEED RL, through a ServedPolicy). The
worker holds the weights, the output writer, the callbacks and the metrics; its
VectorEnvSampler (vector_env_sampler.py) steps the envs. Contract: a fragment holds
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

from policy_service.config import config_for, is_config, on_cpu
from policy_service.data import observation_filters
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.restarts import call_retrying_once
from policy_service.distributed.served_policy import ServedPolicy
from policy_service.distributed.vector_env_sampler import VectorEnvSampler
from policy_service.distributed.weight_sync import next_version
from policy_service.engine import devices
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
from policy_service.offline.output import ExperienceOutput
from policy_service.policy import models
from policy_service.runs.callbacks import end_fragment, make_callbacks
from policy_service.runs.metrics_logger import MetricsLogger, Stat

VECTORIZE_MODES = ("sync", "async")


class ActingWeights:
    """A worker's weights and their version: its own policy copy's (`own_weights`,
    `set_own_weights`), or those of the PolicyActor acting for it (`_policy_actor`)."""

    _policy_actor: Any
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
            self._weights_version = call_retrying_once(
                self._policy_actor.set_weights, weights, version
            )
            return self._weights_version
        self.set_own_weights(weights)
        self._weights_version = next_version(self._weights_version, version)
        self._num_grad_updates = num_grad_updates
        return self._weights_version

    def get_weights(self) -> dict:
        if self._policy_actor is not None:
            return call_retrying_once(self._policy_actor.get_weights)
        return self.own_weights()

    def weights_version(self) -> int:
        if self._policy_actor is not None:
            return call_retrying_once(self._policy_actor.weights_version)
        return self._weights_version


class RolloutWorker(ActingWeights):
    """Samples fragments of experience from `num_envs` copies of an env.

    env: a gymnasium id ("CartPole-v1", made with `gym.make(id, **env_config)`)
      or a callable `env_config -> gymnasium.Env`.
    policy_cls, policy_config: the TFPolicy class and config acting here (or
      describing the remote policy when `policy_actor` is given).
    seed: seeds the sub-envs (seed + worker_index * num_envs + i) and the
      policy's action sampling (seed + worker_index).
    async_context: multiprocessing start method for vectorize_mode="async".
    custom_models: `models.custom_model_registry()` of the process that starts
      the worker, since an actor's process starts with an empty registry.
    callbacks: config key `callbacks` (classes; policy_service/runs/callbacks.py): their
      episode, postprocessing and sample hooks run here, on this worker's instances.
    """

    def __init__(
        self,
        env: str | Callable[[dict], gym.Env],
        policy_cls: type,
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
        models.register_custom_models(custom_models)
        self.callbacks = make_callbacks(callbacks)
        self.metrics_logger = MetricsLogger()
        check_fragment_sizes(num_envs, rollout_fragment_length)
        self.worker_index = int(worker_index)
        self.num_envs = int(num_envs)
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.env_name = env_name(env)
        venv = make_vector_env(env, env_config or {}, num_envs, vectorize_mode, async_context)
        self.observation_space = venv.single_observation_space
        self.action_space = venv.single_action_space
        self._policy_actor = policy_actor
        # this runner's own statistics (observation_filters.py); its acting policy,
        # local or remote, gets observations filtered already
        self.observation_filter = observation_filters.make_filter(
            getattr(config_for(policy_cls, policy_config), "observation_filter", "NoFilter"),
            self.observation_space,
        )
        acting: Any
        if policy_actor is None:
            prepare_acting_threads()
            acting_config = rollout_policy_config(
                policy_cls, policy_config, seed, self.worker_index
            )
            self.policy = acting = policy_cls(
                self.observation_space, self.action_space, acting_config
            )
            self.policy.act_with_xla(self.num_envs)  # every step acts on <= num_envs rows
        else:
            self.policy = None
            self._check_remote_spaces(call_retrying_once(policy_actor.get_spaces))
            acting = ServedPolicy(policy_actor)
        self._weights_version = 0
        self._num_grad_updates: int | None = None  # synced with the weights; batches name it
        # config.output: this worker's own writer of what it acts on (offline/output.py)
        self._output = ExperienceOutput.from_config(config_for(policy_cls, policy_config))
        self.sampler = VectorEnvSampler(
            venv,
            {DEFAULT_POLICY_ID: acting},
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

    # ----- public API --------------------------------------------------------------

    def sample(self) -> tuple[SampleBatch, dict]:
        """One fragment: every chunk postprocessed, then concatenated -> (batch, metrics):
        counts and times are Stats with the rule that combines workers' fragments
        (`fragment_metrics` gives one fragment's values), episodes are lists."""
        start = time.perf_counter()
        batch, sampled = self.sampler.sample()
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
            metrics["callbacks"] = end_fragment(
                self.callbacks,
                self,
                batch,
                self.metrics_logger,
                sampled["custom_metrics"],
                sampled["hist_data"],
            )
        return batch, metrics

    def sample_and_compute_gradients(self) -> tuple[Any, dict]:
        """One fragment (`sample`), then this worker's policy's gradients on it
        (`TFPolicy.compute_gradients`: combined, clipped, no weights changed) ->
        (gradients, metrics): `sample`'s metrics, whose "weights_version" is the
        version the gradients were computed with, plus "gradient_stats" (the loss
        statistics) and "gradient_time_s". For learners that apply gradients computed
        where the data is (A3C); the worker must act with its own policy copy."""
        if self.policy is None:
            raise RuntimeError(
                f"worker {self.worker_index} acts through a remote policy actor: "
                "sample_and_compute_gradients needs its own policy copy (no remote inference)"
            )
        batch, metrics = self.sample()
        start = time.perf_counter()
        gradients, stats = self.policy.compute_gradients(batch)
        metrics["gradient_stats"] = stats
        metrics["gradient_time_s"] = time.perf_counter() - start
        return gradients, metrics

    def own_weights(self) -> dict:
        return self.policy.get_weights()

    def set_own_weights(self, weights: dict) -> None:
        self.policy.set_weights(weights)

    def set_acting_actor(self, actor: Any) -> None:
        """Act through `actor` from now on: the one that acted is gone and this one
        serves the same policy and spaces (a learner actor replaced after a death).
        The episodes in progress go on; a fragment lost with the old actor is the
        caller's to count."""
        if self._policy_actor is None:
            raise ValueError(
                f"worker {self.worker_index} acts with its own policy copy: "
                "set_acting_actor needs a worker built with a policy_actor"
            )
        self._policy_actor = self.sampler.policy.actor = actor

    def acting_actor(self) -> Any:
        """The actor acting for this worker (None: its own policy copy acts)."""
        return self._policy_actor

    def set_global_timestep(self, timestep: int) -> None:
        """Where the local policy's exploration schedule stands (RLlib's
        global_vars["timestep"]), e.g. the run's env steps for workers rebuilt at a
        restore; a remote policy keeps its own count."""
        if self.policy is not None:
            self.policy.global_timestep = int(timestep)

    def get_spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.observation_space, self.action_space

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


def prepare_acting_threads() -> None:
    """In a Ray actor, TensorFlow's thread pools sized to the CPUs Ray assigned it
    (before a policy acting there initializes TensorFlow)."""
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
