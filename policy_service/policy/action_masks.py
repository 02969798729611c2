"""Action masks: an observation space that is a Dict with an "action_mask" entry (one 0/1
per action of a Discrete action space, as PettingZoo's classic games give) makes the
policy's model mask its action distribution inputs. An illegal action's input becomes
MASKED (tf.float32.min, what distributions.Categorical takes for a masked action), so
sampling, the greedy action, log-likelihoods and DQN's Q-targets never take it, and
EpsilonGreedy draws its random actions among the legal ones (`legal_actions`).

The model itself sees the mask too, as part of its flattened observation; the mask is
applied after it, on every call (acting, losses, target networks, exports). Observation
filters take no Dict observations, so none shifts the mask.
"""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from policy_service.data.sample_batch import SampleBatch
from policy_service.errors import UserError

ACTION_MASK = "action_mask"
MASKED = float(np.finfo(np.float32).min)


class ActionMaskError(UserError, ValueError):
    """An "action_mask" entry a policy cannot apply."""


def mask_slice(policy) -> slice | None:
    """Where the policy's observations carry the action mask once flattened; None
    when its observation space has no "action_mask" entry. A mask the policy cannot
    apply is a one-line ActionMaskError naming what is wrong."""
    observation_space, action_space = policy.observation_space, policy.action_space
    if not (
        isinstance(observation_space, gym.spaces.Dict) and ACTION_MASK in observation_space.spaces
    ):
        return None
    name = type(policy).__name__
    if not policy.takes_action_masks:
        raise ActionMaskError(
            f"{name} does not take action masks, but its observation space has an "
            f"{ACTION_MASK!r} entry"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ActionMaskError(
            f"observation entry {ACTION_MASK!r} masks the actions of a Discrete action "
            f"space, got action space {action_space}"
        )
    mask_space, n = observation_space[ACTION_MASK], int(action_space.n)
    if not isinstance(mask_space, (gym.spaces.Box, gym.spaces.MultiBinary)) or (
        mask_space.shape != (n,)
    ):
        raise ActionMaskError(
            f"observation entry {ACTION_MASK!r} must be a Box or MultiBinary of shape ({n},), "
            f"one 0/1 per action of {action_space}, got {mask_space}"
        )
    return policy.preprocessor.entry_slice(ACTION_MASK)


class ActionMaskedModel(keras.Model):
    """`inner`'s outputs with the action distribution inputs of illegal actions MASKED."""

    def __init__(self, inner: keras.Model, mask: slice, **kwargs):
        super().__init__(name=f"{inner.name}_masked", **kwargs)
        self.inner = inner
        self.mask_start, self.mask_stop = int(mask.start), int(mask.stop)

    def call(self, input_dict, training=False):
        out = dict(self.inner(input_dict, training=training))
        legal = input_dict[SampleBatch.OBS][..., self.mask_start : self.mask_stop] > 0.5
        inputs = out[SampleBatch.ACTION_DIST_INPUTS]
        out[SampleBatch.ACTION_DIST_INPUTS] = tf.where(
            legal, inputs, tf.constant(MASKED, inputs.dtype)
        )
        return out

    def get_initial_state(self) -> list:
        getter = getattr(self.inner, "get_initial_state", None)
        return getter() if getter else []


def masked_model(model: keras.Model, policy) -> keras.Model:
    """`model` masked when the policy's observations carry an action mask, else itself."""
    mask = mask_slice(policy)
    return model if mask is None else ActionMaskedModel(model, mask)


def legal_actions(dist_inputs: tf.Tensor) -> tf.Tensor:
    """<bool>[B, n] the actions whose distribution inputs are not MASKED."""
    return tf.not_equal(dist_inputs, tf.constant(MASKED, dist_inputs.dtype))
