"""models.py: built-in MLP, CNN and LSTM models and custom model registration."""

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf
from fakes import (
    ACTION_SPACE,
    CELL,
    OBS_SPACE,
    PGPolicy,
    ReturnsPGPolicy,
    fake_gpus,
    mlp_batch,
    small_config,
    weights_differ,
)

from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.policy import models
from policy_service.policy.policy_config import ModelConfig


def shapes(policy):
    return {name: tuple(w.shape) for name, w in policy.get_weights().items()}


def test_mlp_output_shapes_and_layer_sizes():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"fcnet_hiddens": [16, 12]}))
    out = policy.model({"obs": tf.zeros((5, 4))}, training=False)
    assert out["action_dist_inputs"].shape == (5, 3)
    assert out["vf_preds"].shape == (5,)
    assert out["state_out"] == []
    s = shapes(policy)
    prefix = ""
    assert s[prefix + "policy/policy_dense_0/kernel"] == (4, 16)
    assert s[prefix + "policy/policy_dense_1/kernel"] == (16, 12)
    assert s[prefix + "value/value_dense_0/kernel"] == (4, 16)
    assert s[prefix + "value/value_dense_1/kernel"] == (16, 12)
    assert s[prefix + "action_dist_inputs/kernel"] == (12, 3)
    assert s[prefix + "vf/kernel"] == (12, 1)
    assert not policy.is_recurrent() and policy.num_state_tensors() == 0
    assert policy.get_initial_state() == []


def test_box_actions_get_mean_and_log_std_outputs():
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = PGPolicy(OBS_SPACE, space, small_config())
    out = policy.model({"obs": tf.zeros((3, 4))})
    assert out["action_dist_inputs"].shape == (3, 4)


def test_vf_share_layers_puts_the_value_head_on_the_policy_trunk():
    shared = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"vf_share_layers": True}))
    separate = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"vf_share_layers": False}))
    assert not any(name.startswith("value/") for name in shared.get_weights())
    assert any(name.startswith("value/") for name in separate.get_weights())
    assert len(shared.model.trainable_variables) == 8  # 2 dense + 2 heads, kernel and bias
    assert len(separate.model.trainable_variables) == 12


def _vf_only_batch(n):
    batch = mlp_batch(n)
    batch["advantages"] = np.zeros(n, np.float32)  # only the value loss remains
    return batch


def test_value_loss_reaches_the_policy_trunk_only_when_shared():
    batch = _vf_only_batch(16)
    for share in (True, False):
        policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"vf_share_layers": share}))
        grads, _ = policy.compute_gradients(batch)
        by_name = dict(
            zip([v.path.split("/", 1)[1] for v in policy.model.trainable_variables], grads)
        )
        trunk = by_name["policy/policy_dense_0/kernel"]
        assert (np.abs(trunk).max() > 0) == share
        assert np.abs(by_name["action_dist_inputs/kernel"]).max() == 0


def test_cnn_on_84x84x4_observations():
    obs_space = gym.spaces.Box(0.0, 1.0, (84, 84, 4), np.float32)
    policy = PGPolicy(obs_space, ACTION_SPACE, small_config(model={"vf_share_layers": True}))
    s = shapes(policy)
    prefix = "policy/"
    assert s[prefix + "policy_conv_0/kernel"] == (8, 8, 4, 16)
    assert s[prefix + "policy_conv_1/kernel"] == (4, 4, 16, 32)
    assert s[prefix + "policy_conv_2/kernel"] == (3, 3, 32, 64)
    # "same" padding: 84 -> 21 (stride 4) -> 11 (stride 2) -> 11 (stride 1)
    assert s[prefix + "policy_dense_0/kernel"] == (11 * 11 * 64, 16)
    rng = np.random.default_rng(0)
    obs = rng.uniform(0, 1, (3, 84, 84, 4)).astype(np.float32)
    actions, states, extra = policy.compute_actions(obs, explore=False)
    assert actions.shape == (3,) and states == []
    assert extra["action_dist_inputs"].shape == (3, 3) and extra["vf_preds"].shape == (3,)
    batch = mlp_batch(3)
    batch["obs"] = obs
    before = policy.get_weights()
    policy.learn_on_batch(batch)
    assert weights_differ(before, policy.get_weights())


