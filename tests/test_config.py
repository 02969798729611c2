"""config.py: a plain dict validated into dataclasses; bad keys and values are named.

Every range a policy's and a model's config value must keep is tested here, with the
exact one-line message; the algorithm loop's and PPO's: test_algorithm_config.py.
"""

import dataclasses
import math
from dataclasses import dataclass

import pytest
from config_ranges import assert_out_of_range_is_one_line, assert_taken
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config

from policy_service.config import (
    ConfigError,
    ConfigTypeError,
    config_value,
    field_check,
    field_docs,
    from_dict,
    setting,
)
from policy_service.config_rules import integer
from policy_service.policy.policy_config import ModelConfig, PolicyConfig


def test_empty_and_none_give_the_defaults():
    assert from_dict(PolicyConfig, None) == PolicyConfig()
    assert from_dict(PolicyConfig, {}) == PolicyConfig()
    assert PolicyConfig().model == ModelConfig()


def test_known_keys_are_taken_and_ints_become_floats():
    config = from_dict(
        PolicyConfig,
        {
            "lr": 1,
            "num_gpus": 2,
            "_fake_gpus": True,
            "grad_clip": 40,
            "seed": 3,
            "model": {"fcnet_hiddens": [8], "use_lstm": True},
        },
    )
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.num_gpus == 2.0 and isinstance(config.num_gpus, float)
    assert config.grad_clip == 40
    assert config._fake_gpus is True and config.seed == 3
    assert isinstance(config.model, ModelConfig)
    assert config.model.fcnet_hiddens == [8] and config.model.use_lstm is True
    assert config.model.lstm_cell_size == 256  # untouched keys keep defaults


def test_a_config_object_passes_through_and_a_dataclass_is_revalidated():
    config = PolicyConfig(lr=0.5)
    assert from_dict(PolicyConfig, config) is config
    model = from_dict(ModelConfig, ModelConfig(lstm_cell_size=4))
    assert model.lstm_cell_size == 4


def test_to_dict_round_trips():
    config = from_dict(PolicyConfig, small_config(num_gpus=2, _fake_gpus=True))
    assert from_dict(PolicyConfig, config.to_dict()) == config


def test_unknown_key_error_names_the_key():
    with pytest.raises(ValueError) as err:
        from_dict(PolicyConfig, {"lr": 0.1, "learning_rate": 0.1})
    assert "'learning_rate'" in str(err.value)
    assert "unknown config key" in str(err.value)


def test_unknown_key_error_names_the_closest_keys_and_the_listing_in_one_short_line():
    with pytest.raises(ConfigError) as err:
        from_dict(PolicyConfig, {"lr": 0.1, "num_gpu": 1, "grad_clp": 0.5})
    message = str(err.value)
    assert "\n" not in message and len(message) < 300, message
    assert "'num_gpu' (did you mean 'num_gpus'" in message
    assert "'grad_clp' (did you mean 'grad_clip'" in message
    assert "policy-service config ALGO" in message
    assert "'adam_epsilon'" not in message  # no longer every known key


def test_unknown_key_without_a_close_one_says_so():
    with pytest.raises(ConfigError) as err:
        from_dict(PolicyConfig, {"zzzz": 1})
    assert str(err.value) == (
        "unknown config key 'zzzz' (no known key is close); "
        "`policy-service config ALGO` lists every key of an algorithm"
    )


def test_several_unknown_keys_are_all_named():
    with pytest.raises(ValueError) as err:
        from_dict(PolicyConfig, {"num_gpu": 1, "fake_gpus": True})
    assert "'fake_gpus'" in str(err.value) and "'num_gpu'" in str(err.value)


