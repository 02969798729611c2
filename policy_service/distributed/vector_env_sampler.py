"""VectorEnvSampler: steps a gymnasium vector env with one policy -> postprocessed fragments.

    sampler = VectorEnvSampler(venv, {"default_policy": policy}, rollout_fragment_length=128)
    batch, metrics = sampler.sample()   # SampleBatch, raw counts (the worker makes Stats)

The single-agent loop of a RolloutWorker, which holds the worker's role around it
(weights, output, callbacks' fragment end, Stats); shaped as MultiAgentSampler is: the
acting policies by id (one here, a TFPolicy copy or a ServedPolicy), `callbacks` and
`hook_arguments` the worker's. A fragment is exactly `rollout_fragment_length * num_envs`
transitions: a reset is a vector step that records nothing (gymnasium's NEXT_STEP
autoreset), so a last step may record rows past the fragment, which start the next one.
Each chunk (one sub-env, one episode, one fragment) is postprocessed by the policy.
Autoreset, fragments, the columns and the postprocessing contract in full:
docs/distributed.md, "RolloutWorker".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import tree

from policy_service.data import observation_filters, spaces
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.served_policy import WEIGHTS_VERSION, ServedPolicy
from policy_service.offline.output import infos_column
from policy_service.runs.callbacks import (
    EPISODE_HOOKS,
    CallbackList,
    Episode,
    gather_episode,
)

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


class VectorEnvSampler:
    """`venv`: a gymnasium vector env (NEXT_STEP autoreset). `policies`: {policy id: the
    acting policy}, one: a local copy (its weights version is `acting_version()`) or a
    ServedPolicy (the actor's version comes with each answer).

    seed: seeds the sub-envs (seed + worker_index * num_envs + i at the first reset).
    observation_filter: filters every observation the policy sees and rows carry.
    record_infos: rows carry each sub-env's info dict (SampleBatch.INFOS), for output.
    env_name: the env as errors name it.
    """

    def __init__(
        self,
        venv: gym.vector.VectorEnv,
        policies: Mapping[str, Any],
        *,
        rollout_fragment_length: int,
        acting_version: Callable[[], int],
        env_actions_rule: EnvActionRule,
        observation_filter: observation_filters.MeanStdFilter | observation_filters.NoFilter,
        worker_index: int = 0,
        seed: int | None = None,
        record_infos: bool = False,
        env_name: str = "env",
        callbacks: CallbackList | None = None,
        hook_arguments: dict | None = None,
    ) -> None:
        if len(policies) != 1:
            raise ValueError(
                f"a vector env acts with one policy, got {len(policies)}: {sorted(policies)}"
            )
        ((self.policy_id, self.policy),) = policies.items()
        self._venv = venv
        self.num_envs = venv.num_envs
        self.observation_space = venv.single_observation_space
        self.action_space = venv.single_action_space
        self.rollout_fragment_length = int(rollout_fragment_length)
        self._acting_version = acting_version
        self._env_actions_rule = env_actions_rule
        self.observation_filter = observation_filter
        self.worker_index = int(worker_index)
        self._seed = seed
        self._record_infos = record_infos
        self.env_name = env_name
        self.callbacks = callbacks if callbacks is not None else CallbackList()
        self.hook_arguments = dict(hook_arguments or {})
        # episode objects are kept only for hooks that read them
        self._episode_hooks = any(map(self.callbacks.overrides, EPISODE_HOOKS))
        self._episodes: list[Episode | None] = [None] * self.num_envs
        self._initial_state = [np.asarray(s) for s in self.policy.get_initial_state()]
        self._id_rng = np.random.default_rng()  # episode ids: unique, not reproducible
        self._next_unroll_id = self.worker_index * _UNROLL_IDS_PER_WORKER
        self._started = False
        self._carried: dict | None = None  # rows of a last step past a fragment: the next's

    def sample(self) -> tuple[SampleBatch, dict]:
        """One fragment: every chunk postprocessed, then concatenated -> (batch, metrics:
        episode_returns, episode_lengths, versions (the served versions that acted),
        inference_time_s, env_time_s, postprocess_time_s, and with callbacks
        custom_metrics and hist_data)."""
        if not self._started:
            self._reset_all()
        n = self.num_envs
        self._unroll_ids = self._next_unroll_id + np.arange(n, dtype=np.int64)
        self._next_unroll_id += n
        self._timers = {"inference_time_s": 0.0, "env_time_s": 0.0}
        self._episode_returns: list[float] = []
        self._episode_lengths: list[int] = []
        self._custom_metrics: dict[str, list[float]] = {}
        self._hist_data: dict[str, list] = {}
        self._versions: set[int] = set()
        records, recorded = self._carried_records()
        target = self.rollout_fragment_length * n
        while recorded < target:
            record = self._step()
            if record is not None:
                records.append(record)
                recorded += len(record[_ENV_INDEX])
        if recorded > target:  # a sub-env in its reset step recorded nothing earlier
            records[-1], self._carried = _split_rows(records[-1], recorded - target)
        postprocess_start = time.perf_counter()
        batch = concat_samples(self._postprocess(self._split_into_chunks(records)))
        metrics = {
            "episode_returns": self._episode_returns,
            "episode_lengths": self._episode_lengths,
            "versions": self._versions,
            "postprocess_time_s": time.perf_counter() - postprocess_start,
            **self._timers,
        }
        if self.callbacks.members:
            metrics["custom_metrics"] = self._custom_metrics
            metrics["hist_data"] = self._hist_data
        return batch, metrics

    def close(self) -> None:
        self._venv.close()

    def _carried_records(self) -> tuple[list[dict], int]:
        """The rows the last fragment's final step recorded past its size, first in this
        fragment (under its unroll ids), so a fragment is exactly its size."""
        carried, self._carried = self._carried, None
        if carried is None:
            return [], 0
        carried[SampleBatch.UNROLL_ID] = self._unroll_ids[carried[_ENV_INDEX]]
        return [carried], len(carried[_ENV_INDEX])

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
            if self._record_infos:
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
        actions, state_outs, extra = self.policy.compute_actions(
            obs, states or None, prev_actions, prev_rewards
        )
        self._timers["inference_time_s"] += time.perf_counter() - start
        extra = dict(extra)
        # every row carries the weights version that acted (the policy lag of async learners)
        versions = extra.pop(WEIGHTS_VERSION, None)  # a served policy's, a column
        if versions is None:
            versions = np.full(len(acting), self._acting_version(), np.int64)
        else:
            self._versions.add(int(versions[0]))
        extra[WEIGHTS_VERSION] = versions
        actions = tree.map_structure(np.asarray, actions)
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

    def _new_episode_ids(self, count: int) -> np.ndarray:
        return self._id_rng.integers(0, 2**62, size=count, dtype=np.int64)

    # ----- episode hooks (only with callbacks that override one) -------------------

    def _hook_arguments(self) -> dict:
        return {**self.hook_arguments, "base_env": self._venv, "env": self._venv}

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
        if isinstance(self.policy, ServedPolicy):
            done = self.policy.postprocess_trajectories(chunks)
        else:  # chunk by chunk: a policy's batched postprocessing would change its floats
            done = [self.policy.postprocess_trajectory(chunk) for chunk in chunks]
        if self.callbacks.overrides("on_postprocess_trajectory"):
            for original, chunk in zip(chunks, done):
                self.callbacks.call(
                    "on_postprocess_trajectory",
                    postprocessed_batch=chunk,
                    original_batches={self.policy_id: original},
                    episode=None,
                    agent_id=0,
                    policy_id=self.policy_id,
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