def test_cnn_custom_conv_filters():
    obs_space = gym.spaces.Box(0.0, 1.0, (84, 84, 4), np.float32)
    policy = PGPolicy(
        obs_space,
        ACTION_SPACE,
        small_config(
            model={"vf_share_layers": True, "conv_filters": [[4, [3, 3], 2], [8, [5, 5], 3]]}
        ),
    )
    s = shapes(policy)
    assert s["policy/policy_conv_0/kernel"] == (3, 3, 4, 4)
    assert s["policy/policy_conv_1/kernel"] == (5, 5, 4, 8)
    assert s["policy/policy_dense_0/kernel"] == (14 * 14 * 8, 16)


def lstm_policy(**model):
    return PGPolicy(
        OBS_SPACE, ACTION_SPACE, small_config(model={"use_lstm": True, "max_seq_len": 5, **model})
    )


def test_lstm_state_shapes():
    policy = lstm_policy()
    assert policy.is_recurrent() and policy.num_state_tensors() == 2
    init = policy.get_initial_state()
    assert [s.shape for s in init] == [(CELL,), (CELL,)]
    assert all(s.dtype == np.float32 and not s.any() for s in init)
    actions, states, extra = policy.compute_actions(np.zeros((6, 4), np.float32))
    assert actions.shape == (6,)
    assert [s.shape for s in states] == [(6, CELL), (6, CELL)]
    assert extra["vf_preds"].shape == (6,)
    action, state, _ = policy.compute_single_action(np.zeros(4, np.float32), init)
    assert np.shape(action) == () and [s.shape for s in state] == [(CELL,), (CELL,)]
    with pytest.raises(ValueError, match=r"state_in_0 has shape \(6, 3\)"):
        policy.compute_actions(np.zeros((6, 4), np.float32), [np.zeros((6, 3)), np.zeros((6, 3))])


@pytest.mark.parametrize("prev_action, prev_reward", [(False, False), (False, True), (True, True)])
def test_lstm_padded_batch_equals_step_by_step_acting(prev_action, prev_reward):
    """A padded batch of sequences through the model (training=False) gives the
    same outputs on valid rows, and the same final state, as acting one step at
    a time with compute_actions carrying the state."""
    policy = lstm_policy(lstm_use_prev_action=prev_action, lstm_use_prev_reward=prev_reward)
    rng = np.random.default_rng(1)
    seq_lens = [3, 5, 1]
    T = 5
    obs = rng.uniform(-1, 1, (3, T, 4)).astype(np.float32)
    prev_actions = rng.integers(0, 3, (3, T))
    prev_rewards = rng.normal(size=(3, T)).astype(np.float32)
    h0 = rng.normal(size=(3, CELL)).astype(np.float32)
    c0 = rng.normal(size=(3, CELL)).astype(np.float32)
    valid = np.arange(T)[None, :] < np.asarray(seq_lens)[:, None]
    out = policy.model(
        {
            "obs": tf.constant(obs.reshape(3 * T, 4) * valid.reshape(-1, 1)),
            "prev_actions": tf.constant(prev_actions.reshape(-1) * valid.reshape(-1)),
            "prev_rewards": tf.constant(prev_rewards.reshape(-1) * valid.reshape(-1)),
            "state_in_0": tf.constant(h0),
            "state_in_1": tf.constant(c0),
            "seq_lens": tf.constant(seq_lens, tf.int32),
        },
        training=False,
    )
    logits = out["action_dist_inputs"].numpy().reshape(3, T, 3)
    values = out["vf_preds"].numpy().reshape(3, T)
    for i, length in enumerate(seq_lens):
        state = [h0[i : i + 1], c0[i : i + 1]]
        for t in range(length):
            _, state, extra = policy.compute_actions(
                obs[i, t : t + 1],
                state,
                prev_actions[i, t : t + 1],
                prev_rewards[i, t : t + 1],
                explore=False,
            )
            np.testing.assert_allclose(
                extra["action_dist_inputs"][0], logits[i, t], rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(extra["vf_preds"][0], values[i, t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            state[0][0], out["state_out"][0].numpy()[i], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            state[1][0], out["state_out"][1].numpy()[i], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize(
    "action_space, prev_action, prev_reward",
    [
        (ACTION_SPACE, False, False),
        (ACTION_SPACE, False, True),
        (ACTION_SPACE, True, False),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), True, False),
    ],
)
def test_prev_action_and_reward_reach_the_lstm_only_when_enabled(
    action_space, prev_action, prev_reward
):
    policy = PGPolicy(
        OBS_SPACE,
        action_space,
        small_config(
            model={
                "use_lstm": True,
                "lstm_use_prev_action": prev_action,
                "lstm_use_prev_reward": prev_reward,
            }
        ),
    )
    obs = np.zeros((4, 4), np.float32)
    if isinstance(action_space, gym.spaces.Discrete):
        prev_a = np.array([0, 1, 2, 1])
    else:
        prev_a = np.random.default_rng(0).uniform(-1, 1, (4, 2)).astype(np.float32)
    prev_r = np.array([0.0, 1.0, -1.0, 5.0], np.float32)
    _, _, plain = policy.compute_actions(obs, explore=False)
    _, _, with_a = policy.compute_actions(obs, None, prev_a, None, explore=False)
    _, _, with_r = policy.compute_actions(obs, None, None, prev_r, explore=False)
    assert (not np.allclose(plain["vf_preds"], with_a["vf_preds"])) == prev_action
    assert (not np.allclose(plain["vf_preds"], with_r["vf_preds"])) == prev_reward


def test_batch_norm_layers_follow_each_hidden_dense_layer():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"use_batch_norm": True}))
    names = policy.get_weights()
    for trunk in ("policy", "value"):
        for i in range(2):
            base = f"{trunk}/{trunk}_bn_{i}/"
            assert names[base + "moving_mean"].shape == (16,)
            assert names[base + "moving_variance"].shape == (16,)
    assert len(policy.towers._bn_layers) == 4


