"""Keras models written the way a user writes them, for the custom-model tests.

None of them builds itself in __init__, most leave layer names to Keras (so
the same model gets other auto-numbered paths in another process), and each
follows the policy call convention. `register_all()` registers them under the
names in STYLES; a subprocess or Ray actor that imports this module gets them.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from policy_service import TFPolicy, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.policy import models


class LazyBatchNormModel(keras.Model):
    """The model of the custom-model issue: batch norm on the raw observation
    (momentum 0.5), then policy and value heads; variables made on first call."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__(name="my_model")
        self.bn = keras.layers.BatchNormalization(momentum=0.5, name="obs_bn")
        self.pi = keras.layers.Dense(num_outputs, name="pi")
        self.vf = keras.layers.Dense(1, name="vf")

    def call(self, input_dict, training=None):
        x = self.bn(tf.cast(input_dict["obs"], tf.float32), training=training)
        return {
            "action_dist_inputs": self.pi(x),
            "vf_preds": tf.reshape(self.vf(x), [-1]),
            "state_out": [],
        }


class LazyMLP(keras.Model):
    """Policy and value branches of two unnamed tanh layers each."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        units = model_config["custom_model_config"].get("units", 64)
        self.policy_branch = [keras.layers.Dense(units, activation="tanh") for _ in range(2)]
        self.value_branch = [keras.layers.Dense(units, activation="tanh") for _ in range(2)]
        self.pi = keras.layers.Dense(num_outputs)
        self.vf = keras.layers.Dense(1)

    def call(self, input_dict, training=None):
        x = v = input_dict["obs"]
        for policy_layer, value_layer in zip(self.policy_branch, self.value_branch):
            x, v = policy_layer(x), value_layer(v)
        return {
            "action_dist_inputs": self.pi(x),
            "vf_preds": tf.squeeze(self.vf(v), -1),
            "state_out": [],
        }


class ValueNet(keras.Model):
    """A model used inside another model."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(1)

    def call(self, x, training=None):
        return tf.squeeze(self.out(self.hidden(x)), -1)


class NestedModel(keras.Model):
    """A Sequential trunk with dropout and batch norm, and a nested value model."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.trunk = keras.Sequential(
            [
                keras.layers.Dense(16),
                keras.layers.BatchNormalization(),
                keras.layers.Activation("tanh"),
                keras.layers.Dropout(0.1),
            ]
        )
        self.pi = keras.layers.Dense(num_outputs)
        self.value = ValueNet()

    def call(self, input_dict, training=None):
        obs = input_dict["obs"]
        return {
            "action_dist_inputs": self.pi(self.trunk(obs, training=training)),
            "vf_preds": self.value(obs),
            "state_out": [],
        }


def functional_model(obs_space, action_space, num_outputs, model_config):
    """A functional model with a named dict input and dict outputs, no state_out."""
    obs = keras.Input(obs_space.shape, name="obs")
    x = keras.layers.Dense(16, activation="tanh")(obs)
    logits = keras.layers.Dense(num_outputs)(x)
    value = keras.layers.Reshape(())(keras.layers.Dense(1)(x))
    return keras.Model({"obs": obs}, {"action_dist_inputs": logits, "vf_preds": value})


def sequential_model(obs_space, action_space, num_outputs, model_config):
    """A bare Sequential, built lazily: observations in, logits out, no value head."""
    return keras.Sequential(
        [keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(num_outputs)]
    )


class LazyLSTM(keras.Model):
    """A recurrent model with its state in `get_initial_state`, built on first call."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.cell_size = 8
        self.encoder = keras.layers.Dense(8, activation="tanh")
        self.lstm = keras.layers.LSTM(self.cell_size, return_sequences=True, return_state=True)
        self.pi = keras.layers.Dense(num_outputs)
        self.vf = keras.layers.Dense(1)

    def get_initial_state(self):
        return [np.zeros(self.cell_size, np.float32), np.zeros(self.cell_size, np.float32)]

    def call(self, input_dict, training=None):
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        x = self.encoder(input_dict["obs"])
        num_seqs = tf.shape(seq_lens)[0]
        x = tf.reshape(x, [num_seqs, -1, x.shape[-1]])
        out, h, c = self.lstm(
            x,
            mask=tf.sequence_mask(seq_lens, tf.shape(x)[1]),
            initial_state=[input_dict["state_in_0"], input_dict["state_in_1"]],
        )
        out = tf.reshape(out, [-1, self.cell_size])
        return {
            "action_dist_inputs": self.pi(out),
            "vf_preds": tf.squeeze(self.vf(out), -1),
            "state_out": [h, c],
        }


class TwoBatchNormModel(keras.Model):
    """Batch norm on the observation and on a hidden layer (momentum 0.5 each),
    built on first call: the batch-norm tests' model."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.obs_bn = keras.layers.BatchNormalization(momentum=0.5)
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.hidden_bn = keras.layers.BatchNormalization(momentum=0.5)
        self.pi = keras.layers.Dense(num_outputs)
        self.vf = keras.layers.Dense(1)

    def call(self, input_dict, training=None):
        x = self.obs_bn(tf.cast(input_dict["obs"], tf.float32), training=training)
        x = self.hidden_bn(self.hidden(x), training=training)
        return {
            "action_dist_inputs": self.pi(x),
            "vf_preds": tf.squeeze(self.vf(x), -1),
            "state_out": [],
        }


class BatchNormLSTM(LazyLSTM):
    """LazyLSTM with batch norm (momentum 0.5) on the LSTM's output laid out by
    sequence, [num_seqs, T, cell]: padded steps must stay out of its moments."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__(obs_space, action_space, num_outputs, model_config)
        self.out_bn = keras.layers.BatchNormalization(momentum=0.5)

    def call(self, input_dict, training=None):
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        x = self.encoder(input_dict["obs"])
        num_seqs = tf.shape(seq_lens)[0]
        x = tf.reshape(x, [num_seqs, -1, x.shape[-1]])
        out, h, c = self.lstm(
            x,
            mask=tf.sequence_mask(seq_lens, tf.shape(x)[1]),
            initial_state=[input_dict["state_in_0"], input_dict["state_in_1"]],
        )
        out = tf.reshape(self.out_bn(out, training=training), [-1, self.cell_size])
        return {
            "action_dist_inputs": self.pi(out),
            "vf_preds": tf.squeeze(self.vf(out), -1),
            "state_out": [h, c],
        }


STYLES = {
    "lazy_bn": LazyBatchNormModel,
    "lazy_mlp": LazyMLP,
    "nested": NestedModel,
    "functional": functional_model,
    "sequential": sequential_model,
    "lazy_lstm": LazyLSTM,
}


def register_all() -> None:
    for name, model_cls in STYLES.items():
        models.register_custom_model(name, model_cls)


class ValueOptionalPolicy(TFPolicy):
    """Policy gradient plus value regression where the model has a value head
    (a bare Sequential has none)."""

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        mask = train_batch["loss_mask"]
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
            train_batch[SampleBatch.ACTIONS]
        )
        loss = -masked_mean(logp * train_batch[SampleBatch.ADVANTAGES], mask)
        if SampleBatch.VF_PREDS in out:
            loss += 0.5 * masked_mean(
                tf.square(out[SampleBatch.VF_PREDS] - train_batch[SampleBatch.VALUE_TARGETS]), mask
            )
        return loss