@pytest.mark.parametrize(
    "key, value, type_name",
    [
        ("lr", "0.1", "float"),
        ("num_gpus", True, "float"),  # bool is not a number here
        ("seed", 1.5, "int or None"),
        ("explore", "yes", "bool"),
        ("grad_clip", "40", "float or None"),
        ("minibatch_size", 128.0, "int"),
        ("exploration_config", "EpsilonGreedy", "dict"),
    ],
)
def test_wrong_type_error_names_key_type_and_value(key, value, type_name):
    with pytest.raises(TypeError) as err:
        from_dict(PolicyConfig, {key: value})
    message = str(err.value)
    assert f"config.{key} must be {type_name}" in message
    assert repr(value) in message and type(value).__name__ in message


def test_nested_model_unknown_key_names_the_path():
    with pytest.raises(ValueError) as err:
        from_dict(PolicyConfig, {"model": {"fcnet_hidden": [16]}})
    assert "config.model" in str(err.value) and "'fcnet_hidden'" in str(err.value)


@pytest.mark.parametrize(
    "key, value, type_name",
    [
        ("use_lstm", "true", "bool"),
        ("lstm_cell_size", 8.0, "int"),
        ("fcnet_hiddens", 16, "list"),
        ("conv_filters", "small", "list or None"),
        ("custom_model", 3, "str or None"),
    ],
)
def test_nested_model_wrong_type_names_the_path_and_type(key, value, type_name):
    with pytest.raises(TypeError) as err:
        from_dict(PolicyConfig, {"model": {key: value}})
    assert f"config.model.{key} must be {type_name}" in str(err.value)


def test_model_that_is_not_a_dict_is_an_error_naming_it():
    with pytest.raises(TypeError, match="config.model must be a dict, got list"):
        from_dict(PolicyConfig, {"model": [16, 16]})


def test_config_that_is_not_a_dict_is_an_error():
    with pytest.raises(TypeError, match="config must be a dict, got str"):
        from_dict(PolicyConfig, "lr=0.1")


def test_policy_rejects_unknown_keys_before_building_anything():
    with pytest.raises(ValueError, match="'lrr'"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(lrr=0.1))
    with pytest.raises(ValueError, match="'use_lstmm'"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"use_lstmm": True}))


def test_policy_rejects_unknown_choices():
    with pytest.raises(ValueError, match="'adamw'"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(optimizer="adamw"))
    with pytest.raises(ValueError, match="'l1'"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(grad_clip=1.0, grad_clip_method="l1"))
    with pytest.raises(ValueError, match="'Boltzmann'"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(exploration_config={"type": "Boltzmann"}))
    with pytest.raises(ValueError, match=r"for EpsilonGreedy \(unknown: \['epsilon'\]\)"):
        PGPolicy(
            OBS_SPACE,
            ACTION_SPACE,
            small_config(exploration_config={"type": "EpsilonGreedy", "epsilon": 0.1}),
        )


def test_policy_keeps_the_validated_config():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(lr=1))
    assert isinstance(policy.config, PolicyConfig)
    assert policy.config.lr == 1.0 and policy.config.model.fcnet_hiddens == [16, 16]


# ----- ranges: one line naming the key, what it must be and what it was ---------------------

POSITIVE = "a finite number > 0"
NON_NEGATIVE = "a finite number >= 0"
UNIT_INTERVAL = "a finite number in [0, 1]"
GPU_COUNT = "a finite number >= 0, and a whole number when above 1"
ACTIVATION = "the name of a Keras activation (e.g. 'tanh', 'relu', 'linear')"
CONV = (
    "None or a non-empty list of [out_channels, kernel, stride] of integers >= 1 "
    "(kernel and stride: an int or [h, w])"
)

