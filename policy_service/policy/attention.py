"""GTrXL (Parisotto et al. 2019), RLlib's `use_attention` model: gated transformer units
over a memory of each unit's past inputs.

The recurrent state is the memory itself: state_in_i <float32>[num_seqs, M * D] holds the
last M = attention_memory_inference inputs of unit i, flattened (zeros before the
episode's start), and state_out_i is that window moved past the sequence's valid steps. It travels
like an LSTM's state (recorded per row while acting, taken at each sequence start for
training), so acting one step at a time and training on padded sequences see the same
memory: each step attends to itself and the M steps before it (in the memory or earlier
in the sequence; RLlib's training also lets it see older ones), with Transformer-XL's
relative positions.
"""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from policy_service.config import ConfigError
from policy_service.policy.action_features import action_features, action_tensor_specs
from policy_service.policy.encoders import Encoder
from policy_service.policy.policy_config import ModelConfig


def sinusoid_table(length, dim: int) -> tf.Tensor:
    """<float32>[length, dim] Transformer-XL's encodings of distances 0 .. length-1."""
    distances = tf.cast(tf.range(length), tf.float32)[:, None]
    inverse_freq = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    angles = distances * inverse_freq[None, :]
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)[:, :dim]


class RelativeAttention(keras.layers.Layer):
    """Multi-head attention of T queries over [memory; inputs] (M + T keys) with
    relative position terms (Transformer-XL: content bias u, position bias v). A query
    sees its own step and the M before it, memory or sequence, as it did while acting."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.head_dim, self.dim = num_heads, head_dim, dim
        width = num_heads * head_dim
        self.qkv = keras.layers.Dense(3 * width, use_bias=False, name="qkv")
        self.position = keras.layers.Dense(width, use_bias=False, name="position")
        self.out = keras.layers.Dense(dim, use_bias=False, name="out")

    def build(self, input_shape):
        shape = (self.num_heads, self.head_dim)
        self.u = self.add_weight(shape=shape, initializer="zeros", name="u")
        self.v = self.add_weight(shape=shape, initializer="zeros", name="v")

    def call(self, keys_in, memory_len: int):
        """keys_in <float32>[S, M + T, D] -> <float32>[S, T, D] for the last T positions."""
        total = tf.shape(keys_in)[1]
        steps = total - memory_len

        def heads(x):
            return tf.reshape(x, [tf.shape(x)[0], -1, self.num_heads, self.head_dim])

        q, k, v = (heads(x) for x in tf.split(self.qkv(keys_in), 3, axis=-1))
        q = q[:, memory_len:]
        # distance of key j from query i (at absolute position M + i): M + i - j
        distance = memory_len + tf.range(steps)[:, None] - tf.range(total)[None, :]
        r = heads(self.position(sinusoid_table(total, self.dim)[None]))[0]  # [M+T, H, Dh]
        content = tf.einsum("sihd,sjhd->shij", q + self.u, k)
        by_distance = tf.einsum("sihd,rhd->shir", q + self.v, r)
        picked = tf.one_hot(tf.maximum(distance, 0), total)  # [T, M+T, M+T]
        positional = tf.einsum("shir,ijr->shij", by_distance, picked)
        scores = (content + positional) / float(np.sqrt(self.head_dim))
        # a query sees as many past steps as acting keeps in memory, and no later one
        visible = tf.logical_and(distance >= 0, distance <= memory_len)
        scores = tf.where(visible[None, None], scores, -1e9)
        attended = tf.einsum("shij,sjhd->sihd", tf.nn.softmax(scores, axis=-1), v)
        return self.out(tf.reshape(attended, [tf.shape(q)[0], -1, self.num_heads * self.head_dim]))


class GRUGate(keras.layers.Layer):
    """GTrXL's gate: a GRU step with the residual x as its state and the sublayer output
    y as its input; `gate_bias` > 0 starts it near the identity (x)."""

    def __init__(self, dim: int, gate_bias: float, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.gate_bias = dim, float(gate_bias)

    def build(self, input_shape):
        d = self.dim
        self.w = self.add_weight(shape=(d, 3 * d), initializer="glorot_uniform", name="w")
        self.u = self.add_weight(shape=(d, 3 * d), initializer="glorot_uniform", name="u")
        self.bias = self.add_weight(
            shape=(d,), initializer=keras.initializers.Constant(self.gate_bias), name="bias"
        )

    def call(self, x, y):
        wr, wz, wh = tf.split(tf.matmul(y, self.w), 3, axis=-1)
        ur, uz, uh = tf.split(self.u, 3, axis=-1)
        r = tf.sigmoid(wr + tf.matmul(x, ur))
        z = tf.sigmoid(wz + tf.matmul(x, uz) - self.bias)
        h = tf.tanh(wh + tf.matmul(r * x, uh))
        return (1.0 - z) * x + z * h


class TransformerUnit(keras.layers.Layer):
    """Layer norm, relative attention, gate; layer norm, position-wise MLP, gate."""

    def __init__(self, config: ModelConfig, index: int, **kwargs):
        super().__init__(name=f"transformer_unit_{index}", **kwargs)
        dim = config.attention_dim
        self.norm_attention = keras.layers.LayerNormalization(name="norm_attention")
        self.attention = RelativeAttention(
            dim, config.attention_num_heads, config.attention_head_dim, name="attention"
        )
        self.gate_attention = GRUGate(dim, config.attention_init_gru_gate_bias, name="gate_0")
        self.norm_mlp = keras.layers.LayerNormalization(name="norm_mlp")
        self.mlp = [
            keras.layers.Dense(config.attention_position_wise_mlp_dim, "relu", name="mlp_0"),
            keras.layers.Dense(dim, "relu", name="mlp_1"),
        ]
        self.gate_mlp = GRUGate(dim, config.attention_init_gru_gate_bias, name="gate_1")

    def call(self, x, memory):
        """x <float32>[S, T, D], memory [S, M, D] -> [S, T, D]."""
        keys_in = self.norm_attention(tf.concat([memory, x], axis=1))
        attended = tf.nn.relu(self.attention(keys_in, memory_len=memory.shape[1]))
        x = self.gate_attention(x, attended)
        y = self.norm_mlp(x)
        for layer in self.mlp:
            y = layer(y)
        return self.gate_mlp(x, y)


def check_attention_config(config: ModelConfig) -> None:
    """The attention keys this model takes as RLlib's, in one line each where not."""
    for key in ("attention_use_n_prev_actions", "attention_use_n_prev_rewards"):
        value = getattr(config, key)
        if value > 1:
            raise ConfigError(
                f"config.model.{key} must be 0 or 1 (the input dict holds the previous "
                f"step only), got {value}"
            )
    if config.attention_memory_training > config.attention_memory_inference:
        raise ConfigError(
            "config.model.attention_memory_training must be <= attention_memory_inference "
            f"({config.attention_memory_inference}: the memory the state carries), got "
            f"{config.attention_memory_training}"
        )


