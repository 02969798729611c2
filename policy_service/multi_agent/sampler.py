"""MultiAgentSampler: steps copies of a MultiAgentEnv with a policy per agent (by the
mapping), builds each agent's trajectory separately and postprocesses it with its own
policy.

The agents in an obs dict act; an agent's row closes when its next obs arrives (its
rewards summed until then, so turn-based agents are paid for their own moves), or when
the episode ends. A reward before an agent's first obs (or after its end) trains no row
and counts in the episode's totals (RLlib's rule: docs/multi_agent.md, "Sampling").
Each chunk (one agent, one episode, one fragment) goes through its
policy's `postprocess_trajectory` (all of a policy's chunks at once:
`postprocess_trajectories`), as a single-agent fragment's chunks do, so an
agent's advantages use only its own rewards and values. A fragment is
`rollout_fragment_length` steps of every sub-env; open trajectories are cut there and
bootstrapped. The sub-envs step in lockstep: each step, one `compute_actions` per policy
acts for that policy's agents of all sub-envs.
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


@dataclass
class Episode:
    """One episode's bookkeeping; `policy_mapping_fn` gets it as `episode` (RLlib: `id_`),
    and so do the callbacks' episode hooks (policy_service/runs/callbacks.py), which may write
    `custom_metrics`, `user_data` and `hist_data`."""

    id_: int
    env_index: int = 0
    policy_of: dict = field(default_factory=dict)  # agent -> policy id, mapped on first obs
    agent_t: dict = field(default_factory=lambda: defaultdict(int))
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
class _SubEnv:
    """One env copy and the state of its episode in progress."""

    env: MultiAgentEnv
    obs: dict | None = None  # None: the env needs a reset
    episode: Episode = field(default_factory=lambda: Episode(0))
    open: dict = field(default_factory=dict)  # agent -> its row awaiting its next obs
    rows: dict = field(default_factory=lambda: defaultdict(list))  # agent -> closed rows
    prev: dict = field(default_factory=dict)  # agent -> (previous action, previous reward)


@dataclass
class _Fragment:
    """What one sample() gathers from every sub-env."""

    chunks: dict = field(default_factory=lambda: defaultdict(list))  # policy id -> chunks
    returns: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    policy_returns: dict = field(default_factory=lambda: defaultdict(list))
    custom_metrics: dict = field(default_factory=dict)  # key -> values (callbacks)
    hist_data: dict = field(default_factory=dict)


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
        self.agent_index = {agent: i for i, agent in enumerate(envs[0].possible_agents)}
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._sub_envs = [_SubEnv(e) for e in envs]
        action_spaces = agent_policies.spaces()[1]
        # an agent's previous action before its first: its policy's action space's zero
        self._no_action = {
            policy_id: spaces.zero_actions(action_space, 1)[0]
            for policy_id, action_space in action_spaces.items()
        }
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
            for sub in self._sub_envs:
                if sub.obs is None:
                    self._start_episode(sub)
            for sub, action_dict in zip(self._sub_envs, self._act()):
                self._step(sub, action_dict, fragment)
        for sub in self._sub_envs:
            self._finish_chunks(sub, fragment.chunks)
        batches = {
            policy_id: concat_samples(self._postprocessed(policy_id, chunks))
            for policy_id, chunks in fragment.chunks.items()
        }
        batch = MultiAgentBatch(batches, self.rollout_fragment_length * len(self._sub_envs))
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

    def _hook(self, hook: str, sub: _SubEnv) -> None:
        if self.callbacks is not None and self.callbacks.overrides(hook):
            episode = sub.episode
            self.callbacks.call(
                hook,
                episode=episode,
                env_index=episode.env_index,
                base_env=sub.env,
                env=sub.env,
                **self.hook_arguments,
            )

    def _step(self, sub: _SubEnv, action_dict: dict, fragment: _Fragment) -> None:
        """One step of `sub`: rewards to the open rows, rows closed, the episode's end."""
        new_obs, rewards, terminateds, truncateds, infos = checked_step(sub.env, action_dict)
        episode = sub.episode
        episode.length += 1
        episode.last_obs.update(new_obs)
        episode.last_rewards, episode.last_infos = dict(rewards), infos
        for agent, reward in rewards.items():
            # RLlib's rule: an action's row is paid until the agent's next obs; what an
            # agent is paid before its first obs (or after its end) counts in the totals
            self._policy_of(sub, agent)
            episode.agent_returns[agent] += float(reward)
            if agent in sub.open:
                sub.open[agent][SampleBatch.REWARDS] += float(reward)
        episode_over = bool(terminateds[ALL] or truncateds[ALL])
        for agent in list(sub.open):
            if agent in new_obs or episode_over:  # both flags as the env gave them (RLlib's)
                done = terminateds.get(agent, False) or terminateds[ALL]
                cut = truncateds.get(agent, False) or truncateds[ALL]
                self._close(sub, agent, new_obs.get(agent), bool(done), bool(cut))
        sub.obs = {
            a: o for a, o in new_obs.items() if not (terminateds.get(a) or truncateds.get(a))
        }
        self._hook("on_episode_step", sub)
        if episode_over:
            self._hook("on_episode_end", sub)
            gather_episode(episode, fragment.custom_metrics, fragment.hist_data)
            fragment.returns.append(sum(episode.agent_returns.values()))
            fragment.lengths.append(episode.length)
            for agent, value in episode.agent_returns.items():
                fragment.policy_returns[episode.policy_of[agent]].append(value)
            self._finish_chunks(sub, fragment.chunks)
            sub.obs = None

    def _start_episode(self, sub: _SubEnv) -> None:
        seed = None if self._seed is None else int(self._rng.integers(2**31))
        sub.obs, _ = sub.env.reset(seed=seed)
        env_index = next(i for i, each in enumerate(self._sub_envs) if each is sub)
        sub.episode = Episode(int(self._rng.integers(2**62)), env_index)
        sub.episode.last_obs.update(sub.obs)
        sub.open, sub.prev = {}, {}
        self._hook("on_episode_start", sub)

    def _act(self) -> list[dict]:
        """Every agent in each sub-env's last obs dict acts with its policy: one batch
        per policy over all sub-envs -> an action dict per sub-env."""
        by_policy: dict = defaultdict(list)  # policy id -> [(sub-env, agent)]
        for sub in self._sub_envs:
            assert sub.obs is not None
            for agent in sub.obs:
                by_policy[self._policy_of(sub, agent)].append((sub, agent))
        action_dicts: dict = {id(sub): {} for sub in self._sub_envs}
        for policy_id, acting in by_policy.items():
            obs = _stack([sub.obs[agent] for sub, agent in acting])
            no_action = self._no_action[policy_id]
            prev = [sub.prev.get(agent, (no_action, 0.0)) for sub, agent in acting]
            prev_actions = np.asarray([p[0] for p in prev])
            prev_rewards = np.asarray([p[1] for p in prev], np.float32)
            actions, _, extra = self.policies[policy_id].compute_actions(
                obs, None, prev_actions, prev_rewards
            )
            actions = np.asarray(actions)
            sent = np.asarray(self._env_actions[policy_id].to_env(actions))
            extra = {k: np.asarray(v) for k, v in extra.items()}
            for i, (sub, agent) in enumerate(acting):
                action_dicts[id(sub)][agent] = sent[i]
                sub.open[agent] = {
                    SampleBatch.OBS: _row(obs, i),
                    SampleBatch.ACTIONS: actions[i],
                    SampleBatch.REWARDS: 0.0,
                    SampleBatch.PREV_ACTIONS: prev_actions[i],
                    SampleBatch.PREV_REWARDS: prev_rewards[i],
                    **{k: v[i] for k, v in extra.items()},
                }
        return [action_dicts[id(sub)] for sub in self._sub_envs]

    def _policy_of(self, sub: _SubEnv, agent) -> str:
        """The agent's policy id in this episode, mapped when first seen (its first obs
        or reward, as RLlib's `policy_for`)."""
        policy_of = sub.episode.policy_of
        if agent not in policy_of:
            policy_of[agent] = self.agent_policies.policy_id(agent, sub.episode)
        return policy_of[agent]

    def _close(self, sub: _SubEnv, agent, next_obs, terminated: bool, truncated: bool) -> None:
        row = sub.open.pop(agent)
        episode = sub.episode
        row.update(
            {
                SampleBatch.NEXT_OBS: row[SampleBatch.OBS] if next_obs is None else next_obs,
                SampleBatch.TERMINATEDS: terminated,
                SampleBatch.TRUNCATEDS: truncated,
                SampleBatch.EPS_ID: episode.id_,
                SampleBatch.T: episode.agent_t[agent],
                SampleBatch.AGENT_INDEX: self.agent_index[agent],
            }
        )
        episode.agent_t[agent] += 1
        sub.prev[agent] = (row[SampleBatch.ACTIONS], row[SampleBatch.REWARDS])
        sub.rows[agent].append(row)

    def _finish_chunks(self, sub: _SubEnv, chunks: dict) -> None:
        """Each agent's closed rows as one chunk of its policy; unroll ids per chunk."""
        for agent, rows in sub.rows.items():
            columns = {key: _stack([r[key] for r in rows]) for key in rows[0]}
            columns[SampleBatch.REWARDS] = columns[SampleBatch.REWARDS].astype(np.float32)
            columns[SampleBatch.UNROLL_ID] = np.full(len(rows), self._rng.integers(2**62))
            chunks[sub.episode.policy_of[agent]].append(SampleBatch(columns))
        sub.rows = defaultdict(list)


def _stack(values: list):
    """Rows (arrays, or nests of them: a Dict observation) as one batch, nested alike."""
    if not tree.is_nested(values[0]):
        return np.asarray(values)
    return tree.map_structure(lambda *leaves: np.stack([np.asarray(v) for v in leaves]), *values)


def _row(batch, i: int):
    """Row i of a batch `_stack` made."""
    if not tree.is_nested(batch):
        return batch[i]
    return tree.map_structure(lambda column: column[i], batch)
