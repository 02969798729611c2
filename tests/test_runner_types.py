"""policy_service/distributed/runner_types.py: where samples come from is a registered
type chosen once. The configs here are plain namespaces holding the keys a runner type
reads; an algorithm's config choosing its type, and the keys multi-agent runs do not
take yet: test_algorithm_config.py."""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest

from policy_service.distributed import runner_types

ENV_RUNNER_KEYS = {
    "num_env_runners": 2,
    "num_cpus_per_env_runner": 1,
    "custom_resources_per_env_runner": {},
    "remote_inference": False,
}


def test_the_config_chooses_the_runner_type_once():
    assert runner_types.runner_type(SimpleNamespace()) == "env"
    assert runner_types.runner_type(SimpleNamespace(input="sampler")) == "env"
    assert runner_types.runner_type(SimpleNamespace(external_env=True)) == "external_env"
    assert runner_types.runner_type(SimpleNamespace(input="logs/", external_env=True)) == "offline"
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
    asks = module.resource_asks(SimpleNamespace(**ENV_RUNNER_KEYS))
    assert [(a.role, a.num_actors) for a in asks] == [("env runner", 2)]
