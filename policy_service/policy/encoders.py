"""Observation encoders: one observation array -> features <float32>[rows, n].

An `Encoder` takes a vector or an image: the conv stack for an image ([H, W, C]),
then the dense stack (`fcnet_hiddens`), then the post-fcnet stack
(`post_fcnet_hiddens`), as RLlib's catalog models do. Dense layers may carry batch
norm, which sees only valid rows (`row_mask`).
"""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np

from policy_service.policy.policy_config import ModelConfig

PIXEL_SCALE = 1.0 / 255.0


class NormcInitializer(keras.initializers.RandomNormal):
    """Gaussian weights with each output unit's column rescaled to norm `std`, as
    RLlib's `normc_initializer`: RLlib's fully connected model uses it (1.0 for hidden
    layers, 0.01 for the logits and value outputs), and PPO at RLlib's defaults learns
    CartPole faster with it than with Keras' glorot-uniform (benchmarks/ppo_parity.py)."""

    def __init__(self, std: float = 1.0, seed=None):
        super().__init__(mean=0.0, stddev=1.0, seed=seed)
        self.std = float(std)

    def __call__(self, shape, dtype=None):
        x = super().__call__(shape, dtype=dtype)
        norms = keras.ops.sqrt(keras.ops.sum(keras.ops.square(x), axis=0, keepdims=True))
        return x * (self.std / norms)

    def get_config(self) -> dict:
        return {"std": self.std, "seed": self.seed}


def dense_stack(
    hiddens, activation: str, use_batch_norm: bool, prefix: str, kernel_initializer=None
) -> list:
    """Dense layers named "{prefix}_dense_{i}", each optionally followed by batch norm
    before its activation."""
    layers = []
    for i, size in enumerate(hiddens):
        layers.append(
            keras.layers.Dense(
                size,
                name=f"{prefix}_dense_{i}",
                kernel_initializer=kernel_initializer or "glorot_uniform",
            )
        )
        if use_batch_norm:
            layers.append(keras.layers.BatchNormalization(name=f"{prefix}_bn_{i}"))
        layers.append(keras.layers.Activation(activation, name=f"{prefix}_act_{i}"))
    return layers


def run_stack(layers: list, x, training: bool, row_mask):
    """`x` through `layers`; batch norm in training normalizes over the valid rows only."""
    for layer in layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            x = layer(x, training=training, mask=row_mask if training else None)
        else:
            x = layer(x)
    return x


def default_conv_filters(image_shape) -> list:
    """RLlib-like defaults sized to the image: strided convs down to a small map."""
    if image_shape[0] >= 64:
        return [[16, [8, 8], 4], [32, [4, 4], 2], [64, [3, 3], 1]]
    return [[16, [3, 3], 2], [32, [3, 3], 2]]


def scales_pixels(space: gym.Space | None, config: ModelConfig) -> bool:
    """Whether images of `space` enter the convolutions scaled to [0, 1]: uint8 pixels
    with `scale_images` on. Raw 0-255 values into a freshly initialized conv stack give
    activations in the hundreds; the first updates then switch most ReLUs off for good
    (APPO on Pong here: 245 of 256 dense units dead after 2.4M steps)."""
    return config.scale_images and getattr(space, "dtype", None) == np.uint8


def conv_stack(image_shape, config: ModelConfig, prefix: str, scale: bool = False) -> list:
    """Conv layers ("{prefix}_conv_{i}", `conv_filters` or the default for the image's
    size; the last one padded as `conv_last_padding` says) and a flatten; `scale`: the
    pixels first times 1/255 (a layer without weights: the weights' names stay)."""
    filters = config.conv_filters or default_conv_filters(image_shape)
    last = len(filters) - 1
    rescale = [keras.layers.Rescaling(PIXEL_SCALE, name=f"{prefix}_pixels")] if scale else []
    layers: list = [
        keras.layers.Conv2D(
            out,
            kernel,
            strides=stride,
            padding=config.conv_last_padding if i == last else "same",
            activation=config.conv_activation,
            name=f"{prefix}_conv_{i}",
        )
        for i, (out, kernel, stride) in enumerate(filters)
    ]
    return [*rescale, *layers, keras.layers.Flatten(name=f"{prefix}_flatten")]


def post_fcnet_activation(config: ModelConfig, is_image: bool) -> str:
    """The post-fcnet layers' activation. RLlib's fully connected model appends them
    to its hidden layers with `fcnet_activation` (`post_fcnet_activation` only when
    `fcnet_hiddens` is empty); its vision and complex-input models use
    `post_fcnet_activation`. Kept so, so that an RLlib model's weights mean the same."""
    if is_image or not config.fcnet_hiddens:
        return config.post_fcnet_activation
    return config.fcnet_activation


class Encoder(keras.layers.Layer):
    """Observation -> features: conv stack for images, then the dense stack, then the
    post-fcnet stack ("{prefix}_post_dense_{i}"). `space`: the observation space the
    model was built for (its `original_space`), which says whether pixels are scaled."""

    def __init__(
        self,
        obs_shape,
        config: ModelConfig,
        prefix: str,
        kernel_initializer=None,
        space: gym.Space | None = None,
        **kwargs,
    ):
        super().__init__(name=prefix, **kwargs)
        is_image = len(obs_shape) == 3
        self.convs = (
            conv_stack(obs_shape, config, prefix, scales_pixels(space, config)) if is_image else []
        )
        self.dense = dense_stack(
            config.fcnet_hiddens,
            config.fcnet_activation,
            config.use_batch_norm,
            prefix,
            kernel_initializer,
        ) + dense_stack(
            config.post_fcnet_hiddens,
            post_fcnet_activation(config, is_image),
            config.use_batch_norm,
            f"{prefix}_post",
            kernel_initializer,
        )

    def call(self, obs, training=False, row_mask=None):
        x = obs
        for conv in self.convs:
            x = conv(x)
        return run_stack(self.dense, x, training, row_mask)
