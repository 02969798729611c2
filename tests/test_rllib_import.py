"""Importing RLlib old-stack checkpoints (io/rllib_checkpoint.py, policy/rllib_import.py,
policy/rllib_variable_order.py, `policy-service import-rllib`): crafted checkpoints here,
and in the slow group RLlib's own (tests/rllib_checkpoint_oracle.py trains PPO one
iteration in RLlib's virtualenv and saves, with framework "tf" and "tf2", for an MLP, an
MLP with vf_share_layers, an LSTM with previous actions and rewards, a CNN on an 84x84x4
Box, and an MLP with free_log_std on Pendulum)."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from policy_service.cli.commands import main
from policy_service.io.rllib_checkpoint import (
    SATURATED_ADAM_STEP,
    RLlibCheckpointError,
    read_rllib_checkpoint,
)
from policy_service.policy.policy_config import ModelConfig
from policy_service.policy.rllib_import import RLlibImportError, catalog_mapping, mapped_weights

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CARTPOLE_OBS = gym.spaces.Box(
    np.array([-4.8, -np.inf, -0.41887903, -np.inf], np.float32),
    np.array([4.8, np.inf, 0.41887903, np.inf], np.float32),
    (4,),
    np.float32,
)


class Reduces:
    """An object whose pickle calls `callee(*args)` when loaded."""

    def __init__(self, callee, *args):
        self.callee, self.args = callee, args

    def __reduce__(self):
        return self.callee, self.args


def write_rllib_checkpoint(root: Path, policy_state, algorithm_state=None) -> Path:
    """An RLlib algorithm checkpoint's layout (checkpoint_version 1.1) around the states."""
    policy_dir = root / "policies" / "default_policy"
    policy_dir.mkdir(parents=True)
    meta = {"type": "Algorithm", "checkpoint_version": "1.1", "format": "cloudpickle"}
    (root / "rllib_checkpoint.json").write_text(
        json.dumps({**meta, "policy_ids": ["default_policy"]})
    )
    (policy_dir / "rllib_checkpoint.json").write_text(json.dumps({**meta, "type": "Policy"}))
    (policy_dir / "policy_state.pkl").write_bytes(pickle.dumps(policy_state, protocol=5))
    if algorithm_state is not None:
        (root / "algorithm_state.pkl").write_bytes(pickle.dumps(algorithm_state, protocol=5))
    return root


def fcnet_weights(rng, shared: bool = False) -> dict:
    """RLlib's FullyConnectedNetwork's weights for CartPole, fcnet_hiddens [8]."""
    shapes = {"fc_1": (4, 8), "fc_out": (8, 2), "value_out": (8, 1)}
    if not shared:
        shapes["fc_value_1"] = (4, 8)
    weights = {}
    for layer, (fan_in, fan_out) in shapes.items():
        weights[f"default_policy/{layer}/kernel"] = rng.standard_normal((fan_in, fan_out))
        weights[f"default_policy/{layer}/bias"] = rng.standard_normal(fan_out)
    return {k: v.astype(np.float32) for k, v in weights.items()}


def rllib_array(array: np.ndarray) -> str:
    """As RLlib records a space's bounds: base64 of zlib of np.save."""
    import base64
    import io
    import zlib

    buffer = io.BytesIO()
    np.save(buffer, array)
    return base64.b64encode(zlib.compress(buffer.getvalue())).decode("ascii")


def policy_state(weights, model=None) -> dict:
    box = {"space": "box", "low": rllib_array(CARTPOLE_OBS.low), "shape": (4,), "dtype": "<f4"}
    box["high"] = rllib_array(CARTPOLE_OBS.high)
    return {
        "weights": weights,
        "global_timestep": 321,
        "policy_spec": {
            "policy_class": "PPOTF1Policy",
            "observation_space": {"space": box},
            "action_space": {"space": {"space": "discrete", "n": 2, "start": 0}},
            "config": {
                "model": {"fcnet_hiddens": [8], "fcnet_activation": "tanh", **(model or {})},
                "lr": 1e-4,
                "lambda": 0.9,
                "class": Reduces(print, "an RLlib class, never called"),
            },
        },
        "current_kl_coeff": 0.1,
    }


