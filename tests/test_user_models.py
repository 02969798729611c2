"""A user's own Keras model trains, syncs and checkpoints like the built-in ones.

Every style in user_models.STYLES: subclassed with lazy build, functional,
Sequential, nested models, recurrent, with batch norm and dropout.
"""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf
import user_models
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    PGPolicy,
    episode_batch,
    fake_gpus,
    mlp_batch,
    small_config,
)
from user_models import ValueOptionalPolicy

from policy_service.data.sample_batch import SampleBatch
from policy_service.policy import models

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setattr(models, "_CUSTOM_MODELS", models.custom_model_registry())
    user_models.register_all()


def style_config(style: str, **overrides) -> dict:
    return small_config(
        model={"custom_model": style, "custom_model_config": {"units": 8}}, **overrides
    )


def style_batch(policy, n: int = 24, seed: int = 0) -> SampleBatch:
    return episode_batch([5, 9, 3, 7], seed=seed) if policy.is_recurrent() else mlp_batch(n, seed)


def non_rng_variables(model) -> list:
    return [v for v in model.variables if not v.path.endswith("seed_generator_state")]


_TRAINED: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _forget_trained_policies():
    yield
    _TRAINED.clear()


def trained(style: str) -> ValueOptionalPolicy:
    """A one-device policy of `style` after one learn_on_batch on style_batch, built
    once per module (a build and a trace cost seconds): the tests that use it only
    read its weights and act greedily, which changes neither."""
    if style not in _TRAINED:
        policy = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config(style))
        policy.learn_on_batch(style_batch(policy))
        _TRAINED[style] = policy
    return _TRAINED[style]


@pytest.mark.parametrize("style", sorted(user_models.STYLES))
def test_learn_on_batch_changes_every_trainable_variable(style):
    policy = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config(style, **fake_gpus(2)))
    before = [v.numpy().copy() for v in policy.model.trainable_variables]
    assert before, "the model was not built"
    policy.learn_on_batch(style_batch(policy))
    for variable, old in zip(policy.model.trainable_variables, before):
        assert not np.array_equal(variable.numpy(), old), f"{variable.path} did not train"


@pytest.mark.parametrize("style", sorted(user_models.STYLES))
def test_an_env_runners_xla_twin_acts_as_the_model_does_after_training_and_a_sync(style):
    """The twin (TFPolicy.act_with_xla) traces the user's model once it is built; it
    must read the weights a learner trained and sent, as the executor's function does."""
    learner = trained(style)
    runner = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config(style, seed=1))
    assert runner.act_with_xla(4)
    runner.set_weights(learner.get_weights())
    for rows in (4, 3):
        obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 4)).astype(np.float32)
        want = learner.compute_actions(obs, explore=False)
        got = runner.compute_actions(obs, explore=False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(
            got[2][SampleBatch.ACTION_DIST_INPUTS],
            want[2][SampleBatch.ACTION_DIST_INPUTS],
            rtol=1e-5,
            atol=1e-6,
        )
        for got_state, want_state in zip(got[1], want[1]):
            np.testing.assert_allclose(got_state, want_state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("style", sorted(user_models.STYLES))
def test_weights_hold_every_variable_and_round_trip(style):
    source = trained(style)
    weights = source.get_weights()
    assert len(weights) == len(non_rng_variables(source.model))
    if style in ("lazy_bn", "nested"):
        assert any(name.endswith("moving_mean") for name in weights)
    # a second instance in the same process gets other auto-numbered Keras paths,
    # and still the same weight names
    target = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config(style, seed=1))
    assert sorted(target.get_weights()) == sorted(weights)
    target.set_weights(weights)
    for name, value in target.get_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    obs = np.random.default_rng(3).uniform(-1, 1, (5, 4)).astype(np.float32)
    np.testing.assert_array_equal(
        source.compute_actions(obs, explore=False)[2]["action_dist_inputs"],
        target.compute_actions(obs, explore=False)[2]["action_dist_inputs"],
    )


def test_weight_names_do_not_depend_on_what_the_process_built_before():
    first = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config("nested"))
    for _ in range(3):
        keras.layers.Dense(2)(tf.zeros((1, 2)))  # bump Keras's global layer counter
    second = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config("nested"))
    assert list(first.get_weights()) == list(second.get_weights())
    assert [v.path for v in first.model.variables] != [v.path for v in second.model.variables]
    assert "sequential/dense/kernel" in first.get_weights()  # as a fresh process names it


