"""Multi-agent envs of the tests' own (no TensorFlow here).

`TwoMapsEnv`: two agents see the same random cue k in 0..3 plus their own index, and
each is paid 1 for a different map of it ("a": action k, "b": action (k + 1) % 4);
both act every step, so agent steps are twice the env steps; `two_maps_config` runs PPO
on it (registered as "two_maps") with a policy per agent, "pa" and "pb" (`by_agent`).
`JoinLeaveEnv`: a 5-step episode where "late" joins at t=1 and leaves after t=3, with
rewards a test can check advantages against by hand.
`TwoCartPoles`: agents "a" and "b" each balance their own CartPole-v1; an agent leaves
when its pole falls, the episode ends when both have (or at 500 steps).
`PaidBeforeObservingEnv`: agents paid before they ever observe (RLlib's flex agents'
case), and an agent terminated in the step that truncates the episode.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from policy_service.multi_agent.env import ALL, MultiAgentEnv

CUES = 4
RANDOM_RETURN = 8 / CUES  # TwoMapsEnv: an 8-step episode, one action in CUES paid
# agent a's and agent b's paid action for each cue
A_MAP, B_MAP = list(range(CUES)), [(c + 1) % CUES for c in range(CUES)]


def by_agent(agent, episode, **kwargs):
    return "p" + agent


def two_maps_config(**changes) -> dict:
    return {
        "env": "two_maps",
        "seed": 0,
        "train_batch_size": 512,
        "minibatch_size": 128,
        "num_epochs": 8,
        "lr": 3e-3,
        "model": {"fcnet_hiddens": [32]},
        "policies": {"pa": None, "pb": None},
        "policy_mapping_fn": by_agent,
        **changes,
    }


def greedy_actions(policy, agent_index: int) -> list:
    """The policy's greedy action for each cue, seen as agent `agent_index`."""
    obs = np.zeros((CUES, CUES + 2), np.float32)
    obs[np.arange(CUES), np.arange(CUES)] = 1.0
    obs[:, CUES + agent_index] = 1.0
    return np.asarray(policy.compute_actions(obs, explore=False)[0]).tolist()


def train_until_policies_reach(algo, policy_ids, iterations=20, target=0.8 * 8):
    """Train until each of `policy_ids` earns `target` of the 8 an episode pays, or for
    `iterations` iterations -> the last result."""
    for _ in range(iterations):
        result = algo.train()
        if all(result["policy_reward_mean"][p] >= target for p in policy_ids):
            break
    return result


class TwoMapsEnv(MultiAgentEnv):
    """env_config "continuous": true gives each agent a Box(-1, 1, (1,)) action, paid
    1 - |action - its target's place in [-1, 1]| / 2 instead."""

    def __init__(self, config: dict | None = None) -> None:
        config = config or {}
        self.episode_len = config.get("episode_len", 8)
        self.continuous = bool(config.get("continuous", False))
        self.possible_agents = ["a", "b"]
        space = gym.spaces.Box(0.0, 1.0, (CUES + 2,), np.float32)
        self.observation_spaces = {a: space for a in self.possible_agents}
        action_space = (
            gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            if self.continuous
            else gym.spaces.Discrete(CUES)
        )
        self.action_spaces = {a: action_space for a in self.possible_agents}
        self.rng = np.random.default_rng(config.get("seed", 0))
        self.agents = []

    def _obs(self) -> dict:
        obs = {}
        for index, agent in enumerate(self.agents):
            o = np.zeros(CUES + 2, np.float32)
            o[self.cue] = 1.0
            o[CUES + index] = 1.0
            obs[agent] = o
        return obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.agents = 0, list(self.possible_agents)
        self.cue = int(self.rng.integers(CUES))
        return self._obs(), {a: {} for a in self.agents}

    def step(self, action_dict):
        targets = {"a": self.cue, "b": (self.cue + 1) % CUES}
        if self.continuous:
            places = {a: 2 * k / (CUES - 1) - 1 for a, k in targets.items()}
            rewards = {a: 1 - abs(float(action_dict[a][0]) - places[a]) / 2 for a in action_dict}
        else:
            rewards = {a: float(action_dict[a] == targets[a]) for a in action_dict}
        self.t += 1
        self.cue = int(self.rng.integers(CUES))
        done = self.t >= self.episode_len
        dones = {a: done for a in self.agents}
        obs = self._obs()
        if done:
            self.agents = []
        return obs, rewards, {**dones, ALL: done}, {a: False for a in dones} | {ALL: False}, {}


