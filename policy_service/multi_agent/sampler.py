"""MultiAgentSampler: steps one MultiAgentEnv with a policy per agent (by the mapping),
builds each agent's trajectory separately and postprocesses it with its own policy.

The agents in an obs dict act; an agent's row closes when its next obs arrives (its
rewards summed until then, so turn-based agents are paid for their own moves), or when
the episode ends. Each chunk (one agent, one episode, one fragment) goes through its
policy's `postprocess_trajectory`, as a single-agent fragment's chunks do, so an
agent's advantages use only its own rewards and values. A fragment is
`rollout_fragment_length` env steps; open trajectories are cut there and bootstrapped.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import tree

from policy_service import spaces
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.env import ALL, MultiAgentEnv, MultiAgentEnvError, checked_step
from policy_service.multi_agent.policies import AgentPolicies
from policy_service.sample_batch import SampleBatch, concat_samples


@dataclass
class Episode:
    """One episode's bookkeeping; `policy_mapping_fn` gets it as `episode` (RLlib: `id_`)."""

    id_: int
    policy_of: dict = field(default_factory=dict)  # agent -> policy id, mapped on first obs
    agent_t: dict = field(default_factory=lambda: defaultdict(int))
    agent_returns: dict = field(default_factory=lambda: defaultdict(float))
    length: int = 0


