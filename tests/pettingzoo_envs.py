"""A tiny PettingZoo ParallelEnv of the tests' own, for "pettingzoo:" env names
(no TensorFlow here): `parallel_two_maps` is TwoMapsEnv (multi_agent_envs.py) behind
PettingZoo's parallel API, so done dicts carry no "__all__" and the adapter adds it."""

from __future__ import annotations

from multi_agent_envs import TwoMapsEnv
from pettingzoo import ParallelEnv

from policy_service.multi_agent.env import ALL


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
