"""MultiAgentSampler: steps copies of a MultiAgentEnv with a policy per agent (by the
mapping), builds each agent's trajectory separately and postprocesses it with its own
policy.

The agents in an obs dict act; an agent's row closes when its next obs arrives (its
rewards summed until then, so turn-based agents are paid for their own moves), or when
the episode ends. A reward before an agent's first obs (or after its end) trains no row
and counts in the episode's totals (RLlib's rule: docs/multi_agent.md, "Sampling").
Each chunk (one agent, one episode, one fragment) goes through its policy's
`postprocess_trajectories` (all of a policy's chunks at once), as a single-agent
fragment's chunks do, so an agent's advantages use only its own rewards and values. A
fragment is `rollout_fragment_length` steps of every sub-env (a reset is not a step);
open trajectories are cut there and bootstrapped, and a row whose agent still waits for
its next obs carries over into the next fragment.

The sub-envs step in lockstep. Each (sub-env, agent) pair is a slot, and what the
sampler keeps of an agent (its open row, the rewards paid to it, its step count, its
previous action and reward) lives in arrays indexed by slot: a vector step is one
`compute_actions` per policy for that policy's agents of all sub-envs, whose arrays are
kept as they are until the fragment ends, and a few array operations, not Python work
per agent and row. A policy's rows come out in the single-agent order: by sub-env,
then episode (in time), then agent, each chunk in time order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tree

from policy_service.config import config_for
from policy_service.data import spaces
from policy_service.data.env_actions import EnvActionRule
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.env import ALL, MultiAgentEnv, MultiAgentEnvError, checked_step
from policy_service.multi_agent.policies import AgentPolicies
from policy_service.runs.callbacks import gather_episode

# bookkeeping columns of the rows closed in a step (never in a returned batch)
_ROW, _SLOT, _EPISODE, _CHUNK, _HAS_NEXT = "row", "slot", "episode", "chunk", "has_next_obs"


@dataclass
class Episode:
    """One episode's bookkeeping; `policy_mapping_fn` gets it as `episode` (RLlib: `id_`),
    and so do the callbacks' episode hooks (policy_service/runs/callbacks.py), which may write
    `custom_metrics`, `user_data` and `hist_data`. The sampler keeps `agent_returns`
    current for every hook, every mapping and at the episode's end (between them, in its
    arrays)."""

    id_: int
    env_index: int = 0
    policy_of: dict = field(default_factory=dict)  # agent -> policy id, mapped on first sight
    agent_returns: dict = field(default_factory=lambda: defaultdict(float))
    length: int = 0
    last_obs: dict = field(default_factory=dict)  # agent -> its newest observation
    last_rewards: dict = field(default_factory=dict)  # agent -> its reward of the last step
    last_infos: dict = field(default_factory=dict)
    custom_metrics: dict = field(default_factory=dict)
    user_data: dict = field(default_factory=dict)
    hist_data: dict = field(default_factory=dict)

    @property
    def episode_id(self) -> int:
        return self.id_

    @property
    def total_reward(self) -> float:
        return float(sum(self.agent_returns.values()))


@dataclass
class _Fragment:
    """What one sample() gathers from every sub-env's finished episodes."""

    returns: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    policy_returns: dict = field(default_factory=lambda: defaultdict(list))
    custom_metrics: dict = field(default_factory=dict)  # key -> values (callbacks)
    hist_data: dict = field(default_factory=dict)


@dataclass
class _StepFlags:
    """One vector step's env results by slot: which agents got an obs, their done flags
    (each agent's or "__all__"'s) and which sub-envs' episodes ended."""

    has_obs: np.ndarray  # <bool>[slots]
    terminated: np.ndarray  # <bool>[slots]
    truncated: np.ndarray  # <bool>[slots]
    over: list[bool]  # by sub-env
    over_slots: list[int]  # the slots of the sub-envs whose episode ended