RESTORE_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import user_models
from user_models import ValueOptionalPolicy
from policy_service import TFPolicy
user_models.register_all()
out = {{}}
for style, directory in json.loads(sys.argv[1]).items():
    policy = TFPolicy.from_checkpoint(directory)
    obs = np.load(directory + "/obs.npy")
    out[style + "/greedy"] = policy.compute_actions(obs, explore=False)[0]
    out[style + "/sampled"] = policy.compute_actions(obs, explore=True)[0]
np.savez(sys.argv[2], **out)
"""


@pytest.mark.slow  # a fresh process importing TensorFlow: ~30 s here
def test_checkpoint_restores_bit_identical_actions_in_a_fresh_process(tmp_path):
    expected, dirs = {}, {}
    obs = np.random.default_rng(4).uniform(-1, 1, (16, 4)).astype(np.float32)
    for style in sorted(user_models.STYLES):
        policy = ValueOptionalPolicy(OBS_SPACE, ACTION_SPACE, style_config(style))
        policy.learn_on_batch(style_batch(policy))
        directory = tmp_path / style
        policy.export_checkpoint(str(directory))
        np.save(directory / "obs.npy", obs)
        expected[style + "/greedy"] = policy.compute_actions(obs, explore=False)[0]
        expected[style + "/sampled"] = policy.compute_actions(obs, explore=True)[0]
        dirs[style] = str(directory)
    script = RESTORE_SCRIPT.format(tests=str(TESTS))
    result = tmp_path / "restored.npz"
    subprocess.run(
        [sys.executable, "-c", script, json.dumps(dirs), str(result)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    restored = np.load(result)
    for key, actions in expected.items():
        np.testing.assert_array_equal(restored[key], actions, err_msg=key)


def bn_policy(num_towers: int) -> PGPolicy:
    return PGPolicy(OBS_SPACE, ACTION_SPACE, style_config("lazy_bn", **fake_gpus(num_towers)))


@pytest.mark.parametrize("num_towers", [1, 4])  # 10 rows on 4 towers: 2 of padding
def test_batch_norm_moving_statistics_from_the_whole_batch(num_towers):
    """momentum 0.5: moving = 0.5 * moving + 0.5 * moment of all 10 rows (not a
    multiple of the towers: padding rows must not count), after one step and two."""
    policy = bn_policy(num_towers)
    bn = policy.model.bn
    mean, var = np.zeros(4), np.ones(4)
    for seed in (0, 1):
        batch = mlp_batch(10, seed=seed)
        batch[SampleBatch.OBS] = batch[SampleBatch.OBS] * 3 + np.arange(4, dtype=np.float32) * 2
        policy.learn_on_batch(batch)
        obs = batch[SampleBatch.OBS].astype(np.float64)
        mean = 0.5 * mean + 0.5 * obs.mean(0)
        var = 0.5 * var + 0.5 * obs.var(0)
        np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.moving_variance.numpy(), var, rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_skip_padded_sequence_steps():
    """A recurrent model with batch norm on [rows, features]: padded time steps
    of short sequences are left out of the moments."""

    class BatchNormLSTM(user_models.LazyLSTM):
        def __init__(self, *args):
            super().__init__(*args)
            self.bn = keras.layers.BatchNormalization(momentum=0.0)

        def call(self, input_dict, training=None):
            self.bn(input_dict["obs"], training=training)  # statistics only
            return super().call(input_dict, training=training)

    models.register_custom_model("bn_lstm", BatchNormLSTM)
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, style_config("bn_lstm", **fake_gpus(2)))
    batch = episode_batch([5, 9, 3, 7], seed=2)
    policy.learn_on_batch(batch)
    obs = batch[SampleBatch.OBS].astype(np.float64)
    np.testing.assert_allclose(
        policy.model.bn.moving_mean.numpy(), obs.mean(0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        policy.model.bn.moving_variance.numpy(), obs.var(0), rtol=1e-5, atol=1e-6
    )


# ----- models that break the call convention are refused, naming the model --------------


class _Broken(keras.Model):
    def __init__(self, obs_space, action_space, num_outputs, model_config, *, out):
        super().__init__(name="broken_model")
        self.dense = keras.layers.Dense(num_outputs)
        self.make_out = out

    def call(self, input_dict, training=None):
        return self.make_out(self.dense(input_dict["obs"]), input_dict)


def _register_broken(out):
    models.register_custom_model("broken", lambda *args: _Broken(*args, out=out))


@pytest.mark.parametrize(
    "out, message",
    [
        (lambda x, d: {"logits": x, "state_out": []}, "returned no 'action_dist_inputs'"),
        (
            lambda x, d: {"action_dist_inputs": x[:, :2], "state_out": []},
            "action_dist_inputs of shape (2, 2), expected (2, 3)",
        ),
        (
            lambda x, d: {"action_dist_inputs": x, "vf_preds": x[:, :1], "state_out": []},
            "vf_preds of shape (2, 1), expected (2,)",
        ),
        (
            lambda x, d: {"action_dist_inputs": x, "state_out": [x]},
            "returns 1 state_out tensor(s) but its get_initial_state() gives 0",
        ),
        (lambda x, d: x, "must return a dict"),
    ],
)
def test_a_model_breaking_the_call_convention_is_refused(out, message):
    _register_broken(out)
    with pytest.raises(ValueError) as err:
        PGPolicy(OBS_SPACE, ACTION_SPACE, style_config("broken"))
    assert "'broken_model' (_Broken)" in str(err.value)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_model_without_variables_is_refused():
    class NoVariables(keras.Model):
        def __init__(self, *args):
            super().__init__(name="no_variables")

        def call(self, input_dict, training=None):
            return {
                "action_dist_inputs": tf.zeros([tf.shape(input_dict["obs"])[0], 3]),
                "state_out": [],
            }

    models.register_custom_model("empty", NoVariables)
    with pytest.raises(ValueError, match="'no_variables' .* has no trainable variables"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, style_config("empty"))


def test_state_out_must_match_state_in_shapes():
    class WrongState(user_models.LazyLSTM):
        def call(self, input_dict, training=None):
            out = super().call(input_dict, training=training)
            out["state_out"] = [s[:, :4] for s in out["state_out"]]
            return out

    models.register_custom_model("wrong_state", WrongState)
    with pytest.raises(ValueError, match=r"state_out\[0\] of shape \(2, 4\), expected \(2, 8\)"):
        PGPolicy(OBS_SPACE, ACTION_SPACE, style_config("wrong_state"))


def test_make_model_must_return_a_keras_model():
    class NotAModel(PGPolicy):
        def make_model(self):
            return lambda input_dict: input_dict

    with pytest.raises(TypeError, match="must be a keras.Model"):
        NotAModel(OBS_SPACE, ACTION_SPACE, small_config())


def test_box_actions_need_mean_and_log_std_width():
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    models.register_custom_model("lazy_mlp_box", user_models.LazyMLP)
    policy = PGPolicy(OBS_SPACE, box, style_config("lazy_mlp_box"))
    assert policy.model.pi.kernel.shape[-1] == 4  # built from num_outputs = 2 * action dims
