"""multi_agent/policies.py: a run's `policies`, `policy_mapping_fn` and `policies_to_train`
checked against the env's agents, in one line naming what is wrong (the config keys'
own checks, where the config enters: tests/test_algorithm.py)."""

import gymnasium as gym
import numpy as np
import pytest
from fakes import PGPolicy
from multi_agent_envs import JoinLeaveEnv, TwoMapsEnv

from policy_service import PolicySpec
from policy_service.multi_agent.policies import (
    DEFAULT_POLICY_ID,
    MultiAgentConfigError,
    PrefixMapping,
    agent_policies,
)


def build(policies, mapping=None, to_train=None, env=None):
    return agent_policies(policies, mapping, to_train, env or TwoMapsEnv(), PGPolicy, {"lr": 1e-3})


def test_spaces_come_from_the_agents_mapped_and_configs_layer():
    env = TwoMapsEnv()
    found = build(
        {"pa": None, "pb": PolicySpec(config={"lr": 5e-4})},
        lambda agent, episode, **kw: "p" + agent,
    )
    assert found.specs["pa"].policy_class is PGPolicy
    assert found.specs["pa"].observation_space == env.observation_spaces["a"]
    assert found.specs["pb"].action_space == env.action_spaces["b"]
    assert found.specs["pa"].config == {"lr": 1e-3} and found.specs["pb"].config == {"lr": 5e-4}
    assert found.policies_to_train == ["pa", "pb"]
    shared = build({DEFAULT_POLICY_ID: None}, to_train=[DEFAULT_POLICY_ID])
    assert shared.policy_id("b", None) == DEFAULT_POLICY_ID


def test_an_unknown_policy_id_from_the_mapping_names_agent_and_id():
    with pytest.raises(
        MultiAgentConfigError,
        match=r"maps agent 'a' to policy 'pa', which is no policy in config.policies "
        r"\['default_policy'\]",
    ):
        build({DEFAULT_POLICY_ID: None}, lambda agent, episode, **kw: "p" + agent)


def test_an_agent_whose_spaces_disagree_names_agent_and_policy():
    other = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    with pytest.raises(
        MultiAgentConfigError,
        match=r"agent 'a' has observation space Box.* but its policy 'p' has Box.*\(3,\)",
    ) as err:
        build({"p": PolicySpec(observation_space=other)}, lambda agent, episode, **kw: "p")
    assert "\n" not in str(err.value)
    with pytest.raises(
        MultiAgentConfigError,
        match=r"agent 'main' has action space Discrete\(2\) but its policy 'p' has Discrete\(4\)",
    ):
        build(
            {"p": PolicySpec(action_space=gym.spaces.Discrete(4))},
            lambda agent, episode, **kw: "p",
            env=JoinLeaveEnv(),
        )


def test_a_mapping_by_agent_id_prefix_takes_the_longest_prefix_matching():
    mapping = PrefixMapping({"m": "m", "ma": "mn", "l": "l"})
    assert [mapping(a, None) for a in ("main", "late", "m")] == ["mn", "l", "m"]
    with pytest.raises(
        MultiAgentConfigError,
        match=r"agent 'x_0' starts with none of the prefixes \['l', 'm', 'ma'\]",
    ):
        mapping("x_0", None)
    found = build({"pm": None, "pl": None}, {"m": "pm", "l": "pl"}, env=JoinLeaveEnv())
    assert (found.policy_id("main", None), found.policy_id("late", None)) == ("pm", "pl")