class _PolicyRows:
    """One policy's rows of the fragment being sampled: the arrays each acting call gave
    (rows numbered in order) and, per step, the columns of the rows that closed (each
    naming its acted row, slot and chunk) with the next obs the env gave them."""

    def __init__(self) -> None:
        self.acted: list[dict] = []
        self.num_acted = 0
        self.closed: list[dict] = []
        self.next_obs: list = []

    def add_acted(self, columns: dict, count: int) -> np.ndarray:
        """-> the new rows' numbers."""
        numbers = np.arange(self.num_acted, self.num_acted + count)
        self.acted.append(columns)
        self.num_acted += count
        return numbers

    def add_closed(self, columns: dict, next_obs) -> None:
        self.closed.append(columns)
        if next_obs is not None:
            self.next_obs.append(next_obs)

    def take(self, still_open: np.ndarray) -> tuple[dict | None, dict | None, Any]:
        """-> (acted columns, closed columns, next obs given), each joined over the
        fragment's steps (None: no such rows); the acted rows `still_open` (numbers) are
        kept, numbered 0, 1, ... in that order, to close in the next fragment."""
        if not self.acted:
            return None, None, None
        acted = _joined(self.acted)
        closed = _joined(self.closed) if self.closed else None
        next_obs = _joined_leaves(self.next_obs) if self.next_obs else None
        self.acted = [_take(acted, still_open)] if len(still_open) else []
        self.num_acted, self.closed, self.next_obs = len(still_open), [], []
        return acted, closed, next_obs