# (config class, key, bad value, what the message says it must be)
OUT_OF_RANGE = [
    (PolicyConfig, "lr", math.nan, POSITIVE),
    (PolicyConfig, "lr", math.inf, POSITIVE),
    (PolicyConfig, "lr", -1, POSITIVE),
    (PolicyConfig, "lr", 0, POSITIVE),
    (PolicyConfig, "lr", 0.0, POSITIVE),
    (PolicyConfig, "adam_epsilon", -1, POSITIVE),
    (PolicyConfig, "adam_epsilon", 0.0, POSITIVE),
    (PolicyConfig, "grad_clip", 0, "None or " + POSITIVE),
    (PolicyConfig, "grad_clip", -1.0, "None or " + POSITIVE),
    (PolicyConfig, "grad_clip", math.nan, "None or " + POSITIVE),
    (PolicyConfig, "grad_clip_method", "bogus", "one of ['global_norm', 'value', 'norm']"),
    (PolicyConfig, "optimizer", "adamw", "one of ['adam', 'sgd', 'rmsprop']"),
    (PolicyConfig, "gamma", 1.5, UNIT_INTERVAL),
    (PolicyConfig, "gamma", -0.1, UNIT_INTERVAL),
    (PolicyConfig, "gamma", math.nan, UNIT_INTERVAL),
    (PolicyConfig, "l2_coeff", -0.01, NON_NEGATIVE),
    (PolicyConfig, "num_gpus", -1, GPU_COUNT),
    (PolicyConfig, "num_gpus", 1.5, GPU_COUNT),
    (PolicyConfig, "num_gpus", math.inf, GPU_COUNT),
    (PolicyConfig, "seed", -1, "None or an integer in [0, 4294967295]"),
    (PolicyConfig, "seed", 2**32, "None or an integer in [0, 4294967295]"),
    (PolicyConfig, "minibatch_size", 0, "an integer >= 1"),
    (PolicyConfig, "num_epochs", 0, "an integer >= 1"),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "Bogus"},
        "a dict whose 'type' is one of ['EpsilonGreedy', 'GaussianNoise', "
        "'OrnsteinUhlenbeckNoise', 'StochasticSampling'], an Exploration subclass or "
        "'module.Class' of an imported module",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"type": ["EpsilonGreedy"]},
        "a dict whose 'type' is one of ['EpsilonGreedy', 'GaussianNoise', "
        "'OrnsteinUhlenbeckNoise', 'StochasticSampling'], an Exploration subclass or "
        "'module.Class' of an imported module",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "EpsilonGreedy", "epsilon": 0.1},
        "'type' plus options from ['epsilon_timesteps', 'final_epsilon', 'initial_epsilon'] "
        "for EpsilonGreedy (unknown: ['epsilon'])",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "EpsilonGreedy", "initial_epsilon": 1.5},
        "EpsilonGreedy options with initial_epsilon a finite number in [0, 1]",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "EpsilonGreedy", "final_epsilon": "low"},
        "EpsilonGreedy options with final_epsilon a finite number in [0, 1]",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "EpsilonGreedy", "epsilon_timesteps": 1e4},
        "EpsilonGreedy options with epsilon_timesteps an integer >= 0",
    ),
    (
        PolicyConfig,
        "exploration_config",
        {"scale": 2.0},
        "'type' plus options from ['random_timesteps'] for StochasticSampling (unknown: ['scale'])",
    ),
    (ModelConfig, "fcnet_hiddens", [0], "a list of integers >= 1"),
    (ModelConfig, "fcnet_hiddens", [64, -1], "a list of integers >= 1"),
    (ModelConfig, "fcnet_hiddens", [64.0], "a list of integers >= 1"),
    (ModelConfig, "fcnet_hiddens", [True], "a list of integers >= 1"),
    (ModelConfig, "fcnet_activation", "nope", ACTIVATION),
    (ModelConfig, "conv_activation", "Dense", ACTIVATION),
    (ModelConfig, "conv_filters", [], CONV),
    (ModelConfig, "conv_filters", [[16, [3, 3]]], CONV),
    (ModelConfig, "conv_filters", [[16, [3, 3], 0]], CONV),
    (ModelConfig, "conv_filters", [[0, 3, 1]], CONV),
    (ModelConfig, "conv_filters", [[16, [3], 1]], CONV),
    (ModelConfig, "conv_filters", [16, [3, 3], 1], CONV),
    (ModelConfig, "lstm_cell_size", 0, "an integer >= 1"),
    (ModelConfig, "max_seq_len", 0, "an integer >= 1"),
]


