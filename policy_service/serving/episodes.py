"""EpisodeRecorder: external clients' episodes -> postprocessed fragments, as env runners make them.

The loop it lives in (the training server's replica; the driver takes fragments):

    recorder = EpisodeRecorder(host, episode_timeout_s=60)
    eid = recorder.start()
    action, version = await recorder.act(eid, obs)        # or log_action(eid, obs, action)
    recorder.log_returns(eid, 1.0)
    await recorder.end(eid, last_obs, truncated=False)
    batch, metrics = await recorder.take(min_rows=4000, wait_s=1.0)   # or None

A step is recorded when its action is chosen (extra_action_out, state_out, the weights
version) and completed by the next observation, or by `end`: its new_obs, the rewards
logged in between, terminated (an end) or truncated (an end with truncated, or the
client gone for `episode_timeout_s`: the step without an outcome is dropped and the one
before is marked truncated). `take` hands out every completed step: each episode's
rows are one chunk with a new unroll_id, put through `policy.postprocess_trajectory`
(which bootstraps unless the chunk ends in a termination), as RolloutWorker does.
Actions a client chose itself get the acting columns of these weights, their log-
likelihood included. One asyncio loop; a lock per episode orders its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tree

from policy_service.data import nests, spaces
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.policy_actor import WEIGHTS_VERSION
from policy_service.serving.episode_api import EpisodeUpload
from policy_service.serving.http_api import HttpError

_LOGP_COLUMNS = (SampleBatch.ACTION_LOGP, SampleBatch.ACTION_PROB)


@dataclass
class Episode:
    """One client episode: steps completed but not yet taken, and the step awaiting its outcome."""

    eps_id: int
    state: list  # k x <float32>[1, ...]: the next step's state_in
    prev_action: np.ndarray  # [1, ...]
    prev_reward: np.ndarray  # <float32>[1]
    last_seen: float
    rows: list = field(default_factory=list)  # completed steps, each a dict of [1, ...] columns
    pending: dict | None = None  # the last step's columns, until its next obs arrives
    pending_reward: float = 0.0
    t: int = 0
    episode_return: float = 0.0
    length: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EpisodeRecorder:
    """Client episodes acted on (or logged) through a PolicyHost, and their fragments."""

    def __init__(
        self, host, episode_timeout_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ):
        self.host = host
        self.episode_timeout_s = float(episode_timeout_s)
        self._clock = clock  # what idleness is measured with (a test's own clock)
        self._open: dict[str, Episode] = {}
        self._closed: list[Episode] = []  # ended, with rows not taken yet
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._num_timed_out = 0
        self._ready_rows = 0
        self._row_added = asyncio.Event()
        self._next_unroll_id = 0
        self._id_rng = np.random.default_rng()
        self._action_dtype, self._action_shape = spaces.action_dtype_and_shape(
            host.policy.action_space
        )
        self._initial_state = host.policy.get_initial_state()
        # as env runners send (env_actions.py)
        self._env_actions_rule = EnvActionRule.of(
            host.policy.action_space, getattr(host.policy, "config", None)
        )

    # ----- the protocol --------------------------------------------------------------

    def start(self, episode_id: str | None = None) -> str:
        """A new episode -> its id (the client's, if it chose one not in use)."""
        if episode_id is None:
            episode_id = secrets.token_hex(8)
        elif episode_id in self._open:
            raise HttpError(409, f"episode_id: expected a new id, got {episode_id!r} (open)")
        self._open[episode_id] = Episode(
            eps_id=int(self._id_rng.integers(0, 2**62)),
            state=[s[None] for s in self._initial_state],
            prev_action=np.zeros((1, *self._action_shape), self._action_dtype),
            prev_reward=np.zeros(1, np.float32),
            last_seen=self._clock(),
        )
        return episode_id

    async def act(self, episode_id: str, obs) -> tuple[np.ndarray, int]:
        """The policy's action for one observation (a batch of one row) -> (action, version):
        recorded as sampled, handed out as env runners send it to their envs
        (normalize_actions, clip_actions: data/env_actions.py)."""
        async with self._locked(episode_id) as episode:
            actions, version = await self._record_steps(episode, obs, None)
        actions = self._env_actions_rule.to_env(actions)
        return actions[0], version

    async def log_action(self, episode_id: str, obs, action: np.ndarray) -> None:
        """A step whose action the client chose (action: [1, ...], in the env's units;
        recorded in the policy's, as a sampled one is: normalize_actions)."""
        async with self._locked(episode_id) as episode:
            await self._record_steps(episode, obs, self._env_actions_rule.from_env(action))

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Reward for the last action (summed when logged more than once)."""
        episode = self._episode(episode_id)
        if episode.pending is None:
            raise HttpError(
                400,
                f"log_returns: expected an action (action or log_action) first in episode "
                f"{episode_id!r}, got none",
            )
        episode.pending_reward += reward

    async def end(self, episode_id: str, obs, truncated: bool = False) -> None:
        """The episode's last observation: terminated, or truncated (it bootstraps)."""
        async with self._locked(episode_id) as episode:
            self._complete(episode, obs, terminated=not truncated, truncated=truncated)
            self._close(episode_id, episode, finished=True)

    async def upload(self, uploads: list[EpisodeUpload]) -> None:
        """A local-mode client's logged steps, as log_action/log_returns/end would record
        them; every episode id is checked before any step is recorded."""
        for u in uploads:
            if u.start and u.episode_id in self._open:
                raise HttpError(409, f"episode_id: expected a new id, got {u.episode_id!r} (open)")
            if not u.start:
                self._episode(u.episode_id)
        for u in uploads:
            if u.start:
                self.start(u.episode_id)
        await asyncio.gather(*(self._upload_one(u) for u in uploads))

    async def _upload_one(self, u: EpisodeUpload) -> None:
        async with self._locked(u.episode_id) as episode:
            if len(u.rewards):
                await self._record_steps(episode, u.obs, u.actions, u.rewards)
            if u.end_obs is not None:
                self._complete(
                    episode, u.end_obs, terminated=not u.truncated, truncated=u.truncated
                )
                self._close(u.episode_id, episode, finished=True)

    # ----- fragments -----------------------------------------------------------------

    async def take(self, min_rows: int, wait_s: float) -> tuple[SampleBatch, dict] | None:
        """Every completed step, postprocessed per episode chunk -> (batch, metrics), once
        at least min_rows are ready; None if that takes longer than wait_s. Episodes idle
        for episode_timeout_s are closed as truncated first."""
        start = time.perf_counter()
        self.close_idle()
        deadline = time.monotonic() + wait_s
        while self._ready_rows < min_rows:
            self._row_added.clear()
            try:
                await asyncio.wait_for(self._row_added.wait(), deadline - time.monotonic())
            except TimeoutError:
                return None
        episodes = [e for e in (*self._open.values(), *self._closed) if e.rows]
        chunks, versions = [], []
        for episode in episodes:
            chunk, chunk_versions = self._chunk(episode)
            chunks.append(chunk)
            versions += chunk_versions
        self._closed, self._ready_rows = [], 0
        postprocess_start = time.perf_counter()
        batch = concat_samples(await self.host.postprocess_trajectories(chunks))
        metrics = {
            "env_steps": batch.count,
            "episode_returns": self._returns,
            "episode_lengths": self._lengths,
            "num_episodes": len(self._returns),
            "num_episodes_timed_out": self._num_timed_out,
            "weights_version": min(versions) if versions else None,
            "worker_index": 0,
            "sample_time_s": time.perf_counter() - start,
            "postprocess_time_s": time.perf_counter() - postprocess_start,
        }
        self._returns, self._lengths, self._num_timed_out = [], [], 0
        return batch, metrics

    def close_idle(self) -> int:
        """Close the episodes no call reached for episode_timeout_s, as truncated -> how many."""
        cutoff = self._clock() - self.episode_timeout_s
        idle = [
            (i, e) for i, e in self._open.items() if e.last_seen < cutoff and not e.lock.locked()
        ]
        for episode_id, episode in idle:
            episode.pending = None  # an action whose outcome never came
            if episode.rows:
                episode.rows[-1][SampleBatch.TRUNCATEDS] = np.ones(1, bool)
            self._close(episode_id, episode, finished=False)
        self._num_timed_out += len(idle)
        return len(idle)

    @property
    def num_open(self) -> int:
        return len(self._open)

    # ----- steps ---------------------------------------------------------------------

    def _episode(self, episode_id: str) -> Episode:
        episode = self._open.get(episode_id)
        if episode is None:
            raise self._not_open(episode_id)
        episode.last_seen = self._clock()
        return episode

    def _not_open(self, episode_id: str) -> HttpError:
        return HttpError(
            404,
            f"episode_id: expected an open episode, got {episode_id!r} (never started, "
            f"ended, or closed after {self.episode_timeout_s:g} s without a call)",
        )

    @contextlib.asynccontextmanager
    async def _locked(self, episode_id: str) -> AsyncIterator[Episode]:
        """The open episode, its calls one at a time (one that waited finds it still open)."""
        episode = self._episode(episode_id)
        async with episode.lock:
            if self._open.get(episode_id) is not episode:
                raise self._not_open(episode_id)  # closed while this call waited
            yield episode

    async def _record_steps(
        self, episode: Episode, obs, logged: np.ndarray | None, rewards: np.ndarray | None = None
    ) -> tuple[np.ndarray, int]:
        """Act on (or log) T consecutive steps of one episode -> (actions [T], version).
        With `rewards`, every step but the last is completed by the next row's obs.
        A recurrent policy goes one row at a time (each state_in is the last state_out)."""
        num_rows = len(logged) if logged is not None else 1
        step = 1 if self.host.policy.is_recurrent() else num_rows
        all_actions, version = [], 0
        for begin in range(0, num_rows, step):
            part_obs = nests.row_range(obs, begin, begin + step)
            part_logged = None if logged is None else logged[begin : begin + step]
            part_rewards = None if rewards is None else rewards[begin : begin + step]
            actions, version = await self._act_on_rows(episode, part_obs, part_logged, part_rewards)
            all_actions.append(actions)
        return nests.join_rows(all_actions), version

    async def _act_on_rows(self, episode, obs, logged, rewards) -> tuple[np.ndarray, int]:
        num_rows = int(tree.flatten(obs)[0].shape[0])
        self._complete(episode, _row(obs, 0), terminated=False, truncated=False)
        prev_actions, prev_rewards = episode.prev_action, episode.prev_reward
        if logged is not None and num_rows > 1:  # rows known ahead: the previous ones shifted
            prev_actions = np.concatenate([prev_actions, logged[:-1]])
            prev_rewards = np.concatenate([prev_rewards, rewards[:-1]])
        states = episode.state or None
        actions, state_outs, extra = await self.host.compute_actions(
            obs, states, prev_action_batch=prev_actions, prev_reward_batch=prev_rewards
        )
        extra = dict(extra)
        version = int(extra.pop(WEIGHTS_VERSION))
        if logged is not None:
            actions = logged
            if any(c in extra for c in _LOGP_COLUMNS):
                logp = await self.host.log_likelihoods(
                    logged, obs, states, prev_actions, prev_rewards
                )
                extra[SampleBatch.ACTION_LOGP] = np.asarray(logp, np.float32)
                if SampleBatch.ACTION_PROB in extra:
                    extra[SampleBatch.ACTION_PROB] = np.exp(logp).astype(np.float32)
        for i in range(num_rows):
            if i:  # a logged run: row i's obs completes row i - 1
                self._complete(episode, _row(obs, i), terminated=False, truncated=False)
            row = slice(i, i + 1)
            episode.pending = {
                SampleBatch.OBS: _row(obs, i),
                SampleBatch.ACTIONS: np.asarray(actions)[row],
                SampleBatch.EPS_ID: np.array([episode.eps_id], np.int64),
                SampleBatch.T: np.array([episode.t], np.int64),
                SampleBatch.AGENT_INDEX: np.zeros(1, np.int64),
                SampleBatch.PREV_ACTIONS: prev_actions[row],
                SampleBatch.PREV_REWARDS: prev_rewards[row],
                **{k: v[row] for k, v in extra.items()},
                **{f"state_in_{j}": s[row] for j, s in enumerate(states or [])},
                **{f"state_out_{j}": np.asarray(s)[row] for j, s in enumerate(state_outs)},
                # the weights version that acted, a column as the env runners' rows carry it
                WEIGHTS_VERSION: np.array([version], np.int64),
                "_version": version,
            }
            episode.pending_reward = 0.0 if rewards is None else float(rewards[i])
            episode.t += 1
        episode.state = [np.asarray(s)[-1:] for s in state_outs]
        episode.prev_action = np.asarray(actions)[-1:]
        return np.asarray(actions), version

    def _complete(self, episode: Episode, new_obs, terminated: bool, truncated: bool) -> None:
        """The pending step's outcome: its next observation, reward and done flags."""
        pending = episode.pending
        if pending is None:
            return
        reward = np.array([episode.pending_reward], np.float32)
        pending[SampleBatch.NEXT_OBS] = new_obs
        pending[SampleBatch.REWARDS] = reward
        pending[SampleBatch.TERMINATEDS] = np.array([terminated])
        pending[SampleBatch.TRUNCATEDS] = np.array([truncated])
        episode.rows.append(pending)
        episode.pending, episode.pending_reward = None, 0.0
        episode.prev_reward = reward
        episode.episode_return += float(reward[0])
        episode.length += 1
        self._ready_rows += 1
        self._row_added.set()

    def _close(self, episode_id: str, episode: Episode, finished: bool) -> None:
        del self._open[episode_id]
        if finished and episode.length:
            self._returns.append(episode.episode_return)
            self._lengths.append(episode.length)
        if episode.rows:
            self._closed.append(episode)

    def _chunk(self, episode: Episode) -> tuple[SampleBatch, list[int]]:
        """The episode's completed rows as one chunk (a new unroll_id), and the weights
        versions that acted in them."""
        rows, episode.rows = episode.rows, []
        versions = [r.pop("_version") for r in rows]
        columns = {
            key: nests.map_arrays(lambda *parts: np.concatenate(parts), *[r[key] for r in rows])
            for key in rows[0]
        }
        columns[SampleBatch.UNROLL_ID] = np.full(len(rows), self._next_unroll_id, np.int64)
        self._next_unroll_id += 1
        return SampleBatch(columns), versions


def _row(value: Any, i: int) -> Any:
    """Row i of a (possibly nested) batch, as a batch of one."""
    return nests.row_range(value, i, i + 1)