class MultiAgentSampler:
    """`env`: one MultiAgentEnv or a sequence of copies (sub-envs). `policies`: id -> an
    acting policy (its weights set by the caller): a TFPolicy built here, or one served
    elsewhere with the same `compute_actions` and `postprocess_trajectories` (a
    fragment's chunks of that policy, together). `callbacks` (a CallbackList) and
    `hook_arguments` (what its episode hooks get beside the episode) are the worker's."""

    callbacks: Any = None
    hook_arguments: dict = {}

    def __init__(
        self,
        env: MultiAgentEnv | Sequence[MultiAgentEnv],
        agent_policies: AgentPolicies,
        policies: Mapping[str, Any],
        rollout_fragment_length: int,
        seed: int | None = None,
    ) -> None:
        for policy_id, policy in policies.items():
            if policy.is_recurrent():
                raise MultiAgentEnvError(
                    f"policy {policy_id!r}: multi-agent sampling takes no recurrent policy yet"
                )
        envs = list(env) if isinstance(env, Sequence) else [env]
        self.envs, self.agent_policies, self.policies = envs, agent_policies, policies
        self.rollout_fragment_length = rollout_fragment_length
        self.agents = list(envs[0].possible_agents)
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._policy_ids = list(policies)
        self._policy_index = {policy_id: i for i, policy_id in enumerate(self._policy_ids)}
        num_slots = len(envs) * len(self.agents)
        self._slot_env = np.repeat(np.arange(len(envs)), len(self.agents))
        self._slot_agent_index = np.tile(np.arange(len(self.agents), dtype=np.int64), len(envs))
        # each slot's state; a sub-env's slots are reset when its episode starts
        self._policy = np.full(num_slots, -1)  # its policy's index in this episode (-1: none)
        self._open = np.zeros(num_slots, bool)  # an acted row awaits the agent's next obs
        self._open_row = np.zeros(num_slots, np.int64)  # that row's number in its policy's rows
        self._reward = np.zeros(num_slots)  # paid to the open row so far
        self._t = np.zeros(num_slots, np.int64)  # the agent's rows so far in its episode
        self._return = np.zeros(num_slots)  # the agent's episode return
        # each sub-env's agents paid in its episode -> their slots, in the order first paid
        self._paid_first: list[dict] = [{} for _ in envs]
        self._slot_of = [  # each sub-env's agents -> their slots
            {agent: i * len(self.agents) + j for j, agent in enumerate(self.agents)}
            for i in range(len(envs))
        ]
        self._chunk = np.full(num_slots, -1)  # its chunk in this fragment (-1: no row yet)
        self._prev_reward = np.zeros(num_slots)
        action_spaces = agent_policies.spaces()[1]
        # an agent's previous action before its first: its policy's action space's zero
        self._prev_action = [
            np.asarray(spaces.zero_actions(action_spaces[p], num_slots)) for p in self._policy_ids
        ]
        self._action = [np.array(zeros) for zeros in self._prev_action]  # the open row's
        self._eps_id = np.zeros(len(envs), np.int64)
        self._episodes_started = np.zeros(len(envs), np.int64)  # orders a sub-env's chunks
        self._obs: list[dict | None] = [None] * len(envs)  # None: the sub-env needs a reset
        self._episodes = [Episode(0, i) for i in range(len(envs))]
        self._rows = [_PolicyRows() for _ in self._policy_ids]
        self._unroll_ids: list = []  # chunk -> its unroll id, drawn when the chunk ends
        # what each policy's agents send their env (normalize_actions, clip_actions)
        self._env_actions = {
            policy_id: EnvActionRule.of(
                action_spaces[policy_id], config_for(spec.built_class(), spec.config)
            )
            for policy_id, spec in agent_policies.specs.items()
        }

    def sample(self) -> tuple[MultiAgentBatch, dict]:
        """One fragment -> (MultiAgentBatch, metrics with env_steps, agent_steps,
        episode_returns (summed over agents), episode_lengths (env steps) and
        policy_episode_returns (policy id -> each of its agents' episode returns))."""
        fragment = _Fragment()
        for _ in range(self.rollout_fragment_length):
            for env_index, obs in enumerate(self._obs):
                if obs is None:
                    self._start_episode(env_index)
            results, flags = self._step_envs(self._act())
            self._close_rows(results, flags)
            self._end_step(results, flags, fragment)
        for env_index in range(len(self.envs)):
            self._finish_chunks(env_index)
        batches = {}
        for index, policy_id in enumerate(self._policy_ids):
            chunks = self._chunks(index)
            if chunks:
                batches[policy_id] = concat_samples(self._postprocessed(policy_id, chunks))
        # (kept until here: a fragment that raised, e.g. on an actor's death, goes on in the
        # next sample with its rows and chunks)
        self._unroll_ids = []
        batch = MultiAgentBatch(batches, self.rollout_fragment_length * len(self.envs))
        metrics = {
            "env_steps": batch.env_steps(),
            "agent_steps": batch.agent_steps(),
            "episode_returns": fragment.returns,
            "episode_lengths": fragment.lengths,
            "policy_episode_returns": dict(fragment.policy_returns),
        }
        if self.callbacks is not None:
            metrics["custom_metrics"] = dict(fragment.custom_metrics)
            metrics["hist_data"] = dict(fragment.hist_data)
        return batch, metrics

    # ----- a vector step -----------------------------------------------------------

    def _start_episode(self, env_index: int) -> None:
        seed = None if self._seed is None else int(self._rng.integers(2**31))
        obs, _ = self.envs[env_index].reset(seed=seed)
        self._obs[env_index] = obs
        episode = Episode(int(self._rng.integers(2**62)), env_index)
        episode.last_obs.update(obs)
        self._episodes[env_index], self._eps_id[env_index] = episode, episode.id_
        self._episodes_started[env_index] += 1
        slots = self._slots_of(env_index)
        for array, value in (
            (self._policy, -1),
            (self._t, 0),
            (self._return, 0.0),
            (self._prev_reward, 0.0),
            *((prev_action, 0) for prev_action in self._prev_action),
        ):
            array[slots] = value
        self._paid_first[env_index] = {}
        self._hook("on_episode_start", env_index)

    def _act(self) -> list[dict]:
        """Every agent in each sub-env's last obs dict acts with its policy: one batch
        per policy over all sub-envs -> an action dict per sub-env."""
        action_dicts: list[dict] = [{} for _ in self.envs]
        acting: dict[str, tuple[list, list, list]] = {}  # policy id -> (slots, obs, agents)
        for env_index, obs in enumerate(self._obs):
            assert obs is not None
            slot_of, actions_to = self._slot_of[env_index], action_dicts[env_index]
            policy_of = self._episodes[env_index].policy_of
            for agent, agent_obs in obs.items():
                policy_id = policy_of.get(agent)
                if policy_id is None:
                    policy_id = self._map(env_index, agent)
                entry = acting.get(policy_id)
                if entry is None:
                    entry = acting[policy_id] = ([], [], [])
                entry[0].append(slot_of[agent])
                entry[1].append(agent_obs)
                entry[2].append((actions_to, agent))
        for policy_id, (slot_list, observations, agents) in acting.items():
            policy = self._policy_index[policy_id]
            slots, obs = np.asarray(slot_list), _stack(observations)
            prev_actions = self._prev_action[policy][slots]
            prev_rewards = self._prev_reward[slots].astype(np.float32)
            actions, _, extra = self.policies[policy_id].compute_actions(
                obs, None, prev_actions, prev_rewards
            )
            actions = np.asarray(actions)
            sent = np.asarray(self._env_actions[policy_id].to_env(actions))
            for (actions_to, agent), action in zip(agents, sent):
                actions_to[agent] = action
            columns = {
                SampleBatch.OBS: obs,
                SampleBatch.ACTIONS: actions,
                SampleBatch.PREV_ACTIONS: prev_actions,
                SampleBatch.PREV_REWARDS: prev_rewards,
                **{k: np.asarray(v) for k, v in extra.items()},
            }
            self._open[slots] = True
            self._open_row[slots] = self._rows[policy].add_acted(columns, len(slot_list))
            self._reward[slots] = 0.0
            self._action[policy][slots] = actions
        return action_dicts

    def _step_envs(self, action_dicts: list[dict]) -> tuple[list, _StepFlags]:
        """Every sub-env takes its step -> ((new obs, terminateds, truncateds) per
        sub-env, the step's flags by slot); the rewards are paid to the slots."""
        paid_slots: list[int] = []
        paid: list = []
        obs_slots: list[int] = []
        done_slots: tuple[list[int], list[int]] = ([], [])  # terminated, truncated
        over: list[bool] = []
        over_slots: list[int] = []
        results = []
        for env_index, (env, action_dict) in enumerate(zip(self.envs, action_dicts)):
            new_obs, rewards, terminateds, truncateds, infos = checked_step(env, action_dict)
            episode = self._episodes[env_index]
            episode.length += 1
            episode.last_obs.update(new_obs)
            episode.last_rewards, episode.last_infos = dict(rewards), infos
            slot_of, paid_first = self._slot_of[env_index], self._paid_first[env_index]
            for agent, reward in rewards.items():
                # RLlib's rule: an action's row is paid until the agent's next obs; what an
                # agent is paid before its first obs (or after its end) counts in the totals
                if agent not in episode.policy_of:
                    self._map(env_index, agent)
                if agent not in paid_first:
                    paid_first[agent] = slot_of[agent]
                paid_slots.append(slot_of[agent])
                paid.append(reward)
            obs_slots.extend(self._slot(env_index, agent) for agent in new_obs)
            # both flags as the env gave them (RLlib's): the agent's, or "__all__"'s
            slots = range(env_index * len(self.agents), (env_index + 1) * len(self.agents))
            for kind, dones in enumerate((terminateds, truncateds)):
                if dones[ALL]:
                    done_slots[kind].extend(slots)
                else:
                    done_slots[kind].extend(
                        self._slot(env_index, agent)
                        for agent, done in dones.items()
                        if done and agent != ALL
                    )
            over.append(bool(terminateds[ALL] or truncateds[ALL]))
            if over[-1]:
                over_slots.extend(slots)
            results.append((new_obs, terminateds, truncateds))
        num_slots = len(self._policy)
        flags = _StepFlags(
            np.zeros(num_slots, bool),
            np.zeros(num_slots, bool),
            np.zeros(num_slots, bool),
            over,
            over_slots,
        )
        flags.has_obs[obs_slots] = True
        flags.terminated[done_slots[0]] = True
        flags.truncated[done_slots[1]] = True
        if paid_slots:  # (a sub-env's agents are paid once a step: the slots differ)
            self._return[paid_slots] += paid
            self._reward[paid_slots] += paid
        return results, flags

    def _close_rows(self, results: list, flags: _StepFlags) -> None:
        """The open rows whose agent got its next obs, or whose episode ended, close:
        their columns go to their policy's rows."""
        closes = flags.has_obs.copy()
        closes[flags.over_slots] = True
        closing = np.flatnonzero(self._open & closes)
        if not len(closing):
            return
        first = closing[self._chunk[closing] < 0]  # the first row of its chunk
        if len(first):
            self._chunk[first] = len(self._unroll_ids) + np.arange(len(first))
            self._unroll_ids.extend([0] * len(first))
        policies = self._policy[closing]
        num_agents = len(self.agents)
        for policy in [0] if len(self._policy_ids) == 1 else np.unique(policies).tolist():
            slots = closing if len(self._policy_ids) == 1 else closing[policies == policy]
            has_next, env_of = flags.has_obs[slots], self._slot_env[slots]
            given = slots[has_next].tolist()
            next_obs = None
            if given:
                next_obs = _stack(
                    [
                        results[slot // num_agents][0][self.agents[slot % num_agents]]
                        for slot in given
                    ]
                )
            columns = {
                _ROW: self._open_row[slots],
                _SLOT: slots,
                _EPISODE: self._episodes_started[env_of],
                _CHUNK: self._chunk[slots],
                _HAS_NEXT: has_next,
                SampleBatch.REWARDS: self._reward[slots],
                SampleBatch.TERMINATEDS: flags.terminated[slots],
                SampleBatch.TRUNCATEDS: flags.truncated[slots],
                SampleBatch.EPS_ID: self._eps_id[env_of],
                SampleBatch.T: self._t[slots],
            }
            self._rows[policy].add_closed(columns, next_obs)
            self._prev_action[policy][slots] = self._action[policy][slots]
        self._t[closing] += 1
        self._prev_reward[closing] = self._reward[closing]
        self._open[closing] = False

    def _end_step(self, results: list, flags: _StepFlags, fragment: _Fragment) -> None:
        """Each sub-env's agents that go on act next; its episode hooks; a finished
        episode counted, its chunks ended and its sub-env left for a reset."""
        for env_index, (new_obs, terminateds, truncateds) in enumerate(results):
            self._obs[env_index] = {
                a: o for a, o in new_obs.items() if not (terminateds.get(a) or truncateds.get(a))
            }
            self._hook("on_episode_step", env_index)
            if flags.over[env_index]:
                episode = self._episodes[env_index]
                self._update_returns(env_index)
                self._hook("on_episode_end", env_index)
                gather_episode(episode, fragment.custom_metrics, fragment.hist_data)
                fragment.returns.append(sum(episode.agent_returns.values()))
                fragment.lengths.append(episode.length)
                for agent, value in episode.agent_returns.items():
                    fragment.policy_returns[episode.policy_of[agent]].append(value)
                self._finish_chunks(env_index)
                self._obs[env_index] = None

    def _finish_chunks(self, env_index: int) -> None:
        """The sub-env's chunks end (at its episode's end or the fragment's): each
        gets its unroll id."""
        for slot in range(env_index * len(self.agents), (env_index + 1) * len(self.agents)):
            chunk = self._chunk[slot]
            if chunk >= 0:
                self._unroll_ids[chunk] = self._rng.integers(2**62)
                self._chunk[slot] = -1

    # ----- a fragment's rows ---------------------------------------------------------

    def _chunks(self, policy: int) -> list[SampleBatch]:
        """The policy's rows closed in this fragment as chunks (one agent, one episode),
        by sub-env, episode and agent; its rows still open are kept for the next."""
        still_open = np.flatnonzero(self._open & (self._policy == policy))
        acted, closed, next_obs = self._rows[policy].take(self._open_row[still_open])
        self._open_row[still_open] = np.arange(len(still_open))
        if acted is None or closed is None:
            return []
        # an agent with no obs when its episode ended: its row's next obs is its own obs
        own_obs = _take(acted[SampleBatch.OBS], closed[_ROW])
        if next_obs is not None:
            given = np.flatnonzero(closed[_HAS_NEXT])
            tree.map_structure(lambda own, new: own.__setitem__(given, new), own_obs, next_obs)
        agent_index = self._slot_agent_index[closed[_SLOT]]
        order = np.lexsort(
            (
                np.arange(len(closed[_ROW])),  # time, within a chunk
                agent_index,
                closed[_EPISODE],
                self._slot_env[closed[_SLOT]],
            )
        )
        rows = closed[_ROW][order]
        columns = {
            key: _take(value, rows) for key, value in acted.items() if key != SampleBatch.OBS
        }
        rewards = closed[SampleBatch.REWARDS][order].astype(np.float32)
        columns = {
            SampleBatch.OBS: _take(acted[SampleBatch.OBS], rows),
            SampleBatch.ACTIONS: columns.pop(SampleBatch.ACTIONS),
            SampleBatch.REWARDS: rewards,
            **columns,
            SampleBatch.NEXT_OBS: _take(own_obs, order),
            **{
                key: closed[key][order]
                for key in (
                    SampleBatch.TERMINATEDS,
                    SampleBatch.TRUNCATEDS,
                    SampleBatch.EPS_ID,
                    SampleBatch.T,
                )
            },
            SampleBatch.AGENT_INDEX: agent_index[order],
            SampleBatch.UNROLL_ID: np.asarray(self._unroll_ids, np.int64)[closed[_CHUNK][order]],
        }
        chunk = closed[_CHUNK][order]
        bounds = [0, *(np.flatnonzero(chunk[1:] != chunk[:-1]) + 1).tolist(), len(chunk)]
        return [
            SampleBatch.from_checked_rows(_take(columns, slice(a, b)))
            for a, b in zip(bounds[:-1], bounds[1:])
        ]

    def _postprocessed(self, policy_id: str, chunks: list) -> list:
        done = self.policies[policy_id].postprocess_trajectories(chunks)
        if self.callbacks is not None and self.callbacks.overrides("on_postprocess_trajectory"):
            for original, chunk in zip(chunks, done):
                self.callbacks.call(
                    "on_postprocess_trajectory",
                    postprocessed_batch=chunk,
                    original_batches={policy_id: original},
                    episode=None,
                    agent_id=None,
                    policy_id=policy_id,
                    **self.hook_arguments,
                )
        return done

    # ----- slots, mapping, hooks -----------------------------------------------------

    def _slot(self, env_index: int, agent) -> int:
        try:
            return self._slot_of[env_index][agent]
        except KeyError:
            raise MultiAgentEnvError(
                f"multi-agent env {type(self.envs[env_index]).__name__}: agent {agent!r} is "
                f"not one of its possible_agents {self.agents}"
            ) from None

    def _slots_of(self, env_index: int) -> slice:
        return slice(env_index * len(self.agents), (env_index + 1) * len(self.agents))

    def _map(self, env_index: int, agent) -> str:
        """The agent's policy id in this episode, mapped when first seen (its first obs
        or reward, as RLlib's `policy_for`)."""
        slot = self._slot(env_index, agent)
        episode = self._episodes[env_index]
        self._update_returns(env_index)  # what a mapping function may read
        episode.policy_of[agent] = policy_id = self.agent_policies.policy_id(agent, episode)
        self._policy[slot] = self._policy_index[policy_id]
        return policy_id

    def _update_returns(self, env_index: int) -> None:
        """The episode's agent_returns from the slots, in the order agents were first paid."""
        returns = self._episodes[env_index].agent_returns
        for agent, slot in self._paid_first[env_index].items():
            returns[agent] = float(self._return[slot])

    def _hook(self, hook: str, env_index: int) -> None:
        if self.callbacks is not None and self.callbacks.overrides(hook):
            self._update_returns(env_index)
            env, episode = self.envs[env_index], self._episodes[env_index]
            self.callbacks.call(
                hook,
                episode=episode,
                env_index=env_index,
                base_env=env,
                env=env,
                **self.hook_arguments,
            )


def _stack(values: list):
    """Rows (arrays, or nests of them: a Dict observation) as one batch, nested alike."""
    if not tree.is_nested(values[0]):
        return np.asarray(values)
    return tree.map_structure(lambda *leaves: np.stack([np.asarray(v) for v in leaves]), *values)


def _take(value, rows: np.ndarray | slice):
    """Rows `rows` of a batch (or of each column of a dict of them), nested alike."""
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, dict):
        return {key: _take(column, rows) for key, column in value.items()}
    return tree.map_structure(lambda column: column[rows], value)


def _joined_leaves(parts: list):
    """Batches nested alike as one, leaf by leaf."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def _joined(records: list[dict]) -> dict:
    """Column dicts with the same keys as one."""
    return {key: _joined_leaves([r[key] for r in records]) for key in records[0]}
