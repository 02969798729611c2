"""config.py: a plain dict validated into dataclasses; bad keys are named."""
import pytest

from policy_service.config import ModelConfig, PolicyConfig, check_choice, from_dict

from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config


def test_empty_and_none_give_the_defaults():
    assert from_dict(PolicyConfig, None) == PolicyConfig()
    assert from_dict(PolicyConfig, {}) == PolicyConfig()
    assert PolicyConfig().model == ModelConfig()


def test_known_keys_are_taken_and_ints_become_floats():
    config = from_dict(PolicyConfig, {"lr": 1, "num_gpus": 2, "_fake_gpus": True,
                                      "grad_clip": 40, "seed": 3,
                                      "model": {"fcnet_hiddens": [8], "use_lstm": True}})
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


def test_several_unknown_keys_are_all_named():
    with pytest.raises(ValueError) as err:
        from_dict(PolicyConfig, {"num_gpu": 1, "fake_gpus": True})
    assert "'fake_gpus'" in str(err.value) and "'num_gpu'" in str(err.value)


@pytest.mark.parametrize("key, value, type_name", [
    ("lr", "0.1", "float"),
    ("num_gpus", True, "float"),  # bool is not a number here
    ("seed", 1.5, "int or None"),
    ("explore", "yes", "bool"),
    ("grad_clip", "40", "float or None"),
    ("minibatch_size", 128.0, "int"),
    ("exploration_config", "EpsilonGreedy", "dict"),
])
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


@pytest.mark.parametrize("key, value, type_name", [
    ("use_lstm", "true", "bool"),
    ("lstm_cell_size", 8.0, "int"),
    ("fcnet_hiddens", 16, "list"),
    ("conv_filters", "small", "list or None"),
    ("custom_model", 3, "str or None"),
])
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


def test_check_choice_names_the_setting_and_choices():
    check_choice("adam", ("adam", "sgd"), "optimizer")
    with pytest.raises(ValueError) as err:
        check_choice("adamw", ("adam", "sgd"), "optimizer")
    assert "optimizer" in str(err.value) and "'adamw'" in str(err.value)
    assert "['adam', 'sgd']" in str(err.value)


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
        PGPolicy(OBS_SPACE, ACTION_SPACE,
                 small_config(exploration_config={"type": "Boltzmann"}))
    with pytest.raises(ValueError, match="bad exploration_config for EpsilonGreedy"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(
            exploration_config={"type": "EpsilonGreedy", "epsilon": 0.1}))


def test_policy_keeps_the_validated_config():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(lr=1))
    assert isinstance(policy.config, PolicyConfig)
    assert policy.config.lr == 1.0 and policy.config.model.fcnet_hiddens == [16, 16]
