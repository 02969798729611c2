"""policy_service/distributed/runner_types.py: where samples come from is a registered
type chosen once; features that multi-agent runs do not take yet are one line."""

from __future__ import annotations

import types

import pytest
from multi_agent_envs import TwoMapsEnv
from multi_agent_envs import two_maps_config as config

from algorithms import register_env
from algorithms.ppo import PPO, PPOConfig
from policy_service.config import ConfigError
from policy_service.distributed import runner_types

register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))


def test_the_config_chooses_the_runner_type_once():
    assert runner_types.runner_type(PPOConfig()) == "env"
    assert runner_types.runner_type(PPOConfig(external_env=True)) == "external_env"
    for kind in ("env", "external_env"):
        module = runner_types.runner_type_module(kind)
        assert callable(module.build) and callable(module.resource_asks)
    with pytest.raises(ValueError, match=r"unknown runner type 'tape'; known: \['env', 'ext"):
        runner_types.runner_type_module("tape")


def test_a_new_source_is_a_module_and_a_registration(monkeypatch):
    monkeypatch.setattr(runner_types, "RUNNER_TYPES", dict(runner_types.RUNNER_TYPES))
    runner_types.register_runner_type("env_again", "policy_service.distributed.env_runner_type")
    module = runner_types.runner_type_module("env_again")
    assert isinstance(module, types.ModuleType)
    asks = module.resource_asks(PPOConfig(num_env_runners=2))
    assert [(a.role, a.num_actors) for a in asks] == [("env runner", 2)]


@pytest.mark.parametrize(
    "key, value",
    [("observation_filter", "MeanStdFilter"), ("vectorize_mode", "async"), ("external_env", True)],
)
def test_what_multi_agent_runs_do_not_take_yet_is_one_line_naming_it(key, value):
    with pytest.raises(ConfigError) as raised:
        PPO(config(**{key: value}))
    message = str(raised.value)
    assert message.startswith(f"config.{key} must keep its default with policies set")
    assert "\n" not in message
