"""Config `policies`, `policy_mapping_fn`, `policies_to_train`, `count_steps_by`: checked
where the config enters and against the env's agents, in one line naming what is wrong."""

import gymnasium as gym
import numpy as np
import pytest
from multi_agent_envs import JoinLeaveEnv, TwoMapsEnv

from algorithms.ppo import PPOConfig, PPOPolicy
from policy_service import PolicySpec
from policy_service.config import from_dict
from policy_service.multi_agent.policies import (
    DEFAULT_POLICY_ID,
    MultiAgentConfigError,
    PrefixMapping,
    agent_policies,
)


def test_without_policies_the_config_is_as_before():
    config = from_dict(PPOConfig, {})
    assert config.policies is None and config.policy_mapping_fn is None
    assert config.policies_to_train is None and config.count_steps_by == "env_steps"


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"policies_to_train": ["a"]},
            r"config.policies_to_train is set but config.policies is not",
        ),
        (
            {"policies": {"a": None}, "policies_to_train": ["b"]},
            r"names 'b', which is no policy in config.policies \['a'\]",
        ),
        (
            {"policies": {"a": "PPO"}},
            r"config.policies\['a'\] must map a str id to None or a PolicySpec, got str",
        ),
        ({"policies": {}}, r"must name at least one policy"),
        ({"count_steps_by": "steps"}, r"count_steps_by"),
        (
            {"policies": {"a": None}, "policy_mapping_fn": {"agent_": "b"}},
            r"config.policy_mapping_fn maps prefix 'agent_' to 'b', which is no policy in "
            r"config.policies \['a'\]",
        ),
        (
            {"policies": {"a": None}, "policy_mapping_fn": {"": "a"}},
            r"config.policy_mapping_fn: an agent-id prefix must be a non-empty str, got ''",
        ),
        ({"policies": {"a": None}, "policy_mapping_fn": {}}, r"at least one agent-id prefix"),
    ],
)
def test_bad_multi_agent_keys_are_one_line_naming_the_key(values, message):
    with pytest.raises(ValueError, match=message) as err:
        from_dict(PPOConfig, values)
    assert "\n" not in str(err.value)


def build(policies, mapping=None, to_train=None, env=None):
    return agent_policies(policies, mapping, to_train, env or TwoMapsEnv(), PPOPolicy, {"lr": 1e-3})


def test_spaces_come_from_the_agents_mapped_and_configs_layer():
    env = TwoMapsEnv()
    found = build(
        {"pa": None, "pb": PolicySpec(config={"lr": 5e-4})},
        lambda agent, episode, **kw: "p" + agent,
    )
    assert found.specs["pa"].policy_class is PPOPolicy
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