@pytest.mark.parametrize(
    "cls, key, value, expected",
    OUT_OF_RANGE,
    ids=[f"{c.__name__}.{k}={v!r}" for c, k, v, _ in OUT_OF_RANGE],
)
def test_out_of_range_value_is_one_line_naming_key_range_and_value(cls, key, value, expected):
    assert_out_of_range_is_one_line(cls, key, value, expected)


def test_the_nan_learning_rate_of_the_issue_says_what_lr_must_be():
    with pytest.raises(ValueError) as err:
        from_dict(PolicyConfig, {"lr": float("nan")})
    assert str(err.value) == "config.lr must be a finite number > 0, got nan"


def test_nested_model_values_are_named_with_their_path():
    with pytest.raises(
        ConfigError,
        match=r"^config\.model\.fcnet_hiddens must be a list of "
        r"integers >= 1, got \[0\]$",
    ):
        from_dict(PolicyConfig, {"model": {"fcnet_hiddens": [0]}})


# (config class, key, a value at or inside the edge of its range)
IN_RANGE = [
    (PolicyConfig, "lr", 1e-12),
    (PolicyConfig, "gamma", 0),
    (PolicyConfig, "gamma", 1),
    (PolicyConfig, "grad_clip", None),
    (PolicyConfig, "grad_clip", 1e-6),
    (PolicyConfig, "adam_epsilon", 1e-12),
    (PolicyConfig, "l2_coeff", 0),
    (PolicyConfig, "num_gpus", 0),
    (PolicyConfig, "num_gpus", 0.25),
    (PolicyConfig, "num_gpus", 1),
    (PolicyConfig, "num_gpus", 4.0),
    (PolicyConfig, "seed", 0),
    (PolicyConfig, "seed", 2**32 - 1),
    (PolicyConfig, "optimizer", "sgd"),
    (PolicyConfig, "optimizer", "rmsprop"),
    (PolicyConfig, "grad_clip_method", "value"),
    (PolicyConfig, "grad_clip_method", "norm"),
    (PolicyConfig, "minibatch_size", 1),
    (PolicyConfig, "num_epochs", 1),
    (PolicyConfig, "exploration_config", {}),
    (PolicyConfig, "exploration_config", {"type": "EpsilonGreedy", "initial_epsilon": 0.5}),
    (
        PolicyConfig,
        "exploration_config",
        {"type": "EpsilonGreedy", "initial_epsilon": 1, "final_epsilon": 0, "epsilon_timesteps": 0},
    ),
    (ModelConfig, "fcnet_hiddens", []),
    (ModelConfig, "fcnet_hiddens", [1, 512]),
    (ModelConfig, "fcnet_activation", "relu"),
    (ModelConfig, "fcnet_activation", "linear"),
    (ModelConfig, "fcnet_activation", "swish"),
    (ModelConfig, "conv_activation", "elu"),
    (ModelConfig, "conv_filters", None),
    (ModelConfig, "conv_filters", [[16, 3, 2]]),
    (ModelConfig, "conv_filters", [[16, [8, 8], 4], [32, [4, 4], [2, 1]]]),
    (ModelConfig, "lstm_cell_size", 1),
    (ModelConfig, "max_seq_len", 1),
]


@pytest.mark.parametrize(
    "cls, key, value", IN_RANGE, ids=[f"{c.__name__}.{k}={v!r}" for c, k, v in IN_RANGE]
)
def test_values_at_the_edge_of_their_range_are_taken(cls, key, value):
    assert_taken(cls, key, value)


