"""A Tune driver loads no TensorFlow: the trainables (algorithms/tune.py), the search
space checks, `policy-service tune`'s command and every registered config class import
without it, and a trial's config is checked and its bundles made without it (the trial's
actor is where the algorithm, and TensorFlow, load). What makes that possible is checked
against what it stands in for: the built-in exploration options against the exploration
classes, the built-in activation names against Keras, the trial's bundles against the
run's own resource asks."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from types import SimpleNamespace

import keras
import pytest

from algorithms import ALGORITHMS, get_algorithm_class, get_config_class
from algorithms.trial_bundles import trial_bundles
from policy_service.config import KERAS_BUILT_IN_ACTIVATIONS, ConfigError, from_dict
from policy_service.policy import exploration
from policy_service.policy.exploration_options import BUILT_IN_OPTIONS

DRIVER_MODULES = (
    "algorithms",
    "algorithms.tune",
    "algorithms.tune_search",
    "algorithms.config_builder",
    "policy_service.cli.commands",
    "policy_service.cli.tune_command",
)
PROBED = ("tensorflow", "keras", "ray.tune")  # ray.tune: the probe sees what was imported
ENVS = {"sac": "Pendulum-v1", "td3": "Pendulum-v1", "cql": "Pendulum-v1"}  # else CartPole
BAD_EXPLORATION = {"type": "EpsilonGreedy", "initial_epsilon": 2.0}  # DQN's type, out of range


def _probe(code: str) -> dict:
    """Which of PROBED a fresh interpreter holds after running `code`, and the `result`
    that code left (JSON)."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps({{'modules': [m for m in {PROBED!r} if m in sys.modules], "
        "'result': result}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_tune_driver_imports_checks_configs_and_asks_bundles_without_tensorflow():
    imports = "\n".join(f"import {module}" for module in DRIVER_MODULES)
    code = f"""{imports}
from algorithms import ALGORITHMS, PPOConfig, get_config_class
from algorithms.tune import trainable
from policy_service.config import ConfigError, from_dict
envs = {ENVS!r}
result = {{}}
for name in ALGORITHMS:
    config = {{"env": envs.get(name, "CartPole-v1")}}
    result[name] = trainable(name).default_resource_request(config).bundles
try:
    from_dict(get_config_class("dqn"), {{"exploration_config": {BAD_EXPLORATION!r}}})
except ConfigError as err:
    result["refused"] = str(err)
"""
    probed = _probe(code)
    assert probed["modules"] == ["ray.tune"]
    assert probed["result"].pop("refused") == _refusal_with_the_exploration_classes()
    assert probed["result"] == {name: [{"CPU": 1.0}] for name in ALGORITHMS}


def _refusal_with_the_exploration_classes() -> str:
    with pytest.raises(ConfigError) as err:
        from_dict(get_config_class("dqn"), {"exploration_config": BAD_EXPLORATION})
    return str(err.value)


def test_the_built_in_exploration_options_are_the_classes_keyword_options():
    for name, rules in BUILT_IN_OPTIONS.items():
        cls = exploration.exploration_class(name)
        options = set(inspect.signature(cls).parameters) - {"action_space"}
        assert set(rules) == options, name
        assert cls.option_rules is rules, name


def test_keras_takes_every_activation_name_known_without_it():
    for name in KERAS_BUILT_IN_ACTIVATIONS:
        assert callable(keras.activations.get(name)), name


@pytest.mark.parametrize(
    "name, config",
    [
        ("ppo", {"num_env_runners": 3, "num_cpus_per_env_runner": 0.5}),
        ("ppo", {"num_env_runners": 2, "custom_resources_per_env_runner": {"sim": 1}}),
        ("ppo", {"num_env_runners": 1, "remote_inference": True}),
        (
            "ppo",
            {
                "num_env_runners": 1,
                "remote_inference": True,
                "num_gpus_per_policy_actor": 0.5,
                "custom_resources_per_policy_actor": {"big": 2},
            },
        ),
        ("ppo", {"num_learners": 2, "num_cpus_per_learner": 0.5, "num_gpus_per_learner": 1}),
        ("ppo", {"num_learners": 2, "num_gpus_per_learner": 1, "_fake_gpus": True}),
        ("ppo", {"num_learners": 1, "custom_resources_per_learner": {"fast": 1}}),
        ("ppo", {"external_env": True}),
        ("impala", {"num_env_runners": 2, "inference": "policy_actors"}),
        ("bc", {"input": "tests"}),
    ],
)
def test_a_trials_bundles_are_the_runs_own_resource_asks(name, config):
    checked = from_dict(get_config_class(name), {"env": "CartPole-v1", **config})
    asks = get_algorithm_class(name).resource_asks(SimpleNamespace(config=checked))
    actors = [
        {resource: float(n) for resource, n in ask.bundle.items() if n > 0}
        for ask in asks
        for _ in range(ask.num_actors)
    ]
    assert trial_bundles(checked)[1:] == [bundle for bundle in actors if bundle]


def test_each_registered_config_class_is_its_algorithms_config_class():
    for name in ALGORITHMS:
        algo_cls = get_algorithm_class(name)
        assert get_config_class(name) is algo_cls.config_class, name
        assert algo_cls.config_class.algorithm_class is algo_cls, name


def test_the_package_gives_each_registered_class_by_name_as_rllibs_does():
    from algorithms import APPO, PPO, Algorithm, PPOConfig, TD3Config
    from algorithms.algorithm import Algorithm as loop
    from algorithms.appo import APPO as appo

    assert (PPO, PPOConfig, TD3Config) == (
        get_algorithm_class("ppo"),
        get_config_class("ppo"),
        get_config_class("td3"),
    )
    assert (APPO, Algorithm) == (appo, loop)
    with pytest.raises(ImportError, match="PPOConfg"):
        from algorithms import PPOConfg  # noqa: F401
