"""complex_inputs.py: Dict and Tuple observations, each component its own encoder."""

import gymnasium as gym
import keras
import numpy as np
import pytest
from fakes import (
    ACTION_SPACE,
    SGDPGPolicy,
    assert_grads_close,
    assert_weights_close,
    fake_gpus,
    small_config,
)

from policy_service.data import spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.policy import models
from policy_service.policy.complex_inputs import ComplexInputEncoder
from policy_service.policy.policy_config import ModelConfig

IMAGE_AND_VECTOR = gym.spaces.Dict(
    {
        "camera": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
        "joints": gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
    }
)


def dict_batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: {
                "camera": rng.integers(0, 256, (n, 84, 84, 3)).astype(np.uint8),
                "joints": rng.uniform(-1, 1, (n, 5)).astype(np.float32),
            },
            SampleBatch.ACTIONS: rng.integers(0, 3, n),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
        }
    )


def test_components_are_the_leaves_where_the_preprocessor_puts_them():
    space = gym.spaces.Tuple(
        (
            gym.spaces.Dict(
                {"z": gym.spaces.Discrete(3), "a": gym.spaces.Box(0, 1, (4, 4, 2), np.float32)}
            ),
            gym.spaces.MultiDiscrete([2, 3]),
            gym.spaces.Box(-1, 1, (2, 3), np.float32),
        )
    )
    components = spaces.observation_components(space)
    assert [(c.path, c.start, c.shape, c.kind) for c in components] == [
        ((0, "a"), 0, (4, 4, 2), spaces.IMAGE),
        ((0, "z"), 32, (3,), spaces.ONE_HOT),
        ((1,), 35, (5,), spaces.ONE_HOT),
        ((2,), 40, (6,), spaces.VECTOR),
    ]
    obs = space.sample()
    row = spaces.make_preprocessor(space).transform_single(obs)
    assert row.shape == (46,)
    image = row[0:32].reshape(4, 4, 2)
    np.testing.assert_array_equal(image, obs[0]["a"])
    assert row[32 + obs[0]["z"]] == 1 and row[32:35].sum() == 1
    assert row[35 + obs[1][0]] == 1 and row[37 + obs[1][1]] == 1
    np.testing.assert_array_equal(row[40:46], obs[2].reshape(-1))


def test_model_input_space_carries_the_observation_space():
    prep = spaces.make_preprocessor(IMAGE_AND_VECTOR)
    box = spaces.model_input_space(prep)
    assert box.shape == (84 * 84 * 3 + 5,) and box.original_space is IMAGE_AND_VECTOR
    # a flat observation keeps the plain encoder and its weight names
    flat = spaces.model_input_space(spaces.make_preprocessor(gym.spaces.Box(-1, 1, (4,))))
    encoder = models.make_encoder(flat, ModelConfig(fcnet_hiddens=[3]), "policy")
    assert isinstance(encoder, models.Encoder)


def test_an_image_and_a_vector_train_through_a_cnn_branch():
    config = small_config(model={"post_fcnet_hiddens": [32], "vf_share_layers": True})
    policy = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, config)
    encoder = policy.model.policy_trunk
    assert isinstance(encoder, ComplexInputEncoder)
    layers = {layer.name: layer for layer in policy.model._flatten_layers()}
    convs = sorted(name for name, layer in layers.items() if isinstance(layer, keras.layers.Conv2D))
    assert convs == ["policy_camera_conv_0", "policy_camera_conv_1", "policy_camera_conv_2"]
    shapes = {name: w.shape for name, w in policy.get_weights().items()}
    # the catalog's default filters for 84x84: 84 -> 21 -> 11 -> 11 ("same"), 64 channels
    assert shapes["policy/policy_camera_conv_0/kernel"] == (8, 8, 3, 16)
    assert shapes["policy/policy_joints_dense_0/kernel"] == (5, 16)
    assert shapes["policy/policy_post_dense_0/kernel"] == (11 * 11 * 64 + 16, 32)
    assert max(s[0] for s in shapes.values() if len(s) == 2) < 84 * 84 * 3  # no flat image MLP
    batch = dict_batch(6)
    actions, _, extra = policy.compute_actions(batch[SampleBatch.OBS], explore=False)
    assert actions.shape == (6,) and extra["vf_preds"].shape == (6,)
    before = policy.get_weights()
    policy.learn_on_batch(batch)
    after = policy.get_weights()
    for name in ("policy/policy_camera_conv_0/kernel", "policy/policy_joints_dense_0/kernel"):
        assert not np.array_equal(before[name], after[name]), name


