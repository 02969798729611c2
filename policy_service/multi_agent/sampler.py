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

The sub-envs step in lockstep: a vector step is one `compute_actions` per policy for that
policy's agents of all sub-envs. Each (sub-env, agent) pair is a slot; what the sampler
keeps of an agent between steps (its open row, the rewards paid to it, its step count,
its previous reward) is a number by slot, and each row that closes leaves one tuple. The
acting calls' arrays and those tuples are joined into columns once, when the fragment
ends, so a step costs no array work beyond its acting calls and an agent costs a few
Python operations. A policy's rows come out in the single-agent order: by sub-env, then
episode (in time), then agent, each chunk in time order. A recurrent policy's state is
kept by slot (an array per state tensor), set to the policy's initial state when the
slot's episode starts, so each agent carries its own; rows carry `state_in_i` and
`state_out_i` as a single-agent fragment's do, and a learner cuts sequences where the
agent, episode or chunk changes (policy_service/data/sequencing.py).
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

# what a closed row leaves, one tuple each; joined as columns when the fragment ends (the
# bookkeeping ones, row to has_next_obs, never reach a returned batch)
_CLOSED = (
    "row",  # its number in its policy's acted rows
    "slot",
    "episode",  # its sub-env's episodes started before it, its own included
    "chunk",
    "has_next_obs",
    SampleBatch.REWARDS,
    SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS,
    SampleBatch.EPS_ID,
    SampleBatch.T,
)
_ROW, _SLOT, _EPISODE, _CHUNK, _HAS_NEXT = _CLOSED[:5]


@dataclass
class Episode:
    """One episode's bookkeeping; `policy_mapping_fn` gets it as `episode` (RLlib: `id_`),
    and so do the callbacks' episode hooks (policy_service/runs/callbacks.py), which may write
    `custom_metrics`, `user_data` and `hist_data`. The sampler keeps `agent_returns`
    current for every hook, every mapping and at the episode's end (between them, by
    slot)."""

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


