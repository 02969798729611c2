"""A tiny PettingZoo ParallelEnv of the tests' own, for "pettingzoo:" env names
(no TensorFlow here): `parallel_two_maps` is TwoMapsEnv (multi_agent_envs.py) behind
PettingZoo's parallel API, so done dicts carry no "__all__" and the adapter adds it."""

from __future__ import annotations

import numpy as np
from multi_agent_envs import TwoMapsEnv
from pettingzoo import ParallelEnv

from policy_service.multi_agent.env import ALL, checked_step
from policy_service.multi_agent.pettingzoo_env import make_pettingzoo_env

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"


class ParallelTwoMaps(ParallelEnv):
    metadata = {"name": "parallel_two_maps"}

    def __init__(self, episode_len: int = 8) -> None:
        self.maps = TwoMapsEnv({"episode_len": episode_len})
        self.possible_agents = list(self.maps.possible_agents)
        self.agents = []

    def observation_space(self, agent):
        return self.maps.observation_spaces[agent]

    def action_space(self, agent):
        return self.maps.action_spaces[agent]

    def reset(self, seed=None, options=None):
        obs, infos = self.maps.reset(seed=seed)
        self.agents = list(self.maps.agents)
        return obs, infos

    def step(self, actions):
        obs, rewards, terminateds, truncateds, infos = self.maps.step(actions)
        self.agents = list(self.maps.agents)
        terminations = {a: d for a, d in terminateds.items() if a != ALL}
        truncations = {a: d for a, d in truncateds.items() if a != ALL}
        return obs, rewards, terminations, truncations, infos


def parallel_two_maps(episode_len: int = 8) -> ParallelTwoMaps:
    return ParallelTwoMaps(episode_len)


def games_won_against_random(policy, games: int, seed: int, name: str = CONNECT_FOUR) -> float:
    """The share of `games` the policy (greedy) wins against a uniformly random legal
    player, moving first in half of them; an illegal move would end the test."""
    env = make_pettingzoo_env(name, {})
    rng = np.random.default_rng(seed)
    wins = 0
    for game in range(games):
        learner = env.possible_agents[game % 2]
        obs, _ = env.reset(seed=seed + game)
        result, over = 0.0, False
        while not over:
            [(agent, observation)] = obs.items()
            legal = np.flatnonzero(observation["action_mask"])
            if agent == learner:
                move = int(policy.compute_single_action(observation, explore=False)[0])
                assert move in legal, (move, legal)
            else:
                move = int(rng.choice(legal))
            obs, rewards, terminateds, truncateds, _ = checked_step(env, {agent: move})
            result += rewards.get(learner, 0.0)
            over = terminateds[ALL] or truncateds[ALL]
        wins += result > 0
    env.close()
    return wins / games
