"""Actions as model inputs: the tensor specs of a batch of actions, and actions as
float features (one-hot for discrete leaves), for models that read the previous action."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import tensorflow as tf

from policy_service.data import spaces


def action_tensor_specs(action_space):
    """TensorSpecs of a batch of actions as the env takes them, nested like the space:
    <int64>[B] (Discrete), <int64>[B, k] (MultiDiscrete), <float32>[B, d] (Box)."""
    return spaces.nest_actions(
        action_space,
        [
            tf.TensorSpec((None, *shape), tf.as_dtype(dtype))
            for dtype, shape in spaces.action_leaf_specs(action_space)
        ],
    )


def action_feature_shape(action_space) -> tuple:
    """Shape of one action as a model feature (one-hot for discrete actions, leaves
    concatenated)."""
    return (sum(_leaf_feature_size(leaf) for _, leaf in spaces.action_leaves(action_space)),)


def _leaf_feature_size(space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return int(np.prod(space.shape))


def action_features(action_space, actions):
    """Actions as float features: one-hot for (Multi)Discrete, flattened for Box;
    the leaves of a nested space concatenated in dm-tree order."""
    leaves = spaces.action_leaves(action_space)
    values = spaces.action_leaf_values(action_space, actions, "prev_actions")
    parts = [_leaf_features(space, value) for (_, space), value in zip(leaves, values)]
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)


def _leaf_features(action_space, actions):
    if isinstance(action_space, gym.spaces.Discrete):
        return tf.one_hot(tf.cast(actions, tf.int32) - int(action_space.start), int(action_space.n))
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        actions = tf.cast(actions, tf.int32)
        return tf.concat(
            [tf.one_hot(actions[:, i], int(n)) for i, n in enumerate(action_space.nvec.ravel())],
            axis=-1,
        )
    return tf.reshape(tf.cast(actions, tf.float32), [-1, int(np.prod(action_space.shape))])