# ----- safety ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a weight", "the whole state"])
def test_a_pickle_that_calls_os_system_is_refused_in_one_line(tmp_path, capsys, where):
    marker = tmp_path / "MARKER"
    payload = Reduces(os.system, f"touch {marker}")
    assert pickle.loads(pickle.dumps(Reduces(len, "abc"))) == 3  # a pickle does call
    rng = np.random.default_rng(0)
    weights = fcnet_weights(rng)
    if where == "a weight":
        weights["default_policy/fc_1/kernel"] = payload
        state = policy_state(weights)
    else:
        state = payload
    checkpoint = write_rllib_checkpoint(tmp_path / "rllib", state)
    status = main(
        ["import-rllib", str(checkpoint), "--env", "CartPole-v1", "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1, err
    assert "os.system" in err or "posix.system" in err, err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_an_env_whose_spaces_differ_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    checkpoint = write_rllib_checkpoint(tmp_path / "rllib", policy_state(fcnet_weights(rng)))
    out = tmp_path / "out"
    assert main(["import-rllib", str(checkpoint), "--env", "Pendulum-v1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "observation space" in err, err
    assert "is not the RLlib policy's Box" in err and not out.exists()


def test_weights_that_are_not_numeric_arrays_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    as_list = [*fcnet_weights(rng).values(), Reduces(os.system, "true")]
    checkpoint = write_rllib_checkpoint(tmp_path / "a", policy_state(as_list))
    with pytest.raises(RLlibCheckpointError, match="weight '8' is a call of posix.system"):
        read_rllib_checkpoint(checkpoint)
    strings = {**fcnet_weights(rng), "default_policy/fc_1/bias": "0.5"}
    checkpoint = write_rllib_checkpoint(tmp_path / "b", policy_state(strings))
    with pytest.raises(RLlibCheckpointError, match="'default_policy/fc_1/bias' is str, not a"):
        read_rllib_checkpoint(checkpoint)


def test_not_a_checkpoint_and_an_unknown_policy_are_one_line(tmp_path):
    with pytest.raises(RLlibCheckpointError, match="rllib_checkpoint.json missing"):
        read_rllib_checkpoint(tmp_path)
    checkpoint = write_rllib_checkpoint(
        tmp_path / "c", policy_state(fcnet_weights(np.random.default_rng(0)))
    )
    with pytest.raises(
        RLlibCheckpointError, match=r"holds policies \['default_policy'\], not 'p1'"
    ):
        read_rllib_checkpoint(checkpoint, "p1")


# ----- reading ------------------------------------------------------------------------------


def test_weights_filter_counters_and_kl_are_read(tmp_path):
    rng = np.random.default_rng(1)
    weights = fcnet_weights(rng)
    stats = {"num_pushes": 9, "mean_array": np.arange(4.0), "sum_sq_diff_array": np.ones(4)}
    worker_filter = Reduces(dict, stats)  # stands for RLlib's MeanStdFilter's pickle
    checkpoint = write_rllib_checkpoint(
        tmp_path,
        policy_state(weights),
        {"worker": {"filters": {"default_policy": worker_filter}}, "training_iteration": 3},
    )
    read = read_rllib_checkpoint(checkpoint)
    assert sorted(read.weights) == sorted(k.split("/", 1)[1] for k in weights)
    for name, array in weights.items():
        np.testing.assert_array_equal(read.weights[name.split("/", 1)[1]], array)
    assert read.global_timestep == 321 and read.iteration == 3
    assert read.config["lr"] == 1e-4 and read.extra["current_kl_coeff"] == 0.1
    assert read.observation_filter is None  # a dict() call is no MeanStdFilter
    assert read.observation_space == CARTPOLE_OBS
    assert read.action_space == gym.spaces.Discrete(2)


def test_a_msgpack_checkpoint_reads_as_the_pickle(tmp_path):
    """RLlib's msgpack format: msgpack_numpy's {nd, type, kind, shape, data} per array."""
    import msgpack

    rng = np.random.default_rng(2)
    weights = fcnet_weights(rng)

    def packed(array):
        return {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape),
                b"data": array.tobytes()}  # fmt: skip

    root = tmp_path / "msgpack"
    policy_dir = root / "policies" / "default_policy"
    policy_dir.mkdir(parents=True)
    (root / "rllib_checkpoint.json").write_text(
        json.dumps({"type": "Algorithm", "format": "msgpack", "policy_ids": ["default_policy"]})
    )
    state = {"weights": {k: packed(v) for k, v in weights.items()}, "global_timestep": 7}
    (policy_dir / "policy_state.msgpack").write_bytes(msgpack.packb(state))
    read = read_rllib_checkpoint(root)
    assert read.global_timestep == 7
    for name, array in weights.items():
        got = read.weights[name.split("/", 1)[1]]
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


# ----- the mapping ---------------------------------------------------------------------------


def test_the_catalog_mapping_names_every_layer():
    pairs, unused = catalog_mapping(ModelConfig(fcnet_hiddens=[8, 8], post_fcnet_hiddens=[4]), (4,))
    assert pairs["fc_2"] == "policy/policy_dense_1"
    assert pairs["fc_3"] == "policy/policy_post_dense_0"
    assert pairs["fc_value_3"] == "value/value_post_dense_0"
    assert (pairs["fc_out"], pairs["value_out"]) == ("action_dist_inputs", "vf")
    lstm = ModelConfig(fcnet_hiddens=[8], use_lstm=True)
    pairs, unused = catalog_mapping(lstm, (4,))
    assert pairs["fc_1"] == "encoder/encoder_dense_0" and "fc_value_1" in unused
    filters = [[4, [3, 3], 2], [8, [5, 5], 1]]
    vision = ModelConfig(fcnet_hiddens=[], conv_filters=filters, conv_last_padding="valid")
    pairs, _ = catalog_mapping(vision, (10, 10, 3))
    assert pairs["conv2"] == "policy/policy_conv_1" and pairs["conv_out"] == "action_dist_inputs"
    assert pairs["conv_value_out"] == "vf"


def test_rllibs_custom_action_dist_name_carries_over(tmp_path):
    """The policy's distribution is part of what its weights mean: RLlib's
    custom_action_dist name must name a registered port here."""
    from algorithms.ppo import PPOPolicy
    from policy_service.policy import distributions

    rng = np.random.default_rng(5)
    state = policy_state(fcnet_weights(rng), {"custom_action_dist": "ported_dist"})
    checkpoint = write_rllib_checkpoint(tmp_path, state)
    with pytest.raises(ValueError, match="'ported_dist' is not a name given to register_custom"):
        PPOPolicy.from_rllib_checkpoint(str(checkpoint))
    distributions.register_custom_action_dist("ported_dist", distributions.Categorical)
    try:
        policy = PPOPolicy.from_rllib_checkpoint(str(checkpoint))
        assert policy.config.model.custom_action_dist == "ported_dist"
    finally:
        distributions.unregister_custom_action_dist("ported_dist")


def test_mapping_errors_name_the_weight():
    ours = {"a/kernel": (2, 3), "a/bias": (3,)}
    good = {"x/kernel": np.zeros((2, 3), np.float32), "x/bias": np.zeros(3, np.float32)}
    assert set(mapped_weights(good, ours, {"x": "a"})) == set(ours)
    with pytest.raises(RLlibImportError, match=r"'x/kernel' has shape \(3, 2\), the model's"):
        mapped_weights({**good, "x/kernel": np.zeros((3, 2))}, ours, {"x": "a"})
    with pytest.raises(RLlibImportError, match=r"'y/bias' \(3,\) has no place in the model"):
        mapped_weights({**good, "y/bias": np.zeros(3)}, ours, {"x": "a"})
    with pytest.raises(RLlibImportError, match=r"weight 'a/bias' \(3,\) gets no RLlib weight"):
        mapped_weights({"x/kernel": good["x/kernel"]}, ours, {"x": "a"})
    one_by_one = {"x/kernel": np.ones((1, 1, 2, 3)), "x/bias": np.zeros(3)}
    assert mapped_weights(one_by_one, ours, {"x": "a"})["a/kernel"].shape == (2, 3)


def test_from_rllib_checkpoint_maps_a_fcnet_by_hand(tmp_path):
    """RLlib's fcnet, computed here with numpy: tanh(x W1 + b1) W_out + b_out."""
    from algorithms.ppo import PPOPolicy

    rng = np.random.default_rng(3)
    weights = fcnet_weights(rng)
    checkpoint = write_rllib_checkpoint(tmp_path, policy_state(weights))
    policy = PPOPolicy.from_rllib_checkpoint(str(checkpoint))
    assert policy.global_timestep == 321
    assert policy.config.lr == 1e-4 and policy.config.lambda_ == 0.9
    assert float(policy.kl_coeff.numpy()) == pytest.approx(0.1)
    obs = rng.standard_normal((5, 4)).astype(np.float32)
    w = {k.split("/", 1)[1]: v for k, v in weights.items()}
    logits = (
        np.tanh(obs @ w["fc_1/kernel"] + w["fc_1/bias"]) @ w["fc_out/kernel"] + w["fc_out/bias"]
    )
    _, _, extra = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(extra["action_dist_inputs"], logits, rtol=1e-5, atol=1e-6)


def test_a_custom_model_takes_the_users_weight_map(tmp_path):
    import keras

    from algorithms.ppo import PPOPolicy
    from policy_service.policy import models

    class Tiny(keras.Model):
        def __init__(self, obs_space, action_space, num_outputs, model_config):
            super().__init__()
            self.body = keras.layers.Dense(num_outputs, name="body")
            self.value = keras.layers.Dense(1, name="value")

        def call(self, input_dict, training=False):
            obs = input_dict["obs"]
            out = {"action_dist_inputs": self.body(obs), "state_out": []}
            out["vf_preds"] = keras.ops.squeeze(self.value(obs), -1)
            return out

    models.register_custom_model("tiny_for_import", Tiny)
    try:
        rng = np.random.default_rng(4)
        weights = {
            "default_policy/my_logits/kernel": rng.standard_normal((4, 2)).astype(np.float32),
            "default_policy/my_logits/bias": rng.standard_normal(2).astype(np.float32),
            "default_policy/my_value/kernel": rng.standard_normal((4, 1)).astype(np.float32),
            "default_policy/my_value/bias": rng.standard_normal(1).astype(np.float32),
        }
        state = policy_state(weights, {"custom_model": "tiny_for_import"})
        checkpoint = write_rllib_checkpoint(tmp_path, state)
        with pytest.raises(RLlibImportError, match="custom model 'tiny_for_import': pass a"):
            PPOPolicy.from_rllib_checkpoint(str(checkpoint), action_space=gym.spaces.Discrete(2))
        with pytest.raises(RLlibImportError, match="maps to 'nope/kernel', which the model"):
            PPOPolicy.from_rllib_checkpoint(
                str(checkpoint),
                action_space=gym.spaces.Discrete(2),
                weight_map={"my_logits": "nope", "my_value": "value"},
            )
        policy = PPOPolicy.from_rllib_checkpoint(
            str(checkpoint),
            action_space=gym.spaces.Discrete(2),
            weight_map={"my_logits": "body", "my_value": "value"},
        )
        got = policy.get_weights()
        np.testing.assert_array_equal(
            got["body/kernel"], weights["default_policy/my_logits/kernel"]
        )
        np.testing.assert_array_equal(got["value/bias"], weights["default_policy/my_value/bias"])
    finally:
        models.unregister_custom_model("tiny_for_import")


# ----- framework "tf2" and RLlib's Adam state ------------------------------------------------


class ResourceVariable:
    """Stands for TensorFlow's: pickled as tf.Variable pickles itself (never called)."""


def pickled_variable(name: str, value) -> Reduces:
    """A tf.Variable's pickle: functools.partial(ResourceVariable, initial_value=, name=)()."""
    value = np.asarray(value)
    return Reduces(functools.partial(ResourceVariable, initial_value=value, name=name))


# RLlib 2.60's framework "tf2" model.variables() order, printed by RLlib itself (PPO, one
# iteration): layers by depth from the outputs, so branches interleave or not
RLLIB_TF2_ORDERS = [
    (
        {"fcnet_hiddens": [32, 32]},
        (4,),
        ["fc_1", "fc_value_1", "fc_2", "fc_value_2", "fc_out", "value_out"],
    ),
    (
        {"fcnet_hiddens": [32, 32], "vf_share_layers": True},
        (4,),
        ["fc_1", "fc_2", "fc_out", "value_out"],
    ),
    (
        {"fcnet_hiddens": [32], "free_log_std": True},
        (3,),
        ["log_std", "fc_1", "fc_out", "fc_value_1", "value_out"],
    ),
    (
        {"fcnet_hiddens": [32], "use_lstm": True},
        (4,),
        ["fc_value_1", "fc_1", "value_out", "lstm/lstm_cell", "logits", "values"],
    ),
    (
        {},
        (84, 84, 4),
        ["conv_value_1", "conv1", "conv_value_2", "conv2", "conv_value_3", "conv3",
         "conv_value_out", "conv_out"],
    ),
]  # fmt: skip


@pytest.mark.parametrize("rllib_model, obs_shape, layers", RLLIB_TF2_ORDERS)
def test_rllibs_tf2_variable_order_is_reproduced(rllib_model, obs_shape, layers):
    from policy_service.config import from_dict
    from policy_service.policy.rllib_import import model_config_from_rllib
    from policy_service.policy.rllib_variable_order import rllib_tf2_variable_names

    model = from_dict(ModelConfig, model_config_from_rllib(rllib_model, obs_shape))
    names = rllib_tf2_variable_names(model, obs_shape)
    cell = ("kernel", "recurrent_kernel", "bias")
    expected = []
    for layer in layers:
        variables = cell if layer.startswith("lstm") else ("kernel", "bias")
        expected += [layer] if layer == "log_std" else [f"{layer}/{v}" for v in variables]
    assert names == expected


def test_rllibs_vision_model_keeps_its_frame_size_and_raw_pixels():
    """RLlib's tuned Pong trains on 42x42 frames (model.dim) fed raw 0-255 pixels: the
    imported config makes its env's frames that size and keeps the pixels unscaled."""
    from policy_service.policy.rllib_import import model_config_from_rllib

    model = model_config_from_rllib({"dim": 42}, (42, 42, 4))
    assert model["dim"] == 42 and model["scale_images"] is False
    assert model["conv_filters"] == [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]]


def tf2_state(rng) -> tuple[dict, dict, dict]:
    """A framework "tf2" policy state of RLlib's fcnet [8] on CartPole, 3 Adam updates
    done: (state, weights by name, Adam's moments by name)."""
    named = {k.split("/", 1)[1]: v for k, v in fcnet_weights(rng).items()}
    order = ["fc_1", "fc_value_1", "fc_out", "value_out"]  # RLlib's, see RLLIB_TF2_ORDERS
    names = [f"{layer}/{v}" for layer in order for v in ("kernel", "bias")]
    moments = {n: (rng.standard_normal(named[n].shape), rng.random(named[n].shape)) for n in names}
    slots = [pickled_variable("default_policy/iteration", np.int64(3))]
    for name in names:
        slots.append(pickled_variable(f"Adam/m/{name}", moments[name][0].astype(np.float32)))
        slots.append(pickled_variable(f"Adam/v/{name}", moments[name][1].astype(np.float32)))
    state = policy_state([named[n] for n in names])
    state["_optimizer_variables"] = slots
    return state, named, moments


def assert_adam_carried(policy, moments: dict, step: int) -> None:
    from policy_service.policy.rllib_import import adam_keys

    keys = adam_keys(policy)
    saved = policy.get_state()["optimizer_variables"]
    assert int(saved[keys.step]) == step
    for rllib, ours in (
        ("fc_1/kernel", "policy/policy_dense_0/kernel"),
        ("value_out/bias", "vf/bias"),
    ):
        m_key, v_key = keys.moments[ours]
        np.testing.assert_allclose(saved[m_key], moments[rllib][0], rtol=1e-6)
        np.testing.assert_allclose(saved[v_key], moments[rllib][1], rtol=1e-6)


def test_a_tf2_checkpoint_maps_by_rllibs_order_with_its_adam_state(tmp_path):
    """The unnamed list, named by RLlib's variable order, computes RLlib's fcnet by hand;
    Adam's moments and step land on our Adam's slots of the same weights."""
    from algorithms.ppo import PPOPolicy

    rng = np.random.default_rng(6)
    state, w, moments = tf2_state(rng)
    policy = PPOPolicy.from_rllib_checkpoint(str(write_rllib_checkpoint(tmp_path, state)))
    obs = rng.standard_normal((5, 4)).astype(np.float32)
    logits = (
        np.tanh(obs @ w["fc_1/kernel"] + w["fc_1/bias"]) @ w["fc_out/kernel"] + w["fc_out/bias"]
    )
    _, _, extra = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(extra["action_dist_inputs"], logits, rtol=1e-5, atol=1e-6)
    assert_adam_carried(policy, moments, 3)
    assert policy.config.adam_epsilon == 1e-7  # tf_keras' Adam's


@pytest.mark.parametrize(
    "powers_of, step",
    [(5, 4), (5001, 5000), (200_001, SATURATED_ADAM_STEP)],  # 0.9^5001 and 0.999^200001: 0
)
def test_a_tf_checkpoints_adam_state_is_carried_over(tmp_path, powers_of, step):
    """framework "tf": tf1.train.AdamOptimizer's slots by name, its step t from the
    float32 powers beta^(t+1), also past where they leave float32's normal range."""
    from algorithms.ppo import PPOPolicy

    rng = np.random.default_rng(7)
    weights = fcnet_weights(rng)
    moments, slots = {}, {}
    for name, value in weights.items():
        short = name.split("/", 1)[1]
        moments[short] = (rng.standard_normal(value.shape), rng.random(value.shape))
        slots[f"default_policy/{name}/Adam"] = moments[short][0].astype(np.float32)
        slots[f"default_policy/{name}/Adam_1"] = moments[short][1].astype(np.float32)
    slots["default_policy/beta1_power"] = np.float32(0.9**powers_of)
    slots["default_policy/beta2_power"] = np.float32(0.999**powers_of)
    state = {**policy_state(weights), "_optimizer_variables": slots}
    policy = PPOPolicy.from_rllib_checkpoint(str(write_rllib_checkpoint(tmp_path, state)))
    assert_adam_carried(policy, moments, step)
    assert policy.config.adam_epsilon == 1e-8  # tf1.train.AdamOptimizer's


def test_a_tf2_custom_model_without_adam_slots_is_one_line(tmp_path):
    """A custom model's tf2 weights are named by its Adam slots alone."""
    from policy_service.policy.rllib_import import rllib_weights

    state, named, _ = tf2_state(np.random.default_rng(8))
    checkpoint = read_rllib_checkpoint(write_rllib_checkpoint(tmp_path / "a", state))
    custom = ModelConfig(custom_model="ported")
    assert sorted(rllib_weights(checkpoint, custom, (4,))) == sorted(named)
    del state["_optimizer_variables"]
    checkpoint = read_rllib_checkpoint(write_rllib_checkpoint(tmp_path / "b", state))
    with pytest.raises(RLlibImportError, match="saved the custom model's 8 weights without names"):
        rllib_weights(checkpoint, custom, (4,))


# ----- RLlib's own checkpoints (slow) --------------------------------------------------------

FRAMEWORKS = ("tf", "tf2")
KINDS = ("mlp", "mlp_shared", "lstm", "cnn", "mlp_box")
ENVS = {"cnn": "rllib_image_env:ImageTarget-v0", "mlp_box": "Pendulum-v1"}
# our name of the weight whose Adam moments the oracle saved
FIRST_KERNEL = {
    "lstm": "encoder/encoder_dense_0/kernel",
    "cnn": "policy/policy_conv_0/kernel",
}


@pytest.fixture(scope="session")
def rllib_checkpoints(tmp_path_factory) -> Path:
    """RLlib's ten checkpoints and what its policies did: one RLlib process (73 s at load
    average 10-14; "tf2" comes first in it, see the oracle)."""
    from benchmark_runs import peer_venv

    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV

    out = tmp_path_factory.mktemp("rllib_checkpoints")
    runs = [f"{framework}:{kind}" for framework in FRAMEWORKS for kind in KINDS]
    proc = subprocess.run(
        [peer_venv(".venv-rllib"), str(TESTS / "rllib_checkpoint_oracle.py"), str(out), *runs],
        env=child_env(RLLIB_ENV),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def acting_inputs(expected: dict) -> tuple[np.ndarray, dict]:
    obs = expected["obs"]
    if obs.dtype == np.uint8:
        obs = obs.astype(np.float32) / np.float32(255)
    if "state_in_0" not in expected:
        return obs, {}
    return obs, {
        "state_batches": [expected["state_in_0"], expected["state_in_1"]],
        "prev_action_batch": expected["prev_actions"],
        "prev_reward_batch": expected["prev_rewards"],
    }


def assert_acts_as_rllib(policy, expected: dict) -> None:
    obs, inputs = acting_inputs(expected)
    assert len(obs) == 1000
    actions, state_out, extra = policy.compute_actions(obs, explore=False, **inputs)
    if expected["actions"].dtype.kind == "f":  # a Box's greedy action: the mean
        np.testing.assert_allclose(actions, expected["actions"], atol=1e-5, rtol=0)
    else:
        np.testing.assert_array_equal(actions, expected["actions"])
    np.testing.assert_allclose(
        extra["action_dist_inputs"], expected["dist_inputs"], atol=1e-5, rtol=0
    )
    for i, state in enumerate(state_out):
        np.testing.assert_allclose(state, expected[f"state_out_{i}"], atol=1e-5, rtol=0)


@pytest.mark.rllib
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_imported_checkpoint_acts_as_rllib(rllib_checkpoints, tmp_path, framework, kind):
    """import-rllib writes a run directory; its checkpoint, loaded as evaluate, export and
    serve load it, gives RLlib's greedy actions on 1,000 observations (the MLP through
    RLlib's MeanStdFilter statistics), dist inputs within 1e-5, and holds RLlib's Adam
    state (step and moments) on our Adam's slots."""
    from algorithms import saved_policies
    from policy_service.policy.rllib_import import adam_keys

    source = rllib_checkpoints / framework / kind
    out = tmp_path / "run"
    env = ENVS.get(kind, "CartPole-v1")
    assert main(["import-rllib", str(source / "checkpoint"), "--env", env, "--out", str(out)]) == 0
    saved = json.loads((source / "expected.json").read_text())
    policy = saved_policies.load_policy(saved_policies.locate(str(out)))
    assert policy.global_timestep == saved["global_timestep"] - 1000  # RLlib's acting added 1000
    expected = dict(np.load(source / "expected.npz"))
    assert_acts_as_rllib(policy, expected)
    keys, adam = adam_keys(policy), policy.get_state()["optimizer_variables"]
    assert int(adam[keys.step]) == saved["adam_step"] == 2  # RLlib's two minibatch updates
    m_key, v_key = keys.moments[FIRST_KERNEL.get(kind, "policy/policy_dense_0/kernel")]
    np.testing.assert_array_equal(adam[m_key], expected["adam_first"])
    np.testing.assert_array_equal(adam[v_key], expected["adam_second"])
    state = json.loads(
        (out / "checkpoints" / "checkpoint_000001" / "algorithm_state.json").read_text()
    )
    assert (state["iteration"], state["timesteps_total"]) == (1, 200)
    if kind == "mlp_box":  # RLlib's free_log_std, and its normalize_actions (default True)
        assert policy.config.model.free_log_std and policy.config.normalize_actions
    if kind == "mlp":
        assert policy.config.observation_filter == "MeanStdFilter"
        assert policy.observation_filter.stats.count == 209  # RLlib's pushes


@pytest.mark.rllib
@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_command_imports_no_rllib_and_evaluate_export_and_resume_take_it(
    rllib_checkpoints, tmp_path, framework
):
    """In a process of its own: import-rllib of RLlib's LSTM checkpoint imports no
    ray.rllib module; evaluate and export take the run; train --resume trains on from
    iteration 1 (its env steps counted on from RLlib's 200)."""
    from policy_service.policy.tf_policy import TFPolicy

    run = tmp_path / "run"
    script = (
        "import sys\n"
        "from policy_service.cli.commands import main\n"
        "status = main(sys.argv[1:])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('ray.rllib'))\n"
        "assert not loaded, loaded\n"
        "sys.exit(status)\n"
    )
    cli_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=f"{REPO}{os.pathsep}{TESTS}")
    checkpoint = rllib_checkpoints / framework / "lstm" / "checkpoint"
    imported = subprocess.run(
        [sys.executable, "-c", script, "import-rllib", str(checkpoint), "--env", "CartPole-v1",
         "--out", str(run)],
        env=cli_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-3000:]
    first = run / "checkpoints" / "checkpoint_000001"
    assert main(["evaluate", str(run), "--episodes", "2"]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "saved_model")]) == 0
    assert (tmp_path / "saved_model" / "saved_model.pb").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "policy_service.cli.commands", "train", "ppo", "--resume", str(run),
         "--stop-iters", "2"],
        env=cli_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((run / "result.json").read_text())
    assert (result["iteration"], result["timesteps_total"]) == (2, 400)
    before = TFPolicy.from_checkpoint(str(first / "policy")).get_weights()
    after = TFPolicy.from_checkpoint(str(run / "checkpoints" / "checkpoint_000002" / "policy"))
    changed = [k for k, v in after.get_weights().items() if not np.array_equal(v, before[k])]
    assert "lstm/lstm_cell/kernel" in changed