def test_an_int_for_a_float_is_reported_as_given_and_stored_as_a_float():
    with pytest.raises(ConfigError, match=r"got -1$"):
        from_dict(PolicyConfig, {"lr": -1})
    assert isinstance(from_dict(PolicyConfig, {"gamma": 1}).gamma, float)


def test_a_config_built_directly_is_checked_too():
    with pytest.raises(ConfigError, match="config.lr"):
        PolicyConfig(lr=-1.0)
    with pytest.raises(ConfigError, match="config.model.lstm_cell_size"):
        ModelConfig(lstm_cell_size=0)
    with pytest.raises(ConfigTypeError, match="config.num_epochs must be int"):
        PolicyConfig(num_epochs=2.5)
    with pytest.raises(ConfigError, match="config.model.max_seq_len"):
        PolicyConfig(model={"max_seq_len": 0})  # a dict for the model is built and checked
    assert PolicyConfig(model={"max_seq_len": 4}).model == ModelConfig(max_seq_len=4)


def test_replace_checks_the_new_values():
    config = PolicyConfig()
    assert dataclasses.replace(config, num_gpus=0.5).num_gpus == 0.5
    with pytest.raises(ConfigError, match="config.num_gpus"):
        dataclasses.replace(config, num_gpus=-2)


def test_config_errors_are_value_and_type_errors():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigTypeError, ConfigError) and issubclass(ConfigTypeError, TypeError)
    with pytest.raises(ConfigError):
        from_dict(PolicyConfig, {"nope": 1})


# ----- docs and rules beside the fields, readable by tools -----------------------------------


@pytest.mark.parametrize("cls", [ModelConfig, PolicyConfig])
def test_every_field_of_every_config_has_a_doc(cls):
    docs = field_docs(cls)
    assert set(docs) == {f.name for f in dataclasses.fields(cls)}
    missing = sorted(name for name, doc in docs.items() if not doc.strip())
    assert not missing, f"{cls.__name__} fields without a doc: {missing}"


@dataclass
class _AdamConfig(PolicyConfig):
    """An algorithm's config redeclaring a policy key with its own default and doc."""

    lr: float = setting(5e-5, doc="Adam learning rate.")


def test_a_redeclared_field_keeps_its_parents_rule_and_adds_its_own_doc():
    assert field_check(_AdamConfig, "lr") is field_check(PolicyConfig, "lr")
    assert field_check(_AdamConfig, "lr")(-1.0) == "a finite number > 0"
    assert field_check(_AdamConfig, "lr")(1e-3) is None
    assert from_dict(_AdamConfig, None).lr == 5e-5
    assert field_docs(_AdamConfig)["lr"] == "Adam learning rate."
    assert field_docs(PolicyConfig)["lr"] == "Learning rate."
    assert field_check(PolicyConfig, "explore") is None  # a bool needs no range


@dataclass
class _HalvingConfig(PolicyConfig):
    """An algorithm's own key, declared the way the built-in algorithms declare theirs."""

    halvings: int = setting(2, doc="Times the step is halved.", check=integer(ge=2, le=8))


def test_a_subclass_declares_its_own_key_with_a_range():
    assert from_dict(_HalvingConfig, {"halvings": 8, "lr": 0.5}).halvings == 8
    with pytest.raises(ConfigError) as err:
        from_dict(_HalvingConfig, {"halvings": 1})
    assert str(err.value) == "config.halvings must be an integer in [2, 8], got 1"
    assert field_docs(_HalvingConfig)["halvings"] == "Times the step is halved."


def test_config_value_reads_a_dict_a_config_object_or_falls_back():
    """One reader for a policy config as users give it (dict) or as built (dataclass)."""
    built = from_dict(PolicyConfig, {"lr": 0.01})
    assert config_value({"lr": 0.01}, "lr", 1.0) == config_value(built, "lr", 1.0) == 0.01
    assert config_value({}, "lr", 1.0) == 1.0
    assert config_value(None, "lr", 1.0) == 1.0
    assert config_value(built, "no_such_key", "default") == "default"
