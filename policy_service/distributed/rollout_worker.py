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
(`policy_actor=`: central inference, as in SEED RL). Contract: a fragment holds
exactly `rollout_fragment_length * num_envs` transitions (autoreset steps are never
recorded, so a last vector step may record more than the fragment lacks: those rows
start the next fragment); episodes carry over between fragments, `unroll_id` is new
per (fragment,
sub-env); each chunk (one sub-env, one episode, one fragment) goes through
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
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import tree

from policy_service.config import config_for, is_config, on_cpu
from policy_service.data import observation_filters, spaces
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.policy_actor import WEIGHTS_VERSION
from policy_service.distributed.restarts import call_retrying_once
from policy_service.distributed.weight_sync import next_version
from policy_service.engine import devices
from policy_service.offline.output import ExperienceOutput, infos_column
from policy_service.policy import models
from policy_service.runs.callbacks import (
    EPISODE_HOOKS,
    Episode,
    end_fragment,
    gather_episode,
    make_callbacks,
)
from policy_service.runs.metrics_logger import MetricsLogger, Stat

VECTORIZE_MODES = ("sync", "async")
_ENV_INDEX = "env_index"  # bookkeeping column, dropped before returning a batch
_UNROLL_IDS_PER_WORKER = 2**32


class PolicyStep(NamedTuple):
    """The policy's side of one vector step: what its acting sub-envs showed it
    (by row of `acting`, their indices) and what it answered."""

    acting: np.ndarray
    obs: Any
    states: list
    prev_actions: Any  # arrays nested like the action space
    prev_rewards: np.ndarray
    actions: Any
    state_outs: list
    extra: dict


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
        # episode objects are kept only for hooks that read them
        self._episode_hooks = any(map(self.callbacks.overrides, EPISODE_HOOKS))
        self._episodes: list[Episode | None] = [None] * int(num_envs)
        check_fragment_sizes(num_envs, rollout_fragment_length)
        self.worker_index = int(worker_index)
        self.num_envs = int(num_envs)
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.env_name = env_name(env)
        self._seed = seed
        self._venv = make_vector_env(env, env_config or {}, num_envs, vectorize_mode, async_context)
        self.observation_space = self._venv.single_observation_space
        self.action_space = self._venv.single_action_space
        self._policy_actor = policy_actor
        # this runner's own statistics (observation_filters.py); its acting policy,
        # local or remote, gets observations filtered already
        self.observation_filter = observation_filters.make_filter(
            getattr(config_for(policy_cls, policy_config), "observation_filter", "NoFilter"),
            self.observation_space,
        )
        if policy_actor is None:
            prepare_acting_threads()
            acting_config = rollout_policy_config(
                policy_cls, policy_config, seed, self.worker_index
            )
            self.policy = policy_cls(self.observation_space, self.action_space, acting_config)
            self.policy.act_with_xla(self.num_envs)  # every step acts on <= num_envs rows
            self._initial_state = self.policy.get_initial_state()
        else:
            self.policy = None
            self._check_remote_spaces(call_retrying_once(policy_actor.get_spaces))
            self._initial_state = call_retrying_once(policy_actor.get_initial_state)
        self._weights_version = 0
        self._num_grad_updates: int | None = None  # synced with the weights; batches name it
        self._env_actions_rule = EnvActionRule.of(  # an unsupported leaf is named here, once
            self.action_space, config_for(policy_cls, policy_config)
        )
        self._id_rng = np.random.default_rng()  # episode ids: unique, not reproducible
        self._next_unroll_id = self.worker_index * _UNROLL_IDS_PER_WORKER
        self._started = False
        self._carried: dict | None = None  # rows of a last step past a fragment: the next's
        # config.output: this worker's own writer of what it acts on (offline/output.py)
        self._output = ExperienceOutput.from_config(config_for(policy_cls, policy_config))

    # ----- public API --------------------------------------------------------------

    def sample(self) -> tuple[SampleBatch, dict]:
        """One fragment: every chunk postprocessed, then concatenated -> (batch, metrics):
        counts and times are Stats with the rule that combines workers' fragments
        (`fragment_metrics` gives one fragment's values), episodes are lists."""
        start = time.perf_counter()
        if not self._started:
            self._reset_all()
        self._unroll_ids = self._next_unroll_id + np.arange(self.num_envs, dtype=np.int64)
        self._next_unroll_id += self.num_envs
        self._timers = {"inference_time_s": 0.0, "env_time_s": 0.0}
        self._episode_returns: list[float] = []
        self._episode_lengths: list[int] = []
        self._custom_metrics: dict[str, list[float]] = {}
        self._hist_data: dict[str, list] = {}
        self._versions: set[int] = set()
        records, recorded = self._carried_records()
        target = self.rollout_fragment_length * self.num_envs
        while recorded < target:
            record = self._step()
            if record is not None:
                records.append(record)
                recorded += len(record[_ENV_INDEX])
        if recorded > target:  # a sub-env in its reset step recorded nothing earlier
            records[-1], self._carried = _split_rows(records[-1], recorded - target)
        postprocess_start = time.perf_counter()
        batch = concat_samples(self._postprocess(self._split_into_chunks(records)))
        batch.num_grad_updates = self._num_grad_updates
        if self._output is not None:
            space = self.observation_space
            self._output.write_one(batch, space, self.action_space, self.weights_version())
            batch.pop(SampleBatch.INFOS)  # kept for the files only
        metrics: dict[str, Any] = {
            "env_steps": Stat(batch.count, "sum"),
            "episode_returns": self._episode_returns,
            "episode_lengths": self._episode_lengths,
            "num_episodes": Stat(len(self._episode_returns), "sum"),
            # the oldest version that acted: what max_policy_lag judges a fragment by
            "weights_version": Stat(
                self.weights_version()
                if self._policy_actor is None
                else min(self._versions, default=None),
                "min",
            ),
            "worker_index": self.worker_index,
            "sample_time_s": Stat(time.perf_counter() - start, "max"),  # the slowest worker's
            "postprocess_time_s": Stat(time.perf_counter() - postprocess_start, "sum"),
            **{timer: Stat(seconds, "sum") for timer, seconds in self._timers.items()},
        }
        if self._policy_actor is not None:
            metrics["weights_versions"] = sorted(self._versions)
        if self.callbacks.members:
            metrics["callbacks"] = end_fragment(
                self.callbacks,
                self,
                batch,
                self.metrics_logger,
                self._custom_metrics,
                self._hist_data,
            )
        return batch, metrics

    def _carried_records(self) -> tuple[list[dict], int]:
        """The rows the last fragment's final step recorded past its size, first in this
        fragment (under its unroll ids), so a fragment is exactly its size."""
        carried, self._carried = self._carried, None
        if carried is None:
            return [], 0
        carried[SampleBatch.UNROLL_ID] = self._unroll_ids[carried[_ENV_INDEX]]
        return [carried], len(carried[_ENV_INDEX])

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
        self._policy_actor = actor

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
        self._venv.close()
        if self._output is not None:
            self._output.close()

    # ----- stepping ----------------------------------------------------------------

    def _reset_all(self) -> None:
        n = self.num_envs
        seed = None if self._seed is None else self._seed + self.worker_index * n
        if seed is not None:
            self._venv.action_space.seed(seed)
        obs, _ = self._venv.reset(seed=seed)
        self._check_observations(obs)
        self._obs = self.observation_filter(obs)
        self._needs_reset = np.zeros(n, bool)
        self._eps_id = self._new_episode_ids(n)
        self._t = np.zeros(n, np.int64)
        self._episode_return = np.zeros(n, np.float64)
        self._episode_length = np.zeros(n, np.int64)
        self._states = [np.repeat(s[None], n, axis=0) for s in self._initial_state]
        self._prev_actions = spaces.zero_actions(self.action_space, n)
        self._prev_rewards = np.zeros(n, np.float32)
        # Action given to sub-envs in their reset step (ignored by them).
        self._env_actions = tree.map_structure(np.asarray, self._venv.action_space.sample())
        self._started = True
        if self._episode_hooks:
            self._begin_episodes(np.arange(n))

    def _step(self) -> dict | None:
        """One vector step -> the recorded transitions (None if every sub-env was resetting)."""
        acting = np.flatnonzero(~self._needs_reset)
        resetting = np.flatnonzero(self._needs_reset)
        acted = self._act(acting) if len(acting) else None
        env_actions = self._env_actions
        if acted is not None:
            actions = acted.actions
            actions = self._env_actions_rule.to_env(actions)  # normalize / clip_actions
            env_actions = _with_rows(env_actions, acting, actions)
        start = time.perf_counter()
        new_obs, rewards, terminateds, truncateds, infos = self._venv.step(env_actions)
        self._timers["env_time_s"] += time.perf_counter() - start
        self._check_observations(new_obs)
        new_obs = self.observation_filter(new_obs)
        self._env_actions = env_actions
        record = None
        if acted is not None:
            record = self._record(acted, new_obs, rewards, terminateds, truncateds)
            if self._output is not None:
                record[SampleBatch.INFOS] = infos_column(infos, acting, _sub_env_info)
            if self._episode_hooks:
                self._step_episodes(acted, new_obs, record, infos)
        if len(resetting):
            self._start_episodes(resetting)
        self._obs = new_obs
        if self._episode_hooks and len(resetting):
            self._begin_episodes(resetting)
        return record

    def _act(self, acting: np.ndarray) -> PolicyStep:
        """The policy's answer for the sub-envs `acting`, from their observations,
        recurrent states and previous actions and rewards."""
        obs = _take(self._obs, acting)
        states = [s[acting] for s in self._states]
        prev_actions, prev_rewards = _take(self._prev_actions, acting), self._prev_rewards[acting]
        start = time.perf_counter()
        if self._policy_actor is None:
            result = self.policy.compute_actions(obs, states or None, prev_actions, prev_rewards)
        else:
            result = call_retrying_once(  # once more if the actor died and was restarted
                self._policy_actor.compute_actions,
                obs,
                states or None,
                prev_action_batch=prev_actions,
                prev_reward_batch=prev_rewards,
            )
        self._timers["inference_time_s"] += time.perf_counter() - start
        actions, state_outs, extra = result
        extra = dict(extra)
        version = extra.pop(WEIGHTS_VERSION, None)
        if version is not None:
            self._versions.add(int(version))
        actions = tree.map_structure(np.asarray, actions)
        # every row carries the weights version that acted (the policy lag of async learners)
        acted = self._weights_version if version is None else int(version)
        extra[WEIGHTS_VERSION] = np.full(len(acting), acted, np.int64)
        return PolicyStep(
            acting,
            obs,
            states,
            prev_actions,
            prev_rewards,
            actions,
            [np.asarray(s) for s in state_outs],
            extra,
        )

    def _record(self, acted: PolicyStep, new_obs, rewards, terminateds, truncateds) -> dict:
        """The acting sub-envs' transitions as columns; advances their episodes."""
        acting, actions, state_outs = acted.acting, acted.actions, acted.state_outs
        rewards = np.asarray(rewards, np.float32)[acting]
        terminateds = np.asarray(terminateds, bool)[acting]
        truncateds = np.asarray(truncateds, bool)[acting]
        record = {
            SampleBatch.OBS: acted.obs,
            SampleBatch.NEXT_OBS: _take(new_obs, acting),
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: rewards,
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: truncateds,
            SampleBatch.EPS_ID: self._eps_id[acting],
            SampleBatch.T: self._t[acting],
            SampleBatch.UNROLL_ID: self._unroll_ids[acting],
            SampleBatch.AGENT_INDEX: np.zeros(len(acting), np.int64),
            SampleBatch.PREV_ACTIONS: acted.prev_actions,
            SampleBatch.PREV_REWARDS: acted.prev_rewards,
            _ENV_INDEX: acting,
            **acted.extra,
        }
        for i, (state_in, state_out) in enumerate(zip(acted.states, state_outs)):
            record[f"state_in_{i}"] = state_in
            record[f"state_out_{i}"] = state_out
        # New arrays, never in-place updates: recorded arrays must not change later.
        self._t = _with_rows(self._t, acting, self._t[acting] + 1)
        self._episode_return = _with_rows(
            self._episode_return, acting, self._episode_return[acting] + rewards
        )
        self._episode_length = _with_rows(
            self._episode_length, acting, self._episode_length[acting] + 1
        )
        self._states = [_with_rows(s, acting, out) for s, out in zip(self._states, state_outs)]
        self._prev_actions = _with_rows(self._prev_actions, acting, actions)
        self._prev_rewards = _with_rows(self._prev_rewards, acting, rewards)
        finished = acting[terminateds | truncateds]
        self._episode_returns.extend(self._episode_return[finished].tolist())
        self._episode_lengths.extend(self._episode_length[finished].tolist())
        self._needs_reset = _with_rows(self._needs_reset, finished, True)
        return record

    def _start_episodes(self, envs: np.ndarray) -> None:
        """Sub-envs whose reset step just ran begin a new episode."""
        self._eps_id = _with_rows(self._eps_id, envs, self._new_episode_ids(len(envs)))
        self._t = _with_rows(self._t, envs, 0)
        self._episode_return = _with_rows(self._episode_return, envs, 0.0)
        self._episode_length = _with_rows(self._episode_length, envs, 0)
        self._states = [
            _with_rows(s, envs, init[None]) for s, init in zip(self._states, self._initial_state)
        ]
        self._prev_actions = _with_rows(self._prev_actions, envs, 0)
        self._prev_rewards = _with_rows(self._prev_rewards, envs, 0.0)
        self._needs_reset = _with_rows(self._needs_reset, envs, False)

    # ----- episode hooks (only with callbacks that override one) -------------------

    def _hook_arguments(self) -> dict:
        return {
            "worker": self,
            "env_runner": self,
            "base_env": self._venv,
            "env": self._venv,
            "policies": {"default_policy": self.policy},
            "metrics_logger": self.metrics_logger,
        }

    def _begin_episodes(self, envs: np.ndarray) -> None:
        """Episode objects for sub-envs `envs`, whose first observation is in self._obs."""
        for env_index in envs.tolist():
            episode = Episode(self._eps_id[env_index], env_index, _take(self._obs, env_index))
            self._episodes[env_index] = episode
            self.callbacks.call(
                "on_episode_start", episode=episode, env_index=env_index, **self._hook_arguments()
            )

    def _step_episodes(self, acted: PolicyStep, new_obs, record: dict, infos: dict) -> None:
        """The acting sub-envs' episodes take their step; the finished ones end."""
        arguments = self._hook_arguments()
        for row, env_index in enumerate(acted.acting.tolist()):
            episode = self._episodes[env_index]
            assert episode is not None  # begun at the reset that started it
            episode.step(
                _take(new_obs, env_index),
                _take(acted.actions, row),
                record[SampleBatch.REWARDS][row],
                _sub_env_info(infos, env_index),
            )
            self.callbacks.call(
                "on_episode_step", episode=episode, env_index=env_index, **arguments
            )
            if record[SampleBatch.TERMINATEDS][row] or record[SampleBatch.TRUNCATEDS][row]:
                self.callbacks.call(
                    "on_episode_end", episode=episode, env_index=env_index, **arguments
                )
                gather_episode(episode, self._custom_metrics, self._hist_data)
                self._episodes[env_index] = None

    def _new_episode_ids(self, count: int) -> np.ndarray:
        return self._id_rng.integers(0, 2**62, size=count, dtype=np.int64)

    # ----- chunks and postprocessing ------------------------------------------------

    def _split_into_chunks(self, records: list[dict]) -> list[SampleBatch]:
        """Rows of one sub-env and one episode each, in time order."""
        columns = {
            key: tree.map_structure(
                lambda *parts: np.concatenate(parts, axis=0), *[r[key] for r in records]
            )
            for key in records[0]
        }
        env_index = columns.pop(_ENV_INDEX)
        chunks = []
        for i in range(self.num_envs):
            rows = np.flatnonzero(env_index == i)
            if len(rows):
                env_rows = SampleBatch({k: _take(v, rows) for k, v in columns.items()})
                chunks.extend(env_rows.split_by_episode(SampleBatch.EPS_ID))
        return chunks

    def _postprocess(self, chunks: list[SampleBatch]) -> list[SampleBatch]:
        if self._policy_actor is not None:
            done = call_retrying_once(self._policy_actor.postprocess_trajectories, chunks)
        else:
            done = [self.policy.postprocess_trajectory(chunk) for chunk in chunks]
        if self.callbacks.overrides("on_postprocess_trajectory"):
            for original, chunk in zip(chunks, done):
                self.callbacks.call(
                    "on_postprocess_trajectory",
                    postprocessed_batch=chunk,
                    original_batches={"default_policy": original},
                    episode=None,
                    agent_id=0,
                    policy_id="default_policy",
                    **self._hook_arguments(),
                )
        return done

    # ----- checks ------------------------------------------------------------------

    def _check_observations(self, obs) -> None:
        if self._venv.observation_space.contains(obs):
            return
        for i in range(self.num_envs):
            one = _take(obs, i)
            if not self.observation_space.contains(one):
                raise ValueError(
                    f"env {self.env_name!r} (worker {self.worker_index}, sub-env {i}) returned "
                    f"an observation outside its observation space {self.observation_space}: "
                    f"{_short_repr(one)}"
                )
        raise ValueError(
            f"env {self.env_name!r} (worker {self.worker_index}) returned "
            f"observations outside {self._venv.observation_space}: "
            f"{_short_repr(obs)}"
        )

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


