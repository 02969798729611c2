"""Dict and Tuple observations: each component its own encoder, as RLlib's
ComplexInputNetwork does.

The model still receives the flattened observation <float32>[rows, n] (spaces.py
concatenates the leaves in dm-tree order); this encoder cuts each component back out
and encodes it by kind:

    image  [H, W, C] -> conv stack (`conv_filters`, or the default for its size), flattened
    one-hot / vector -> the dense stack (`fcnet_hiddens`, `fcnet_activation`)

then concatenates the component features and runs the post-fcnet stack
(`post_fcnet_hiddens`, `post_fcnet_activation`) on them. Flattening an 84x84x3
image beside a vector into one MLP input instead would cost a 21,168-wide first
layer and ignore the image's structure.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf

from policy_service.data.spaces import IMAGE, ObservationComponent
from policy_service.policy.encoders import conv_stack, dense_stack, run_stack, scales_pixels
from policy_service.policy.policy_config import ModelConfig


def component_name(component: ObservationComponent) -> str:
    """A layer-name part for a component: its path's keys and indices joined by "_"."""
    return re.sub(r"\W", "_", "_".join(map(str, component.path))) or "obs"


class ComplexInputEncoder(keras.layers.Layer):
    """Flattened Dict/Tuple observation <float32>[rows, n] -> features: per component
    "{prefix}_{component}_conv_{i}" or "{prefix}_{component}_dense_{i}" layers, then
    "{prefix}_post_dense_{i}" on their concatenation."""

    def __init__(
        self,
        components: list[ObservationComponent],
        config: ModelConfig,
        prefix: str,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(name=prefix, **kwargs)
        self.components = components
        self.branches = []
        for component in components:
            name = f"{prefix}_{component_name(component)}"
            if component.kind == IMAGE:
                branch = conv_stack(
                    component.shape, config, name, scales_pixels(component.space, config)
                )
            else:
                branch = dense_stack(
                    config.fcnet_hiddens,
                    config.fcnet_activation,
                    config.use_batch_norm,
                    name,
                    kernel_initializer,
                )
            self.branches.append(branch)
        self.post = dense_stack(
            config.post_fcnet_hiddens,
            config.post_fcnet_activation,
            config.use_batch_norm,
            f"{prefix}_post",
            kernel_initializer,
        )

    def call(self, obs, training=False, row_mask=None):
        features = []
        for component, branch in zip(self.components, self.branches):
            part = obs[:, component.start : component.start + component.size]
            part = tf.reshape(part, [-1, *component.shape])
            features.append(run_stack(branch, part, training, row_mask))
        joined = features[0] if len(features) == 1 else tf.concat(features, axis=-1)
        return run_stack(self.post, joined, training, row_mask)
