"""MultiAgentEnv's step check, the PettingZoo adapter and "pettingzoo:" env names."""

import numpy as np
import pytest
from multi_agent_envs import JoinLeaveEnv, TwoMapsEnv

from policy_service.multi_agent.env import ALL, MultiAgentEnv, MultiAgentEnvError, checked_step
from policy_service.multi_agent.pettingzoo_env import (
    PettingZooEnv,
    PettingZooEnvError,
    TurnBasedPettingZooEnv,
    make_pettingzoo_env,
)


class NoAllEnv(MultiAgentEnv):
    def step(self, action_dict):
        return {}, {}, {"a": True}, {"a": False}, {}


class ParallelCountdown:
    """The PettingZoo parallel API (no "__all__"): "x" leaves after 1 step, "y" after 2."""

    metadata: dict = {}

    def __init__(self, steps: int = 2) -> None:
        self.possible_agents = ["x", "y"]
        self.steps = steps

    def observation_space(self, agent):
        import gymnasium as gym

        return gym.spaces.Discrete(3)

    def action_space(self, agent):
        import gymnasium as gym

        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["x", "y"]
        return {a: 0 for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        terminations = {a: a == "x" or self.t >= self.steps for a in self.agents}
        obs = {a: self.t for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]]
        return obs, {a: 1.0 for a in obs}, terminations, {a: False for a in obs}, {}

    def close(self):
        pass


def parallel_countdown(steps: int = 2) -> ParallelCountdown:
    return ParallelCountdown(steps)


def test_a_step_without_all_is_one_line_naming_the_env():
    with pytest.raises(
        MultiAgentEnvError, match=r"NoAllEnv: step's terminateds dict has no '__all__'"
    ) as err:
        checked_step(NoAllEnv(), {"a": 0})
    assert "\n" not in str(err.value)


def test_agents_join_and_leave_mid_episode():
    env = JoinLeaveEnv()
    obs, _ = env.reset()
    seen = [sorted(obs)]
    done = False
    while not done:
        obs, _, terminateds, _, _ = checked_step(env, {a: 0 for a in obs if a in env.agents})
        seen.append(sorted(a for a in obs if a in env.agents))
        done = terminateds[ALL]
    assert seen == [["main"], ["late", "main"], ["late", "main"], ["late", "main"], ["main"], []]


def test_parallel_env_gets_all_once_no_agent_is_left():
    env = PettingZooEnv(parallel_countdown())
    assert env.possible_agents == ["x", "y"] and env.action_spaces["y"].n == 2
    obs, _ = env.reset(seed=1)
    assert sorted(obs) == ["x", "y"]
    _, _, terminateds, truncateds, _ = checked_step(env, {"x": 0, "y": 1})
    assert terminateds[ALL] is False and env.agents == ["y"]
    _, _, terminateds, truncateds, _ = checked_step(env, {"y": 1})
    assert terminateds[ALL] is True and truncateds[ALL] is False and env.agents == []


def test_aec_envs_go_through_pettingzoos_conversion():
    pytest.importorskip("pettingzoo")  # the .[multiagent] extra
    from pettingzoo.utils.conversions import parallel_to_aec

    env = PettingZooEnv(parallel_to_aec(parallel_countdown()))  # an AEC env PettingZoo made
    obs, _ = env.reset(seed=0)
    assert env.possible_agents == ["x", "y"] and sorted(obs) == ["x", "y"]
    _, rewards, terminateds, _, _ = checked_step(env, {"x": 0, "y": 1})
    assert rewards == {"x": 1.0, "y": 1.0} and terminateds[ALL] is False and env.agents == ["y"]
    _, _, terminateds, _, _ = checked_step(env, {"y": 1})
    assert terminateds[ALL] is True and env.agents == []


def test_a_turn_based_aec_game_is_not_taken_as_a_parallel_one():
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import tictactoe_v3

    with pytest.raises(PettingZooEnvError, match=r"^tictactoe_v3 is a turn-based AEC env"):
        PettingZooEnv(tictactoe_v3.env())


def play_random_game(env, seed: int) -> list:
    """A game of random legal moves -> [(obs dict keys, rewards, terminateds)] per step."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    steps = [(sorted(obs), {}, {})]
    while True:
        [(agent, o)] = obs.items()  # the agent to move, alone
        move = int(rng.choice(np.flatnonzero(o["action_mask"])))
        obs, rewards, terminateds, truncateds, _ = checked_step(env, {agent: move})
        steps.append((sorted(obs), rewards, terminateds))
        if terminateds[ALL] or truncateds[ALL]:
            return steps


def test_a_turn_based_game_shows_the_agent_to_move_and_pays_each_agent_once_at_the_end():
    pytest.importorskip("pettingzoo")
    env = make_pettingzoo_env("pettingzoo:pettingzoo.classic.tictactoe_v3", {})
    assert isinstance(env, TurnBasedPettingZooEnv)
    assert env.possible_agents == ["player_1", "player_2"]
    finals = []
    for seed in range(20):
        steps = play_random_game(env, seed)
        movers = [keys for keys, _, _ in steps[:-1]]
        assert movers == [["player_1"], ["player_2"]] * (len(movers) // 2) + [["player_1"]] * (
            len(movers) % 2
        )
        assert all(not any(r.values()) for _, r, _ in steps[:-1])  # paid only at the end
        keys, rewards, terminateds = steps[-1]
        assert keys == ["player_1", "player_2"] and env.agents == []
        assert terminateds == {"player_1": True, "player_2": True, ALL: True}
        assert sorted(rewards.values()) in ([-1.0, 1.0], [0.0, 0.0])
        finals.append(rewards["player_1"])
    assert {-1.0, 1.0} <= set(finals)  # both sides won some of the random games


def test_a_turn_based_step_without_the_movers_action_is_one_line_naming_it():
    pytest.importorskip("pettingzoo")
    env = make_pettingzoo_env("pettingzoo:pettingzoo.classic.connect_four_v3", {})
    env.reset(seed=0)
    with pytest.raises(MultiAgentEnvError) as refused:
        env.step({"player_1": 0})
    assert "\n" not in str(refused.value)
    assert "it is 'player_0''s move, got actions for ['player_1']" in str(refused.value)


def test_two_maps_env_pays_each_agent_its_own_map():
    env = TwoMapsEnv({"episode_len": 1})
    obs, _ = env.reset(seed=3)
    cue = int(np.argmax(obs["a"][:4]))
    _, rewards, terminateds, _, _ = checked_step(env, {"a": cue, "b": (cue + 1) % 4})
    assert rewards == {"a": 1.0, "b": 1.0} and terminateds[ALL]