def test_batch_norm_acting_uses_moving_statistics():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"use_batch_norm": True}))
    policy.learn_on_batch(mlp_batch(32))
    obs = np.random.default_rng(3).uniform(-1, 1, (10, 4)).astype(np.float32)
    _, _, whole = policy.compute_actions(obs, explore=False)
    _, _, alone = policy.compute_actions(obs[:1], explore=False)
    # training=False: a row's output does not depend on the rest of the batch
    np.testing.assert_allclose(
        alone["action_dist_inputs"][0], whole["action_dist_inputs"][0], rtol=1e-5, atol=1e-6
    )
    # and it is the numpy forward pass with the moving statistics
    w = policy.get_weights()
    x = obs
    for i in range(2):
        x = x @ w[f"policy/policy_dense_{i}/kernel"] + w[f"policy/policy_dense_{i}/bias"]
        bn = f"policy/policy_bn_{i}/"
        x = (x - w[bn + "moving_mean"]) / np.sqrt(w[bn + "moving_variance"] + 1e-3) * w[
            bn + "gamma"
        ] + w[bn + "beta"]
        x = np.tanh(x)
    logits = x @ w["action_dist_inputs/kernel"] + w["action_dist_inputs/bias"]
    np.testing.assert_allclose(whole["action_dist_inputs"], logits, rtol=1e-4, atol=1e-5)
    assert not np.allclose(w["policy/policy_bn_0/moving_mean"], 0)  # the step moved them


class TinyCustomModel(keras.Model):
    """A custom model in the policy call convention, sized by custom_model_config."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__(name="tiny_custom_model")
        self.model_config = model_config
        self.hidden = keras.layers.Dense(
            model_config["custom_model_config"]["units"], activation="tanh", name="hidden"
        )
        self.pi = keras.layers.Dense(num_outputs, name="pi")
        self.vf = keras.layers.Dense(1, name="vf")
        self({"obs": tf.zeros((1,) + tuple(obs_space.shape))})

    def call(self, input_dict, training=False):
        h = self.hidden(input_dict["obs"])
        return {
            "action_dist_inputs": self.pi(h),
            "vf_preds": tf.squeeze(self.vf(h), -1),
            "state_out": [],
        }


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(models, "_CUSTOM_MODELS", models.custom_model_registry())


def test_registered_custom_model_is_built_and_trains_on_towers(clean_registry):
    models.register_custom_model("tiny", TinyCustomModel)
    policy = PGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(
            model={"custom_model": "tiny", "custom_model_config": {"units": 5}}, **fake_gpus(2)
        ),
    )
    assert isinstance(policy.model, TinyCustomModel)
    assert policy.model.model_config["custom_model_config"] == {"units": 5}
    assert policy.model.model_config["fcnet_hiddens"] == [16, 16]
    assert tuple(policy.model.hidden.kernel.shape) == (4, 5)
    actions, _, _ = policy.compute_actions(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,)
    before = policy.get_weights()
    policy.learn_on_batch(mlp_batch(10))
    assert weights_differ(before, policy.get_weights())


def test_custom_model_through_build_model(clean_registry):
    models.register_custom_model("tiny2", TinyCustomModel)
    config = ModelConfig(custom_model="tiny2", custom_model_config={"units": 2})
    model = models.build_model(OBS_SPACE, ACTION_SPACE, 3, config)
    assert isinstance(model, TinyCustomModel)
    assert models.initial_state(model) == []


def test_unknown_custom_model_is_an_error_naming_it(clean_registry):
    models.register_custom_model("tiny", TinyCustomModel)
    with pytest.raises(ValueError) as err:
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"custom_model": "tinyy"}))
    assert "'tinyy' is not a name given to register_custom_model" in str(err.value)
    assert "'tiny'" in str(err.value)  # lists what is registered


def test_registering_something_not_callable_is_an_error(clean_registry):
    with pytest.raises(TypeError, match="'bad'"):
        models.register_custom_model("bad", 42)


class UnnamedCustomModel(TinyCustomModel):
    """Named layers, but the model name left to Keras ("unnamed_custom_model_3")."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        keras.Model.__init__(self)
        self.model_config = model_config
        self.hidden = keras.layers.Dense(4, activation="tanh", name="hidden")
        self.pi = keras.layers.Dense(num_outputs, name="pi")
        self.vf = keras.layers.Dense(1, name="vf")
        self({"obs": tf.zeros((1,) + tuple(obs_space.shape))})