class _PolicyRows:
    """One policy's rows of the fragment being sampled: the arrays each acting call gave
    (rows numbered in order), a tuple (`_CLOSED`) for each row that closed, and the next
    obs the env gave the closed rows that got one."""

    def __init__(self) -> None:
        self.acted: list[dict] = []
        self.num_acted = 0
        self.closed: list[tuple] = []
        self.next_obs: list = []

    def add_acted(self, columns: dict, count: int) -> int:
        """-> the first new row's number."""
        self.acted.append(columns)
        self.num_acted += count
        return self.num_acted - count

    def take(self, still_open: list[int]) -> tuple[dict | None, dict | None, Any]:
        """-> (acted columns, closed columns, next obs given), each joined over the
        fragment's steps (None: no such rows); the acted rows `still_open` (numbers) are
        kept, numbered 0, 1, ... in that order, to close in the next fragment."""
        if not self.acted:
            return None, None, None
        acted = _joined(self.acted)
        closed = None
        if self.closed:
            closed = {key: np.asarray(values) for key, values in zip(_CLOSED, zip(*self.closed))}
        next_obs = _stack(self.next_obs) if self.next_obs else None
        self.acted = [_take(acted, np.asarray(still_open, np.int64))] if still_open else []
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
        # each slot's state, a number by slot; a sub-env's slots are reset when its episode
        # starts
        self._policy = [-1] * num_slots  # its policy's index in this episode (-1: none)
        self._open_row = [-1] * num_slots  # its acted row awaiting its next obs (-1: none)
        self._reward = [0.0] * num_slots  # paid to the slot since it last acted
        self._t = [0] * num_slots  # the agent's rows so far in its episode
        self._return = [0.0] * num_slots  # the agent's episode return
        self._prev_reward = [0.0] * num_slots  # its last closed row's reward
        self._chunk = [-1] * num_slots  # its chunk in this fragment (-1: no row yet)
        # each sub-env's agents paid in its episode -> their slots, in the order first paid
        self._paid_first: list[dict] = [{} for _ in envs]
        self._slot_of = [  # each sub-env's agents -> their slots
            {agent: i * len(self.agents) + j for j, agent in enumerate(self.agents)}
            for i in range(len(envs))
        ]
        action_spaces = agent_policies.spaces()[1]
        # each policy's slots' last action in this episode (the previous action of their
        # next row); before the first, its action space's zero
        self._action = [
            np.asarray(spaces.zero_actions(action_spaces[p], num_slots)) for p in self._policy_ids
        ]
        # each recurrent policy's state tensors by slot: its initial state at an episode's start
        self._initial_state = [_initial_state(policies[p]) for p in self._policy_ids]
        self._state = [
            [np.repeat(tensor[None], num_slots, axis=0) for tensor in initial]
            for initial in self._initial_state
        ]
        self._episodes_started = [0] * len(envs)  # orders a sub-env's chunks
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
            self._end_step(self._step_envs(self._act()), fragment)
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

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ----- a vector step -----------------------------------------------------------

    def _start_episode(self, env_index: int) -> None:
        seed = None if self._seed is None else int(self._rng.integers(2**31))
        obs, _ = self.envs[env_index].reset(seed=seed)
        self._obs[env_index] = obs
        episode = Episode(int(self._rng.integers(2**62)), env_index)
        episode.last_obs.update(obs)
        self._episodes[env_index] = episode
        self._episodes_started[env_index] += 1
        slots = self._slots_of(env_index)
        num_agents = len(self.agents)
        self._policy[slots], self._t[slots] = [-1] * num_agents, [0] * num_agents
        self._return[slots] = self._prev_reward[slots] = [0.0] * num_agents
        for action in self._action:
            action[slots] = 0
        for states, initial in zip(self._state, self._initial_state):
            for state, tensor in zip(states, initial):
                state[slots] = tensor
        self._paid_first[env_index] = {}
        self._hook("on_episode_start", env_index)

    def _act(self) -> list[dict]:
        """Every agent in each sub-env's last obs dict acts with its policy: one batch
        per policy over all sub-envs -> an action dict per sub-env. Nothing is kept of a
        step whose acting call raised."""
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
        acted = []
        for policy_id, (slots, observations, _) in acting.items():
            policy = self._policy_index[policy_id]
            obs = _stack(observations)
            prev_actions = self._action[policy][slots]
            prev_rewards = np.asarray([self._prev_reward[slot] for slot in slots], np.float32)
            states = [state[slots] for state in self._state[policy]]
            actions, state_outs, extra = self.policies[policy_id].compute_actions(
                obs, states or None, prev_actions, prev_rewards
            )
            actions = np.asarray(actions)
            columns = {
                SampleBatch.OBS: obs,
                SampleBatch.ACTIONS: actions,
                SampleBatch.PREV_ACTIONS: prev_actions,
                SampleBatch.PREV_REWARDS: prev_rewards,
                **{k: np.asarray(v) for k, v in extra.items()},
            }
            for i, (state_in, state_out) in enumerate(zip(states, state_outs)):
                columns[f"state_in_{i}"], columns[f"state_out_{i}"] = (
                    state_in,
                    np.asarray(state_out),
                )
            acted.append((policy_id, policy, columns))
        for policy_id, policy, columns in acted:
            slots, _, agents = acting[policy_id]
            actions = columns[SampleBatch.ACTIONS]
            sent = np.asarray(self._env_actions[policy_id].to_env(actions))
            row = self._rows[policy].add_acted(columns, len(slots))
            open_row, reward = self._open_row, self._reward
            for slot, (actions_to, agent), action in zip(slots, agents, sent):
                actions_to[agent] = action
                open_row[slot], reward[slot] = row, 0.0
                row += 1
            self._action[policy][slots] = actions
            for i, state in enumerate(self._state[policy]):
                state[slots] = columns[f"state_out_{i}"]
        return action_dicts

    def _step_envs(self, action_dicts: list[dict]) -> list[tuple[dict, dict, dict, bool]]:
        """Every sub-env takes its step: rewards paid to its slots, its rows closed ->
        (new obs, terminateds, truncateds, whether its episode ended) per sub-env."""
        results = []
        for env_index, (env, action_dict) in enumerate(zip(self.envs, action_dicts)):
            new_obs, rewards, terminateds, truncateds, infos = checked_step(env, action_dict)
            episode = self._episodes[env_index]
            episode.length += 1
            episode.last_obs.update(new_obs)
            episode.last_rewards, episode.last_infos = dict(rewards), infos
            slot_of, paid_first = self._slot_of[env_index], self._paid_first[env_index]
            paid = []
            for agent, reward in rewards.items():
                # RLlib's rule: an action's row is paid until the agent's next obs; what an
                # agent is paid before its first obs (or after its end) counts in the totals
                if agent not in episode.policy_of:
                    self._map(env_index, agent)
                slot = slot_of[agent]
                if agent not in paid_first:
                    paid_first[agent] = slot
                paid.append((slot, float(reward)))
            for slot, value in paid:  # (after the mappings: they see the returns before)
                self._return[slot] += value
                self._reward[slot] += value
            over = bool(terminateds[ALL] or truncateds[ALL])
            for agent in new_obs:
                if agent not in slot_of:
                    self._slot(env_index, agent)  # raises
            self._close_rows(env_index, new_obs, terminateds, truncateds, over)
            results.append((new_obs, terminateds, truncateds, over))
        return results

    def _close_rows(
        self, env_index: int, new_obs: dict, terminateds: dict, truncateds: dict, over: bool
    ) -> None:
        """The sub-env's open rows whose agent got its next obs, or all of them when its
        episode ended, close: a tuple each to their policy's rows (both done flags as the
        env gave them, RLlib's: the agent's, or "__all__"'s)."""
        slot_of, open_row = self._slot_of[env_index], self._open_row
        episode, eps_id = self._episodes_started[env_index], self._episodes[env_index].id_
        all_terminated, all_truncated = bool(terminateds[ALL]), bool(truncateds[ALL])
        for agent in self.agents if over else new_obs:
            slot = slot_of[agent]
            row = open_row[slot]
            if row < 0:
                continue
            chunk = self._chunk[slot]
            if chunk < 0:
                chunk = self._chunk[slot] = len(self._unroll_ids)
                self._unroll_ids.append(0)
            rows = self._rows[self._policy[slot]]
            has_next = agent in new_obs
            if has_next:  # a copy: an env may write its next obs into the same arrays
                rows.next_obs.append(tree.map_structure(np.array, new_obs[agent]))
            reward = self._reward[slot]
            rows.closed.append(
                (
                    row,
                    slot,
                    episode,
                    chunk,
                    has_next,
                    reward,
                    all_terminated or bool(terminateds.get(agent, False)),
                    all_truncated or bool(truncateds.get(agent, False)),
                    eps_id,
                    self._t[slot],
                )
            )
            self._t[slot] += 1
            self._prev_reward[slot] = reward
            open_row[slot] = -1

    def _end_step(self, results: list, fragment: _Fragment) -> None:
        """Each sub-env's agents that go on act next; its episode hooks; a finished
        episode counted, its chunks ended and its sub-env left for a reset."""
        for env_index, (new_obs, terminateds, truncateds, over) in enumerate(results):
            self._obs[env_index] = {
                a: o for a, o in new_obs.items() if not (terminateds.get(a) or truncateds.get(a))
            }
            self._hook("on_episode_step", env_index)
            if over:
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
        still_open = [
            slot
            for slot, row in enumerate(self._open_row)
            if row >= 0 and self._policy[slot] == policy
        ]
        acted, closed, next_obs = self._rows[policy].take(
            [self._open_row[slot] for slot in still_open]
        )
        for number, slot in enumerate(still_open):
            self._open_row[slot] = number
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


def _initial_state(policy) -> list[np.ndarray]:
    """A recurrent policy's initial state tensors (none for another)."""
    if not policy.is_recurrent():
        return []
    return [np.asarray(tensor) for tensor in policy.get_initial_state()]


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
