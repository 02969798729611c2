"""algorithms/config_builder.py: RLlib's builder methods on every algorithm's config class."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from algorithms import ALGORITHMS, get_algorithm_class
from algorithms.config_builder import GROUPS, ConfigBuilder
from algorithms.ppo import PPO, PPOConfig
from policy_service import Callbacks
from policy_service.config import ConfigError

METHODS = {
    "environment": {"env": "CartPole-v1"},
    "env_runners": {"num_env_runners": 0},
    "training": {"lr": 1e-3},
    "resources": {"num_gpus": 0},
    "learners": {"num_learners": 0},
    "evaluation": {"evaluation_interval": 2},
    "multi_agent": {"count_steps_by": "env_steps"},
    "debugging": {"seed": 3},
    "reporting": {"metrics_num_episodes_for_smoothing": 20},
    "offline_data": {"input_": "sampler", "output_max_file_size": 1 << 20},  # RLlib's input_
    "framework": {"framework": "tf2"},
    "api_stack": {"enable_rl_module_and_learner": False},
}


class Probe(Callbacks):
    pass


METHODS["callbacks"] = {"callbacks_class": Probe}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_has_a_builder_whose_methods_name_no_config_key(name):
    config_class = get_algorithm_class(name).config_class
    methods = {m for m in dir(ConfigBuilder) if not m.startswith("_")}
    fields = {f.name for f in dataclasses.fields(config_class)}
    assert not methods & fields  # a key named like a method would hide it
    config = config_class().environment("CartPole-v1" if name != "sac" else "Pendulum-v1")
    assert isinstance(config, config_class) and config.env


def test_the_builder_sets_the_keys_rllib_names_and_round_trips():
    config = (
        PPOConfig()
        .environment("CartPole-v1", env_config={"max_episode_steps": 100})
        .framework("tf2")
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .env_runners(num_env_runners=2, rollout_fragment_length=64)
        .training(lr=3e-4, lambda_=0.95, train_batch_size=512, model={"fcnet_hiddens": [32]})
        .resources(num_gpus=0)
        .evaluation(evaluation_interval=2, evaluation_config={"explore": False})
        .callbacks(Probe)
        .multi_agent(policies={"a", "b"}, policy_mapping_fn={"agent": "a"})
        .debugging(seed=7)
        .reporting(metrics_num_episodes_for_smoothing=10)
    )
    assert (config.lr, config.lambda_, config.num_env_runners, config.seed) == (3e-4, 0.95, 2, 7)
    assert config.model.fcnet_hiddens == [32] and config.env_config == {"max_episode_steps": 100}
    assert config.policies == {"a": None, "b": None}
    assert config.callbacks_class is Probe
    assert config.callbacks() is config and config.callbacks_class is Probe  # RLlib: no change
    flat = config.to_dict()
    assert flat["callbacks"] is Probe and "callbacks_class" not in flat  # RLlib's flat key
    again = PPOConfig.from_dict(flat)
    assert again == config and again.to_dict() == flat
    copied = config.copy()
    copied.training(lr=1e-2)
    assert config.lr == 3e-4  # a copy is its own
    assert PPOConfig().update_from_dict({"lr": 2e-3, "callbacks": Probe}).callbacks_class is Probe


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_refuses_an_unknown_keyword_in_one_line_naming_it(method):
    config = PPOConfig()
    before = config.to_dict()
    with pytest.raises(ConfigError) as raised:
        getattr(config, method)(**{**METHODS[method], "not_a_key": 1})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"PPOConfig.{method}(): unknown keyword 'not_a_key'")
    # with the method's known keywords: its own, not another method's
    head, _, known = message.partition(" (its keywords: ")
    assert known.endswith(")")
    known_keywords = set(known[:-1].split(", "))
    assert set(METHODS[method]) <= known_keywords
    for other, keywords in METHODS.items():
        if other != method:
            assert not set(keywords) & known_keywords, other
    assert config.to_dict() == before  # nothing was set
    getattr(config, method)(**METHODS[method])  # its own keywords are taken


def test_a_bad_value_is_one_line_and_changes_nothing():
    config = PPOConfig().training(lr=1e-3)
    for call, expected in [
        (lambda: config.training(lr=-1.0, gamma=0.5), "PPOConfig.training(): config.lr must be"),
        (lambda: config.env_runners(lr=1e-3), "PPOConfig.env_runners(): unknown keyword 'lr'"),
        (lambda: config.framework("torch"), "PPOConfig.framework(): this project runs"),
        (
            lambda: config.api_stack(enable_rl_module_and_learner=True),
            "PPOConfig.api_stack(): enable_rl_module_and_learner=True",
        ),
        (lambda: config.evaluation(evaluation_interval=0), "config.evaluation_interval must be"),
        (
            lambda: config.evaluation(evaluation_duration_unit="days"),
            "config.evaluation_duration_unit must be",
        ),
    ]:
        with pytest.raises(ValueError) as raised:
            call()
        assert expected in str(raised.value) and "\n" not in str(raised.value)
    assert (config.lr, config.gamma) == (1e-3, PPOConfig().gamma)
    with pytest.raises(TypeError, match=r"PPOConfig.training\(\): config.lr must be float"):
        config.training(lr="fast")


def test_every_group_names_keys_of_the_configs():
    fields = set().union(
        *(
            {f.name for f in dataclasses.fields(get_algorithm_class(n).config_class)}
            for n in ALGORITHMS
        )
    )
    offline = set(GROUPS["offline_data"])  # the offline keys come with the offline issue
    assert set().union(*GROUPS.values()) - fields <= offline | {"off_policy_estimation_methods"}


@pytest.mark.slow  # one PPO iteration on CartPole: ~10 s here
def test_build_algo_builds_the_registered_algorithm_from_a_copy():
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .debugging(seed=0)
    )
    algo = config.build()
    try:
        assert type(algo) is PPO and algo.config is not config
        assert algo.train()["timesteps_total"] >= 128
    finally:
        algo.stop()


def test_offline_data_takes_rllibs_input_spelling_for_input(tmp_path):
    (tmp_path / "part.json").write_text("")
    config = PPOConfig().offline_data(input_=str(tmp_path)).to_dict()
    assert config["input"] == str(tmp_path)
    assert "input_" not in config


def test_the_config_builder_takes_the_keys_where_rllib_has_them():
    config = (
        PPOConfig()
        .env_runners(
            custom_resources_per_env_runner={"node_1": 0.01},
            custom_resources_per_policy_actor={"node_2": 0.01},
        )
        .learners(
            custom_resources_per_learner={"node_2": 0.5}, learner_placement_strategy="STRICT_SPREAD"
        )
        .to_dict()
    )
    assert config["custom_resources_per_env_runner"] == {"node_1": 0.01}
    assert config["custom_resources_per_policy_actor"] == {"node_2": 0.01}
    assert config["custom_resources_per_learner"] == {"node_2": 0.5}
    assert config["learner_placement_strategy"] == "STRICT_SPREAD"


def test_a_config_class_loaded_without_its_algorithm_builds_its_own():
    """`from algorithms import PPOConfig` loads no algorithm; APPOConfig and BCConfig
    inherit IMPALA's and MARWIL's `algorithm_class` once those are defined: each still
    builds its own algorithm (a fresh interpreter, where nothing else was imported)."""
    code = (
        "from algorithms import APPOConfig, BCConfig, PPOConfig\n"
        "from algorithms.config_builder import configured_algorithm\n"
        "first = configured_algorithm(PPOConfig).__name__\n"
        "import algorithms.impala, algorithms.marwil\n"
        "class MyPPOConfig(PPOConfig): pass\n"
        "print(first, *(configured_algorithm(c).__name__ for c in "
        "(APPOConfig, BCConfig, MyPPOConfig)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["PPO", "APPO", "BC", "PPO"]
