"""Keras 3 models following the policy call convention.

Every model is called as `model(input_dict, training=...)` where `input_dict`
holds "obs" <float32>[rows, *obs_shape] and, when used, "prev_actions",
"prev_rewards", "state_in_{i}" <float32>[num_seqs, cell] and "seq_lens"
<int32>[num_seqs]; during training it also holds "loss_mask" <bool>[rows]
(False on padding), which the built-in models hand to batch norm so padding
never enters its statistics. It returns {"action_dist_inputs", "vf_preds"
(when there is a value head), "state_out": [...]}.

Recurrent rows arrive time-major within each sequence: rows = num_seqs * T.
"""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from policy_service.config import ModelConfig

_CUSTOM_MODELS: dict[str, Callable] = {}


def register_custom_model(name: str, model_cls: Callable) -> None:
    """Make `model_cls(obs_space, action_space, num_outputs, model_config)` usable
    as `config["model"]["custom_model"] = name`.

    obs_space is a Box of the *preprocessed* observation shape; model_config is
    the model config as a dict (custom_model_config included).
    """
    if not callable(model_cls):
        raise TypeError(f"custom model {name!r} must be callable, got {model_cls!r}")
    _CUSTOM_MODELS[name] = model_cls


def _dense_stack(hiddens, activation, use_batch_norm, prefix):
    """Dense layers, each optionally followed by batch norm before the activation."""
    layers = []
    for i, size in enumerate(hiddens):
        layers.append(keras.layers.Dense(size, name=f"{prefix}_dense_{i}"))
        layers.append(keras.layers.BatchNormalization(name=f"{prefix}_bn_{i}")
                      if use_batch_norm else None)
        layers.append(keras.layers.Activation(activation, name=f"{prefix}_act_{i}"))
    return [layer for layer in layers if layer is not None]


def _run_stack(layers, x, training, mask):
    for layer in layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            x = layer(x, training=training, mask=mask if training else None)
        else:
            x = layer(x)
    return x


class Encoder(keras.layers.Layer):
    """Observation -> features: conv stack for images, then the dense stack."""

    def __init__(self, obs_shape, config: ModelConfig, prefix: str, **kwargs):
        super().__init__(name=prefix, **kwargs)
        self.convs = []
        if len(obs_shape) == 3:
            filters = config.conv_filters or _default_conv_filters(obs_shape)
            for i, (out, kernel, stride) in enumerate(filters):
                self.convs.append(keras.layers.Conv2D(
                    out, kernel, strides=stride, padding="same",
                    activation=config.conv_activation, name=f"{prefix}_conv_{i}"))
            self.convs.append(keras.layers.Flatten(name=f"{prefix}_flatten"))
        self.dense = _dense_stack(config.fcnet_hiddens, config.fcnet_activation,
                                  config.use_batch_norm, prefix)

    def call(self, obs, training=False, row_mask=None):
        x = obs
        for conv in self.convs:
            x = conv(x)
        return _run_stack(self.dense, x, training, row_mask)


def _default_conv_filters(obs_shape):
    """RLlib-like defaults sized to the image: strided convs down to a small map."""
    if obs_shape[0] >= 64:
        return [[16, [8, 8], 4], [32, [4, 4], 2], [64, [3, 3], 1]]
    return [[16, [3, 3], 2], [32, [3, 3], 2]]


class FeedForwardModel(keras.Model):
    """MLP (or CNN + MLP) policy with a value head, shared or on its own branch."""

    def __init__(self, obs_space: gym.spaces.Box, action_space, num_outputs: int,
                 config: ModelConfig):
        super().__init__(name="feed_forward_model")
        self.config = config
        self.policy_trunk = Encoder(obs_space.shape, config, "policy")
        self.value_trunk = (None if config.vf_share_layers
                            else Encoder(obs_space.shape, config, "value"))
        self.logits = keras.layers.Dense(
            num_outputs, kernel_initializer=keras.initializers.Orthogonal(0.01),
            name="action_dist_inputs")
        self.value = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Orthogonal(1.0), name="vf")
        self.build_for(obs_space.shape)

    def build_for(self, obs_shape):
        self({"obs": tf.zeros((1,) + tuple(obs_shape), tf.float32)})

    def call(self, input_dict, training=False):
        obs = input_dict["obs"]
        mask = input_dict.get("loss_mask")
        features = self.policy_trunk(obs, training=training, row_mask=mask)
        value_features = (features if self.value_trunk is None
                          else self.value_trunk(obs, training=training, row_mask=mask))
        return {"action_dist_inputs": self.logits(features),
                "vf_preds": tf.squeeze(self.value(value_features), -1),
                "state_out": []}