class MultiAgentSampler:
    """`policies`: id -> a built TFPolicy acting here (its weights set by the caller)."""

    def __init__(
        self,
        env: MultiAgentEnv,
        agent_policies: AgentPolicies,
        policies: dict,
        rollout_fragment_length: int,
        seed: int | None = None,
    ) -> None:
        for policy_id, policy in policies.items():
            if policy.is_recurrent():
                raise MultiAgentEnvError(
                    f"policy {policy_id!r}: multi-agent sampling takes no recurrent policy yet"
                )
        self.env, self.agent_policies, self.policies = env, agent_policies, policies
        self.rollout_fragment_length = rollout_fragment_length
        self.agent_index = {agent: i for i, agent in enumerate(env.possible_agents)}
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._obs: dict | None = None  # None: the env needs a reset
        self._episode = Episode(0)
        self._open: dict = {}  # agent -> its row awaiting its next obs
        self._rows: dict = defaultdict(list)  # agent -> closed rows of this fragment
        self._prev: dict = {}  # agent -> (previous action, previous reward)

    def sample(self) -> tuple[MultiAgentBatch, dict]:
        """One fragment -> (MultiAgentBatch, metrics with env_steps, agent_steps,
        episode_returns (summed over agents), episode_lengths (env steps) and
        policy_episode_returns (policy id -> each of its agents' episode returns))."""
        returns: list[float] = []
        lengths: list[int] = []
        policy_returns: dict = defaultdict(list)
        chunks: dict = defaultdict(list)
        for _ in range(self.rollout_fragment_length):
            if self._obs is None:
                self._start_episode()
            assert self._obs is not None
            new_obs, rewards, terminateds, truncateds, _ = checked_step(self.env, self._act())
            self._episode.length += 1
            for agent, reward in rewards.items():
                self._episode.agent_returns[agent] += float(reward)
                if agent in self._open:
                    self._open[agent][SampleBatch.REWARDS] += float(reward)
            episode_over = bool(terminateds[ALL] or truncateds[ALL])
            for agent in list(self._open):
                if agent in new_obs or episode_over:
                    done = terminateds.get(agent, False) or terminateds[ALL]
                    cut = truncateds.get(agent, False) or truncateds[ALL]
                    self._close(agent, new_obs.get(agent), bool(done), bool(cut and not done))
            self._obs = {
                a: o for a, o in new_obs.items() if not (terminateds.get(a) or truncateds.get(a))
            }
            if episode_over:
                returns.append(sum(self._episode.agent_returns.values()))
                lengths.append(self._episode.length)
                for agent, value in self._episode.agent_returns.items():
                    policy_returns[self._episode.policy_of[agent]].append(value)
                self._finish_chunks(chunks)
                self._obs = None
        self._finish_chunks(chunks)
        batches = {
            policy_id: concat_samples(
                self.policies[policy_id].postprocess_trajectory(c) for c in cs
            )
            for policy_id, cs in chunks.items()
        }
        batch = MultiAgentBatch(batches, self.rollout_fragment_length)
        metrics = {
            "env_steps": batch.env_steps(),
            "agent_steps": batch.agent_steps(),
            "episode_returns": returns,
            "episode_lengths": lengths,
            "policy_episode_returns": dict(policy_returns),
        }
        return batch, metrics

    def _start_episode(self) -> None:
        seed = None if self._seed is None else int(self._rng.integers(2**31))
        self._obs, _ = self.env.reset(seed=seed)
        self._episode = Episode(int(self._rng.integers(2**62)))
        self._open, self._prev = {}, {}

    def _act(self) -> dict:
        """Every agent in the last obs dict acts with its policy, a batch per policy."""
        assert self._obs is not None
        by_policy: dict = defaultdict(list)
        for agent in self._obs:
            policy_of = self._episode.policy_of
            if agent not in policy_of:
                policy_of[agent] = self.agent_policies.policy_id(agent, self._episode)
            by_policy[policy_of[agent]].append(agent)
        action_dict = {}
        for policy_id, agents in by_policy.items():
            obs = _stack([self._obs[a] for a in agents])
            no_action = spaces.zero_actions(self.policies[policy_id].action_space, 1)[0]
            prev = [self._prev.get(a, (no_action, 0.0)) for a in agents]
            prev_actions = np.asarray([p[0] for p in prev])
            prev_rewards = np.asarray([p[1] for p in prev], np.float32)
            actions, _, extra = self.policies[policy_id].compute_actions(
                obs, None, prev_actions, prev_rewards
            )
            for i, agent in enumerate(agents):
                action = np.asarray(actions)[i]
                action_dict[agent] = action
                self._open[agent] = {
                    SampleBatch.OBS: _row(obs, i),
                    SampleBatch.ACTIONS: action,
                    SampleBatch.REWARDS: 0.0,
                    SampleBatch.PREV_ACTIONS: prev_actions[i],
                    SampleBatch.PREV_REWARDS: prev_rewards[i],
                    **{k: np.asarray(v)[i] for k, v in extra.items()},
                }
        return action_dict

    def _close(self, agent, next_obs, terminated: bool, truncated: bool) -> None:
        row = self._open.pop(agent)
        episode = self._episode
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
        self._prev[agent] = (row[SampleBatch.ACTIONS], row[SampleBatch.REWARDS])
        self._rows[agent].append(row)

    def _finish_chunks(self, chunks: dict) -> None:
        """Each agent's closed rows as one chunk of its policy; unroll ids per chunk."""
        for agent, rows in self._rows.items():
            columns = {key: _stack([r[key] for r in rows]) for key in rows[0]}
            columns[SampleBatch.REWARDS] = columns[SampleBatch.REWARDS].astype(np.float32)
            columns[SampleBatch.UNROLL_ID] = np.full(len(rows), self._rng.integers(2**62))
            chunks[self._episode.policy_of[agent]].append(SampleBatch(columns))
        self._rows = defaultdict(list)


def _stack(values: list):
    """Rows (arrays, or nests of them: a Dict observation) as one batch, nested alike."""
    if not tree.is_nested(values[0]):
        return np.stack([np.asarray(v) for v in values])
    return tree.map_structure(lambda *leaves: np.stack([np.asarray(v) for v in leaves]), *values)


def _row(batch, i: int):
    """Row i of a batch `_stack` made."""
    if not tree.is_nested(batch):
        return batch[i]
    return tree.map_structure(lambda column: column[i], batch)