def _sub_env_info(infos: dict, env_index: int) -> dict:
    """One sub-env's entries of a vector env's infos (gymnasium marks which sub-envs
    set a key with a boolean array under "_key")."""
    info = {}
    for key, values in infos.items():
        if key.startswith("_"):
            continue
        present = infos.get(f"_{key}")
        if present is None or present[env_index]:
            info[key] = (
                _sub_env_info(values, env_index) if isinstance(values, dict) else values[env_index]
            )
    return info


def _split_rows(record: dict, last: int) -> tuple[dict, dict]:
    """A step's record -> (all but its `last` rows, those rows)."""
    keep = len(record[_ENV_INDEX]) - last
    return (
        {k: tree.map_structure(lambda x: np.asarray(x)[:keep], v) for k, v in record.items()},
        {k: tree.map_structure(lambda x: np.asarray(x)[keep:], v) for k, v in record.items()},
    )


def _take(value, index):
    """Rows `index` (an int or an index array) of a possibly nested batch."""
    return tree.map_structure(lambda x: np.asarray(x)[index], value)


def _with_rows(array, rows: np.ndarray, values):
    """A copy of `array` (or of each leaf of a nest of arrays) with `rows` replaced
    by `values` (a nest like it, or one value for every leaf)."""
    if not isinstance(array, np.ndarray):
        if not tree.is_nested(values):
            values = tree.map_structure(lambda _: values, array)
        return tree.map_structure(lambda a, v: _with_rows(a, rows, v), array, values)
    out = array.copy()
    out[rows] = values
    return out


def _short_repr(value) -> str:
    text = str(
        tree.map_structure(
            lambda x: np.array2string(np.asarray(x), threshold=20, precision=4), value
        )
    )
    return text if len(text) <= 400 else text[:400] + "..."
