"""The ranges of the algorithm loop's keys (AlgorithmConfig) and PPO's (PPOConfig):
each value out of range is one line naming the key, the range and the value; each
value at the edge of its range is taken; every field has a doc; the config chooses the
runner type and refuses, in one line, what multi-agent runs do not take yet. The
machinery and the policy's and model's ranges: test_config.py."""

import dataclasses
import math

import pytest
from config_ranges import assert_out_of_range_is_one_line, assert_taken
from multi_agent_envs import two_maps_config

from algorithms.algorithm import AlgorithmConfig
from algorithms.ppo import PPOConfig
from policy_service.config import ConfigError, ConfigTypeError, field_docs, from_dict
from policy_service.distributed import runner_types

POSITIVE = "a finite number > 0"
NON_NEGATIVE = "a finite number >= 0"
UNIT_INTERVAL = "a finite number in [0, 1]"

# (config class, key, a value out of range, what the range is)
OUT_OF_RANGE = [
    (AlgorithmConfig, "num_env_runners", -1, "an integer >= 0"),
    (AlgorithmConfig, "num_envs_per_env_runner", 0, "an integer >= 1"),
    (AlgorithmConfig, "num_cpus_per_env_runner", -0.5, NON_NEGATIVE),
    (AlgorithmConfig, "rollout_fragment_length", 0, "'auto' or an integer >= 1"),
    (AlgorithmConfig, "rollout_fragment_length", "full", "'auto' or an integer >= 1"),
    (AlgorithmConfig, "vectorize_mode", "threads", "one of ['sync', 'async']"),
    (AlgorithmConfig, "train_batch_size", 0, "an integer >= 1"),
    (AlgorithmConfig, "metrics_num_episodes_for_smoothing", 0, "an integer >= 1"),
    (AlgorithmConfig, "ray_num_cpus", 0, "None or an integer >= 1"),
    (AlgorithmConfig, "max_policy_actor_restarts", -1, "an integer >= 0"),
    (PPOConfig, "lr", -1, POSITIVE),  # redeclared with PPO's default, the check kept
    (PPOConfig, "gamma", 1.01, UNIT_INTERVAL),
    (PPOConfig, "num_epochs", 0, "an integer >= 1"),
    (PPOConfig, "lambda_", 1.5, UNIT_INTERVAL),
    (PPOConfig, "lambda_", -0.5, UNIT_INTERVAL),
    (PPOConfig, "clip_param", 0, POSITIVE),
    (PPOConfig, "vf_clip_param", -1, POSITIVE),
    (PPOConfig, "kl_target", 0, POSITIVE),
    (PPOConfig, "kl_coeff", -0.2, NON_NEGATIVE),
    (PPOConfig, "kl_coeff", math.nan, NON_NEGATIVE),
    (PPOConfig, "entropy_coeff", -0.01, NON_NEGATIVE),
    (PPOConfig, "vf_loss_coeff", -1, NON_NEGATIVE),
]


@pytest.mark.parametrize(
    "cls, key, value, expected",
    OUT_OF_RANGE,
    ids=[f"{c.__name__}.{k}={v!r}" for c, k, v, _ in OUT_OF_RANGE],
)
def test_out_of_range_value_is_one_line_naming_key_range_and_value(cls, key, value, expected):
    assert_out_of_range_is_one_line(cls, key, value, expected)


# (config class, key, a value at or inside the edge of its range)
IN_RANGE = [
    (AlgorithmConfig, "num_env_runners", 0),
    (AlgorithmConfig, "rollout_fragment_length", 1),
    (AlgorithmConfig, "num_cpus_per_env_runner", 0),
    (AlgorithmConfig, "ray_num_cpus", None),
    (AlgorithmConfig, "max_policy_actor_restarts", 0),
    (PPOConfig, "lambda_", 0),
    (PPOConfig, "lambda_", 1),
    (PPOConfig, "kl_coeff", 0),
    (PPOConfig, "entropy_coeff", 0),
    (PPOConfig, "minibatch_size", 4000),
]


@pytest.mark.parametrize(
    "cls, key, value", IN_RANGE, ids=[f"{c.__name__}.{k}={v!r}" for c, k, v in IN_RANGE]
)
def test_values_at_the_edge_of_their_range_are_taken(cls, key, value):
    assert_taken(cls, key, value)


def test_ppo_minibatch_larger_than_the_train_batch_names_both():
    with pytest.raises(ConfigError) as err:
        from_dict(PPOConfig, {"train_batch_size": 256, "minibatch_size": 512})
    assert str(err.value) == ("config.minibatch_size must be <= train_batch_size (256), got 512")


def test_an_algorithm_config_built_directly_or_replaced_is_checked_too():
    with pytest.raises(ConfigError, match="config.clip_param"):
        PPOConfig(clip_param=0.0)
    with pytest.raises(ConfigTypeError, match="config.num_epochs must be int"):
        PPOConfig(num_epochs=2.5)
    with pytest.raises(ConfigError, match="config.num_env_runners"):
        dataclasses.replace(PPOConfig(), num_env_runners=-1)


def test_an_algorithm_config_chooses_its_runner_type_and_holds_what_it_reads():
    assert runner_types.runner_type(PPOConfig()) == "env"
    assert runner_types.runner_type(PPOConfig(external_env=True)) == "external_env"
    module = runner_types.runner_type_module("env")
    asks = module.resource_asks(PPOConfig(num_env_runners=2))
    assert [(a.role, a.num_actors) for a in asks] == [("env runner", 2)]


@pytest.mark.parametrize(
    "key, value",
    [("observation_filter", "MeanStdFilter"), ("vectorize_mode", "async"), ("external_env", True)],
)
def test_what_multi_agent_runs_do_not_take_yet_is_one_line_naming_it(key, value):
    with pytest.raises(ConfigError) as raised:
        from_dict(PPOConfig, two_maps_config(**{key: value}))
    message = str(raised.value)
    assert message.startswith(f"config.{key} must keep its default with policies set")
    assert "\n" not in message


def test_ppo_names_its_own_keys_when_a_key_is_misspelt():
    with pytest.raises(ConfigError) as err:
        from_dict(PPOConfig, {"entropy_coef": 0.01})
    assert "'entropy_coef' (did you mean 'entropy_coeff'" in str(err.value)


@pytest.mark.parametrize("cls", [AlgorithmConfig, PPOConfig])
def test_every_field_has_a_doc(cls):
    docs = field_docs(cls)
    assert set(docs) == {f.name for f in dataclasses.fields(cls)}
    missing = sorted(name for name, doc in docs.items() if not doc.strip())
    assert not missing, f"{cls.__name__} fields without a doc: {missing}"