def test_conv_filters_set_the_image_branch():
    config = small_config(model={"conv_filters": [[4, [3, 3], 2], [8, [3, 3], 3]]})
    policy = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, config)
    shapes = {name: w.shape for name, w in policy.get_weights().items()}
    assert shapes["policy/policy_camera_conv_1/kernel"] == (3, 3, 4, 8)
    # 84 -> 42 -> 14, no post_fcnet_hiddens: the heads sit on the concatenation
    assert shapes["action_dist_inputs/kernel"] == (14 * 14 * 8 + 16, 3)
    assert shapes["value/value_camera_conv_0/kernel"] == (3, 3, 3, 4)  # its own branch


@pytest.mark.slow  # two policies with an 84x84 CNN, each traced on its towers: ~7 s
@pytest.mark.parametrize("num_towers", [2])
def test_gradient_on_fake_gpus_equals_one_device(num_towers):
    config = small_config(model={"post_fcnet_hiddens": [16]})
    one = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, config)
    many = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, {**config, **fake_gpus(num_towers)})
    assert many.devices == [f"/CPU:{i}" for i in range(num_towers)]
    assert_weights_close(one.get_weights(), many.get_weights(), atol=0, rtol=0)
    batch = dict_batch(7, seed=2)  # 7 rows: uneven towers, one padded row
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = many.compute_gradients(batch)
    assert s1["valid_rows"] == s2["valid_rows"] == 7
    assert_grads_close(g1, g2, atol=1e-5, rtol=1e-4)
    one.learn_on_batch(batch)
    many.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), many.get_weights(), atol=1e-5, rtol=1e-4)


def test_tuple_of_discrete_and_vector_is_one_hot_and_dense_by_hand():
    space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)))
    model = {"fcnet_hiddens": [4], "post_fcnet_hiddens": [3], "vf_share_layers": True}
    policy = SGDPGPolicy(space, ACTION_SPACE, small_config(model=model))
    w = policy.get_weights()
    obs = (np.array([0, 2, 1]), np.array([[0.5, -0.5], [0.1, 0.2], [-1.0, 1.0]], np.float32))

    def dense(x, name, activation):
        return activation(x @ w[f"{name}/kernel"] + w[f"{name}/bias"])

    one_hot = np.eye(3, dtype=np.float32)[obs[0]]
    parts = [
        dense(one_hot, "policy/policy_0_dense_0", np.tanh),
        dense(obs[1], "policy/policy_1_dense_0", np.tanh),
    ]
    relu = lambda x: np.maximum(x, 0)  # noqa: E731  # post_fcnet_activation's default
    features = dense(np.concatenate(parts, axis=1), "policy/policy_post_dense_0", relu)
    logits = dense(features, "action_dist_inputs", lambda x: x)
    _, _, extra = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(extra["action_dist_inputs"], logits, rtol=1e-4, atol=1e-5)


def test_dict_observation_through_an_lstm():
    model = {"use_lstm": True, "max_seq_len": 4, "conv_filters": [[4, [3, 3], 4]]}
    policy = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, small_config(model=model))
    assert isinstance(policy.model.encoder, ComplexInputEncoder)
    obs = dict_batch(3)[SampleBatch.OBS]
    actions, state, _ = policy.compute_actions(obs)
    assert actions.shape == (3,) and [s.shape for s in state] == [(3, 8), (3, 8)]


class OriginalSpaceModel(keras.Model):
    """A custom model that keeps the space it was built for, as RLlib's models read
    `obs_space.original_space` to split a Dict observation themselves."""

    built_for: list = []

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        OriginalSpaceModel.built_for.append(obs_space)
        self.pi = keras.layers.Dense(num_outputs)
        self.vf = keras.layers.Dense(1)

    def call(self, input_dict, training=None):
        x = input_dict["obs"]
        return {
            "action_dist_inputs": self.pi(x),
            "vf_preds": keras.ops.squeeze(self.vf(x), -1),
            "state_out": [],
        }


def test_a_custom_model_gets_the_original_space():
    models.register_custom_model("original_space_model", OriginalSpaceModel)
    OriginalSpaceModel.built_for.clear()
    config = small_config(model={"custom_model": "original_space_model"})
    SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, config)
    assert len(OriginalSpaceModel.built_for) == 1
    obs_space = OriginalSpaceModel.built_for[0]
    assert obs_space.shape == (84 * 84 * 3 + 5,)
    assert obs_space.original_space is IMAGE_AND_VECTOR


def test_the_default_model_encodes_a_dict_observation_per_component():
    config = small_config(model={"conv_filters": [[4, [3, 3], 4]], "vf_share_layers": True})
    policy = SGDPGPolicy(IMAGE_AND_VECTOR, ACTION_SPACE, config)
    assert isinstance(policy.model.policy_trunk, ComplexInputEncoder)
    shapes = {name: w.shape for name, w in policy.get_weights().items()}
    assert shapes["policy/policy_camera_conv_0/kernel"] == (3, 3, 3, 4)
    actions, _, _ = policy.compute_actions(dict_batch(2)[SampleBatch.OBS], explore=False)
    assert actions.shape == (2,)