def test_custom_model_policy_state_moves_to_another_policy(clean_registry):
    models.register_custom_model("unnamed", UnnamedCustomModel)
    config = small_config(model={"custom_model": "unnamed"})
    source = PGPolicy(OBS_SPACE, ACTION_SPACE, config)
    source.learn_on_batch(mlp_batch(10))
    target = PGPolicy(OBS_SPACE, ACTION_SPACE, config)
    target.set_weights(source.get_weights())  # weight names already match
    target.set_state(source.get_state())
    batch = mlp_batch(10, seed=1)
    assert source.learn_on_batch(batch) == target.learn_on_batch(batch)
    for name, value in source.get_weights().items():
        np.testing.assert_array_equal(value, target.get_weights()[name])


# ----- RLlib's catalog keys: free_log_std, post_fcnet_hiddens / post_fcnet_activation --------

BOX_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def box_action_batch(n, seed=0):
    batch = mlp_batch(n, seed=seed)
    batch["actions"] = np.random.default_rng(seed).uniform(-1, 1, (n, 2)).astype(np.float32)
    return batch


def test_catalog_key_defaults_are_rllibs():
    config = ModelConfig()
    assert config.free_log_std is False
    assert config.post_fcnet_hiddens == []
    assert config.post_fcnet_activation == "relu"


@pytest.mark.parametrize("lstm", [False, True])
def test_free_log_std_is_one_trainable_variable_for_every_observation(lstm):
    model = {"free_log_std": True, "use_lstm": lstm, "max_seq_len": 4}
    policy = PGPolicy(OBS_SPACE, BOX_ACTIONS, small_config(model=model))
    log_std = policy.get_weights()["log_std/log_std"]
    assert log_std.shape == (2,) and not log_std.any()  # RLlib starts it at 0
    assert any(v.path.endswith("log_std/log_std") for v in policy.model.trainable_variables)
    obs = np.random.default_rng(4).uniform(-1, 1, (6, 4)).astype(np.float32)
    _, _, extra = policy.compute_actions(obs, explore=True)
    means, log_stds = np.split(extra["action_dist_inputs"], 2, axis=1)
    assert not np.allclose(means, means[:1])  # the means depend on the observation
    np.testing.assert_array_equal(log_stds, np.zeros((6, 2), np.float32))
    batch = box_action_batch(16)
    if lstm:
        batch["eps_id"] = np.repeat(np.arange(4), 4)
        for i in range(2):
            batch[f"state_in_{i}"] = np.zeros((16, CELL), np.float32)
    policy.learn_on_batch(batch)
    trained = policy.get_weights()["log_std/log_std"]
    assert np.abs(trained).max() > 0  # the policy-gradient loss moved it
    _, _, extra = policy.compute_actions(obs, explore=False)
    _, log_stds = np.split(extra["action_dist_inputs"], 2, axis=1)
    np.testing.assert_array_equal(log_stds, np.tile(trained, (6, 1)))