class GTrXLModel(keras.Model):
    """Encoder (fcnet_hiddens) [+ previous action and reward] -> linear to attention_dim
    -> attention_num_transformer_units gated units -> policy and value heads."""

    def __init__(
        self, obs_space: gym.spaces.Box, action_space, num_outputs: int, config: ModelConfig
    ):
        check_attention_config(config)
        super().__init__(name="gtrxl_model")
        self.config = config
        self.action_space = action_space
        self.memory = config.attention_memory_inference
        self.dim = config.attention_dim
        self.encoder = Encoder(
            obs_space.shape,
            config,
            "encoder",
            space=getattr(obs_space, "original_space", obs_space),
        )
        self.linear = keras.layers.Dense(self.dim, name="linear")
        self.units = [
            TransformerUnit(config, i) for i in range(config.attention_num_transformer_units)
        ]
        self.logits = keras.layers.Dense(num_outputs, name="action_dist_inputs")
        self.value = keras.layers.Dense(1, name="vf")
        state = [tf.zeros((1, self.memory * self.dim)) for _ in self.units]
        self(
            {
                "obs": tf.zeros((1, *obs_space.shape)),
                **{f"state_in_{i}": s for i, s in enumerate(state)},
                "seq_lens": tf.ones((1,), tf.int32),
                "prev_actions": tf.nest.map_structure(
                    lambda spec: tf.zeros((1, *spec.shape[1:]), spec.dtype),
                    action_tensor_specs(action_space),
                ),
                "prev_rewards": tf.zeros((1,)),
            }
        )

    def call(self, input_dict, training=False):
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        features = self.encoder(
            input_dict["obs"], training=training, row_mask=input_dict.get("loss_mask")
        )
        extra = []
        if self.config.attention_use_n_prev_actions:
            extra.append(action_features(self.action_space, input_dict["prev_actions"]))
        if self.config.attention_use_n_prev_rewards:
            extra.append(tf.reshape(tf.cast(input_dict["prev_rewards"], tf.float32), [-1, 1]))
        if extra:
            features = tf.concat([features, *extra], axis=-1)
        x = self.linear(features)
        num_seqs = tf.shape(seq_lens)[0]
        steps = tf.shape(x)[0] // num_seqs
        x = tf.reshape(x, [num_seqs, steps, self.dim])
        attended = self.config.attention_memory_training if training else self.memory
        state_out = []
        for i, unit in enumerate(self.units):
            memory = tf.reshape(input_dict[f"state_in_{i}"], [-1, self.memory, self.dim])
            state_out.append(
                tf.reshape(_moved_window(memory, x, seq_lens), [-1, self.memory * self.dim])
            )
            x = unit(x, memory[:, self.memory - attended :])
        out = tf.reshape(x, [-1, self.dim])
        return {
            "action_dist_inputs": self.logits(out),
            "vf_preds": tf.squeeze(self.value(out), -1),
            "state_out": state_out,
        }

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(self.memory * self.dim, np.float32) for _ in self.units]


def _moved_window(memory, inputs, seq_lens):
    """<float32>[S, M, D]: the last M of [memory; the sequence's valid inputs]."""
    joined = tf.concat([memory, inputs], axis=1)
    window = memory.shape[1]
    positions = seq_lens[:, None] + tf.range(window)[None, :]
    return tf.gather(joined, positions, axis=1, batch_dims=1)