class JoinLeaveEnv(MultiAgentEnv):
    """ "main" acts at t=0..4; "late" acts at t=1..3 and is terminated by its step at t=3.
    Rewards: main gets t + 1 for its step at t, late gets 10 * (t + 1)."""

    def __init__(self, config: dict | None = None) -> None:
        self.possible_agents = ["main", "late"]
        space = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
        self.observation_spaces = {a: space for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self.agents = []

    def _obs(self, agents) -> dict:
        return {a: np.array([self.t, i], np.float32) for i, a in enumerate(agents)}

    def reset(self, *, seed=None, options=None):
        self.t, self.agents = 0, ["main"]
        return self._obs(["main"]), {}

    def step(self, action_dict):
        t = self.t
        rewards = {"main": float(t + 1)} | (
            {"late": 10.0 * (t + 1)} if "late" in action_dict else {}
        )
        self.t += 1
        terminateds = {ALL: self.t == 5}
        if self.t == 5:
            terminateds["main"] = True
        if "late" in action_dict and t == 3:
            terminateds["late"] = True
        self.agents = ["main"] + (["late"] if 1 <= self.t <= 3 else [])
        obs = self._obs(self.agents) if self.t < 5 else self._obs(["main"])
        if self.t == 4:  # late left with its last step; its final obs comes with it
            obs["late"] = np.array([4.0, 1.0], np.float32)
        if self.t == 5:
            self.agents = []
        return obs, rewards, terminateds, {ALL: False}, {}


class TwoCartPoles(MultiAgentEnv):
    def __init__(self, config: dict | None = None) -> None:
        self.possible_agents = ["a", "b"]
        self.envs = {a: gym.make("CartPole-v1") for a in self.possible_agents}
        self.observation_spaces = {a: e.observation_space for a, e in self.envs.items()}
        self.action_spaces = {a: e.action_space for a, e in self.envs.items()}
        self.agents = []

    def reset(self, *, seed=None, options=None):
        self.agents = list(self.possible_agents)
        obs = {}
        for index, (agent, env) in enumerate(self.envs.items()):
            obs[agent], _ = env.reset(seed=None if seed is None else seed + index)
        return obs, {}

    def step(self, action_dict):
        obs, rewards, terminateds, truncateds = {}, {}, {}, {}
        for agent, action in action_dict.items():
            o, r, terminated, truncated, _ = self.envs[agent].step(int(action))
            obs[agent], rewards[agent] = o, float(r)
            terminateds[agent], truncateds[agent] = terminated, truncated
            if terminated or truncated:
                self.agents.remove(agent)
        over = not self.agents
        terminateds[ALL] = over and any(terminateds.values())
        truncateds[ALL] = over and not terminateds[ALL]
        return obs, rewards, terminateds, truncateds, {}

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


class PaidBeforeObservingEnv(MultiAgentEnv):
    """A 5-step episode, truncated by a time limit at step 5 (steps count from 1):
    "main" observes and acts at every step, paid 1 each, and is terminated by step 5;
    "late" is paid 5 by step 1 and 7 by step 2, whose obs is its first; it acts in
    steps 3 and 4, paid 100 for each, and step 4 terminates it;
    "ghost" is paid 3 by step 4 and never observes."""

    def __init__(self, config: dict | None = None) -> None:
        self.possible_agents = ["main", "late", "ghost"]
        space = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
        self.observation_spaces = {a: space for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self.agents = []

    def _obs(self, agents) -> dict:
        return {a: np.array([self.t, i], np.float32) for i, a in enumerate(agents)}

    def reset(self, *, seed=None, options=None):
        self.t, self.agents = 0, ["main"]
        return self._obs(self.agents), {}

    def step(self, action_dict):
        self.t += 1
        paid = {1: {"late": 5.0}, 2: {"late": 7.0}, 4: {"ghost": 3.0}}.get(self.t, {})
        rewards = {"main": 1.0, **paid} | ({"late": 100.0} if "late" in action_dict else {})
        terminateds, truncateds = {ALL: False}, {ALL: self.t == 5}
        obs = self._obs(["main", "late"] if 2 <= self.t <= 4 else ["main"])
        if self.t == 4:
            terminateds["late"] = True
        if self.t == 5:
            terminateds["main"] = True
        self.agents = [a for a in obs if not terminateds.get(a)] if self.t < 5 else []
        return obs, rewards, terminateds, truncateds, {}