def test_free_log_std_gradient_on_two_fake_gpus_equals_one_device():
    config = small_config(model={"free_log_std": True})
    one = PGPolicy(OBS_SPACE, BOX_ACTIONS, config)
    two = PGPolicy(OBS_SPACE, BOX_ACTIONS, {**config, **fake_gpus(2)})
    batch = box_action_batch(21, seed=3)
    g1, _ = one.compute_gradients(batch)
    g2, _ = two.compute_gradients(batch)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_free_log_std_without_a_box_action_is_one_line_naming_the_key():
    with pytest.raises(ValueError) as err:
        PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"free_log_std": True}))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("config.model.free_log_std needs a 1-D Box action space")
    assert "Discrete(3)" in message


def test_post_fcnet_layers_follow_the_hidden_layers_with_rllibs_activations():
    model = {"fcnet_hiddens": [16], "post_fcnet_hiddens": [8, 6], "fcnet_activation": "tanh"}
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model=model))
    s = shapes(policy)
    for trunk in ("policy", "value"):
        assert s[f"{trunk}/{trunk}_dense_0/kernel"] == (4, 16)
        assert s[f"{trunk}/{trunk}_post_dense_0/kernel"] == (16, 8)
        assert s[f"{trunk}/{trunk}_post_dense_1/kernel"] == (8, 6)
    assert s["action_dist_inputs/kernel"] == (6, 3)
    assert s["vf/kernel"] == (6, 1)
    # RLlib's fully connected model: the post layers of a vector take fcnet_activation
    trunk = policy.model.policy_trunk
    activations = [
        layer.activation.__name__ for layer in trunk.dense if hasattr(layer, "activation")
    ]
    assert activations == ["linear", "tanh"] * 3
    # with no fcnet_hiddens, and for images, they take post_fcnet_activation
    only_post = PGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(model={"fcnet_hiddens": [], "post_fcnet_hiddens": [5]}),
    )
    names = [layer.activation.__name__ for layer in only_post.model.policy_trunk.dense[1::2]]
    assert names == ["relu"]
    obs = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    w = policy.get_weights()
    x = np.tanh(obs @ w["policy/policy_dense_0/kernel"] + w["policy/policy_dense_0/bias"])
    for i in range(2):
        x = np.tanh(
            x @ w[f"policy/policy_post_dense_{i}/kernel"] + w[f"policy/policy_post_dense_{i}/bias"]
        )
    logits = x @ w["action_dist_inputs/kernel"] + w["action_dist_inputs/bias"]
    _, _, extra = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(extra["action_dist_inputs"], logits, rtol=1e-4, atol=1e-5)
    before = policy.get_weights()
    policy.learn_on_batch(mlp_batch(12))
    after = policy.get_weights()
    assert not np.array_equal(
        before["policy/policy_post_dense_1/kernel"], after["policy/policy_post_dense_1/kernel"]
    )


def test_post_fcnet_layers_of_an_image_encoder_take_post_fcnet_activation():
    obs_space = gym.spaces.Box(0.0, 1.0, (16, 16, 3), np.float32)
    model = {"vf_share_layers": True, "post_fcnet_hiddens": [7], "post_fcnet_activation": "elu"}
    policy = PGPolicy(obs_space, ACTION_SPACE, small_config(model=model))
    s = shapes(policy)
    assert s["policy/policy_post_dense_0/kernel"] == (16, 7)
    post_activation = policy.model.policy_trunk.dense[-1]
    assert post_activation.activation.__name__ == "elu"
    assert s["action_dist_inputs/kernel"] == (7, 3)


def test_a_sampled_fragment_trains_free_log_std_and_post_fcnet_layers():
    """Acting on Pendulum-v1 and a step on the fragment: the state-independent log std
    and the post-fcnet layer both learn."""
    model = {"fcnet_hiddens": [16], "post_fcnet_hiddens": [8], "free_log_std": True}
    worker = RolloutWorker("Pendulum-v1", ReturnsPGPolicy, {"seed": 1, "model": model}, seed=1)
    try:
        batch, _ = worker.sample()
        policy = worker.policy
        before = policy.get_weights()["log_std/log_std"]
        stats = policy.learn_on_batch(batch)
        assert np.isfinite(stats["total_loss"])
        after = policy.get_weights()
        assert after["policy/policy_post_dense_0/kernel"].shape == (16, 8)
        assert not np.array_equal(before, after["log_std/log_std"])
    finally:
        worker.stop()