class LSTMModel(keras.Model):
    """Encoder -> LSTM -> policy and value heads, over padded sequences.

    State: [h <float32>[num_seqs, cell], c <float32>[num_seqs, cell]].
    """

    def __init__(self, obs_space: gym.spaces.Box, action_space, num_outputs: int,
                 config: ModelConfig):
        super().__init__(name="lstm_model")
        self.config = config
        self.cell_size = config.lstm_cell_size
        self.action_space = action_space
        self.encoder = Encoder(obs_space.shape, config, "encoder")
        self.lstm = keras.layers.LSTM(self.cell_size, return_sequences=True,
                                      return_state=True, name="lstm")
        self.logits = keras.layers.Dense(
            num_outputs, kernel_initializer=keras.initializers.Orthogonal(0.01),
            name="action_dist_inputs")
        self.value = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Orthogonal(1.0), name="vf")
        zero_state = tf.zeros((1, self.cell_size))
        dummy = {"obs": tf.zeros((1,) + tuple(obs_space.shape)),
                 "state_in_0": zero_state, "state_in_1": zero_state,
                 "seq_lens": tf.ones((1,), tf.int32),
                 "prev_actions": tf.zeros((1,) + raw_action_shape(action_space),
                                          raw_action_dtype(action_space)),
                 "prev_rewards": tf.zeros((1,))}
        self(dummy)

    def call(self, input_dict, training=False):
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        features = self.encoder(input_dict["obs"], training=training,
                                row_mask=input_dict.get("loss_mask"))
        extra = []
        if self.config.lstm_use_prev_action:
            extra.append(action_features(self.action_space, input_dict["prev_actions"]))
        if self.config.lstm_use_prev_reward:
            extra.append(tf.reshape(tf.cast(input_dict["prev_rewards"], tf.float32), [-1, 1]))
        if extra:
            features = tf.concat([features] + extra, axis=-1)
        num_seqs = tf.shape(seq_lens)[0]
        max_len = tf.shape(features)[0] // num_seqs
        sequences = tf.reshape(features, [num_seqs, max_len, features.shape[-1]])
        mask = tf.sequence_mask(seq_lens, max_len)
        outputs, h, c = self.lstm(
            sequences, mask=mask,
            initial_state=[input_dict["state_in_0"], input_dict["state_in_1"]],
            training=training)
        outputs = tf.reshape(outputs, [-1, self.cell_size])
        return {"action_dist_inputs": self.logits(outputs),
                "vf_preds": tf.squeeze(self.value(outputs), -1),
                "state_out": [h, c]}

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(self.cell_size, np.float32), np.zeros(self.cell_size, np.float32)]


def raw_action_shape(action_space) -> tuple:
    """Shape of one action as the env takes it (a scalar for Discrete)."""
    return () if isinstance(action_space, gym.spaces.Discrete) else tuple(action_space.shape)


def raw_action_dtype(action_space):
    """Actions travel as int64 for (Multi)Discrete spaces, float32 otherwise."""
    return tf.float32 if isinstance(action_space, gym.spaces.Box) else tf.int64


def action_feature_shape(action_space) -> tuple:
    """Shape of one action as a model feature (one-hot for discrete actions)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return (int(action_space.n),)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return (int(np.sum(action_space.nvec)),)
    return (int(np.prod(action_space.shape)),)


def action_features(action_space, actions):
    """Actions as float features: one-hot for (Multi)Discrete, flattened for Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return tf.one_hot(tf.cast(actions, tf.int32) - int(action_space.start),
                          int(action_space.n))
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        actions = tf.cast(actions, tf.int32)
        return tf.concat([tf.one_hot(actions[:, i], int(n))
                          for i, n in enumerate(action_space.nvec.ravel())], axis=-1)
    return tf.reshape(tf.cast(actions, tf.float32), [-1, int(np.prod(action_space.shape))])


def build_model(obs_space: gym.spaces.Box, action_space, num_outputs: int,
                config: ModelConfig) -> keras.Model:
    """The model the config asks for: custom, LSTM, or feed-forward."""
    if config.custom_model is not None:
        if config.custom_model not in _CUSTOM_MODELS:
            raise ValueError(f"custom_model {config.custom_model!r} is not registered; "
                             f"registered: {sorted(_CUSTOM_MODELS)}")
        import dataclasses
        return _CUSTOM_MODELS[config.custom_model](
            obs_space, action_space, num_outputs, dataclasses.asdict(config))
    if config.use_lstm:
        return LSTMModel(obs_space, action_space, num_outputs, config)
    return FeedForwardModel(obs_space, action_space, num_outputs, config)


def initial_state(model: keras.Model) -> list[np.ndarray]:
    """Unbatched initial recurrent state of any model (empty when not recurrent)."""
    getter = getattr(model, "get_initial_state", None)
    return [np.asarray(s, np.float32) for s in getter()] if getter else []
