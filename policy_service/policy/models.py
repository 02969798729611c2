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

import dataclasses
import re
from collections.abc import Callable, Mapping

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from policy_service.config import ConfigError
from policy_service.data import spaces
from policy_service.policy.action_features import (
    action_feature_shape,
    action_features,
    action_tensor_specs,
)
from policy_service.policy.attention import GTrXLModel
from policy_service.policy.complex_inputs import ComplexInputEncoder
from policy_service.policy.encoders import Encoder, NormcInitializer
from policy_service.policy.policy_config import ModelConfig

# re-exported: they lived here
__all__ = [
    "Encoder",
    "NormcInitializer",
    "action_feature_shape",
    "action_features",
    "action_tensor_specs",
]

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


def unregister_custom_model(name: str) -> None:
    """Forget a registered custom model (unknown names are ignored)."""
    _CUSTOM_MODELS.pop(name, None)


def custom_model_registry() -> dict[str, Callable]:
    """A copy of the registered custom models. A Ray actor starts in a fresh
    process with an empty registry: actors take this copy and register it."""
    return dict(_CUSTOM_MODELS)


def check_custom_model(name: str) -> None:
    """`name` was given to register_custom_model (checked when a config is read, and
    again where a model is built: an actor takes the registry's copy)."""
    if name not in _CUSTOM_MODELS:
        raise ValueError(
            f"config.model.custom_model {name!r} is not a name given to "
            f"register_custom_model; registered: {sorted(_CUSTOM_MODELS)}"
        )


def register_custom_models(registry: Mapping[str, Callable] | None) -> None:
    """Register every entry of a `custom_model_registry()` copy (None: nothing)."""
    for name, model_cls in (registry or {}).items():
        register_custom_model(name, model_cls)


class FreeLogStd(keras.layers.Layer):
    """Appends a trainable log std, the same for every row, to a Box action's means:
    <float32>[B, d] -> [B, 2d] (RLlib's `free_log_std`; starts at 0, a std of 1)."""

    def __init__(self, size: int, **kwargs):
        super().__init__(**kwargs)
        self.log_std = self.add_weight(
            shape=(size,), initializer="zeros", trainable=True, name="log_std"
        )

    def call(self, means):
        rows = tf.shape(means)[0]
        return tf.concat([means, tf.tile(self.log_std[None, :], [rows, 1])], axis=-1)


def action_head(
    action_space, num_outputs: int, config: ModelConfig, kernel_initializer
) -> list[keras.layers.Layer]:
    """The layers from features to "action_dist_inputs": a Dense of num_outputs, or
    with free_log_std a Dense of the means and a FreeLogStd."""
    if not config.free_log_std:
        return [
            keras.layers.Dense(
                num_outputs, kernel_initializer=kernel_initializer, name="action_dist_inputs"
            )
        ]
    is_flat_box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not is_flat_box or num_outputs != 2 * action_space.shape[0]:
        raise ConfigError(
            "config.model.free_log_std needs a 1-D Box action space whose distribution "
            f"takes [means, log_stds] ({num_outputs} inputs here), got {action_space}"
        )
    means = num_outputs // 2
    return [
        keras.layers.Dense(means, kernel_initializer=kernel_initializer, name="action_dist_inputs"),
        FreeLogStd(means, name="log_std"),
    ]


def make_encoder(
    obs_space: gym.spaces.Box, config: ModelConfig, prefix: str, kernel_initializer=None
) -> keras.layers.Layer:
    """The encoder of a model input space: per component (ComplexInputEncoder) when its
    `original_space` (spaces.model_input_space) is a Dict or Tuple, else `Encoder`."""
    original = getattr(obs_space, "original_space", None)
    if isinstance(original, (gym.spaces.Dict, gym.spaces.Tuple)):
        components = spaces.observation_components(original)
        return ComplexInputEncoder(components, config, prefix, kernel_initializer)
    return Encoder(obs_space.shape, config, prefix, kernel_initializer, original or obs_space)


def _run_layers(layers: list, x):
    for layer in layers:
        x = layer(x)
    return x


class FeedForwardModel(keras.Model):
    """MLP (or CNN + MLP) policy with a value head, shared or on its own branch.

    Dense layers start as RLlib's fully connected model does (NormcInitializer)."""

    def __init__(
        self, obs_space: gym.spaces.Box, action_space, num_outputs: int, config: ModelConfig
    ):
        super().__init__(name="feed_forward_model")
        self.config = config
        self.policy_trunk = make_encoder(obs_space, config, "policy", NormcInitializer(1.0))
        self.value_trunk = (
            None
            if config.vf_share_layers
            else make_encoder(obs_space, config, "value", NormcInitializer(1.0))
        )
        self.logits = action_head(action_space, num_outputs, config, NormcInitializer(0.01))
        self.value = keras.layers.Dense(1, kernel_initializer=NormcInitializer(0.01), name="vf")
        self.build_for(obs_space.shape)

    def build_for(self, obs_shape):
        self({"obs": tf.zeros((1,) + tuple(obs_shape), tf.float32)})

    def call(self, input_dict, training=False):
        obs = input_dict["obs"]
        mask = input_dict.get("loss_mask")
        features = self.policy_trunk(obs, training=training, row_mask=mask)
        value_features = (
            features
            if self.value_trunk is None
            else self.value_trunk(obs, training=training, row_mask=mask)
        )
        return {
            "action_dist_inputs": _run_layers(self.logits, features),
            "vf_preds": tf.squeeze(self.value(value_features), -1),
            "state_out": [],
        }


class LSTMModel(keras.Model):
    """Encoder -> LSTM -> policy and value heads, over padded sequences.

    State: [h <float32>[num_seqs, cell], c <float32>[num_seqs, cell]].
    """

    def __init__(
        self, obs_space: gym.spaces.Box, action_space, num_outputs: int, config: ModelConfig
    ):
        super().__init__(name="lstm_model")
        self.config = config
        self.cell_size = config.lstm_cell_size
        self.action_space = action_space
        self.encoder = make_encoder(obs_space, config, "encoder")
        self.lstm = keras.layers.LSTM(
            self.cell_size, return_sequences=True, return_state=True, name="lstm"
        )
        self.logits = action_head(
            action_space, num_outputs, config, keras.initializers.Orthogonal(0.01)
        )
        self.value = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Orthogonal(1.0), name="vf"
        )
        zero_state = tf.zeros((1, self.cell_size))
        dummy = {
            "obs": tf.zeros((1,) + tuple(obs_space.shape)),
            "state_in_0": zero_state,
            "state_in_1": zero_state,
            "seq_lens": tf.ones((1,), tf.int32),
            "prev_actions": tf.nest.map_structure(
                lambda spec: tf.zeros((1, *spec.shape[1:]), spec.dtype),
                action_tensor_specs(action_space),
            ),
            "prev_rewards": tf.zeros((1,)),
        }
        self(dummy)

    def call(self, input_dict, training=False):
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        features = self.encoder(
            input_dict["obs"], training=training, row_mask=input_dict.get("loss_mask")
        )
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
            sequences,
            mask=mask,
            initial_state=[input_dict["state_in_0"], input_dict["state_in_1"]],
            training=training,
        )
        outputs = tf.reshape(outputs, [-1, self.cell_size])
        return {
            "action_dist_inputs": _run_layers(self.logits, outputs),
            "vf_preds": tf.squeeze(self.value(outputs), -1),
            "state_out": [h, c],
        }

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(self.cell_size, np.float32), np.zeros(self.cell_size, np.float32)]


def build_model(
    obs_space: gym.spaces.Box, action_space, num_outputs: int, config: ModelConfig
) -> keras.Model:
    """The model the config asks for: custom, LSTM, GTrXL (use_attention) or feed-forward."""
    if config.custom_model is not None:
        check_custom_model(config.custom_model)
        return _CUSTOM_MODELS[config.custom_model](
            obs_space, action_space, num_outputs, dataclasses.asdict(config)
        )
    if config.use_lstm:
        return LSTMModel(obs_space, action_space, num_outputs, config)
    if config.use_attention:
        return GTrXLModel(obs_space, action_space, num_outputs, config)
    return FeedForwardModel(obs_space, action_space, num_outputs, config)


def initial_state(model: keras.Model) -> list[np.ndarray]:
    """Unbatched initial recurrent state of any model (empty when not recurrent)."""
    getter = getattr(model, "get_initial_state", None)
    return [np.asarray(s, np.float32) for s in getter()] if getter else []


class GraphModelAdapter(keras.Model):
    """Gives a functional or Sequential model the policy call convention.

    Keras maps a dict onto a functional model's inputs by position when keys
    beyond its inputs are present (a train batch has many), so the adapter
    hands over exactly the entries its inputs are named after ("obs" alone for
    a single-input model); a tensor output becomes "action_dist_inputs", and a
    model without recurrent state gets "state_out": [].
    """

    def __init__(self, inner: keras.Model, **kwargs):
        super().__init__(name=f"{inner.name}_adapter", **kwargs)
        self.inner = inner

    def call(self, input_dict, training=False):
        names = _graph_input_names(self.inner)
        inputs = {n: input_dict[n] for n in names} if names else input_dict["obs"]
        out = self.inner(inputs, training=training)
        out = dict(out) if isinstance(out, Mapping) else {"action_dist_inputs": out}
        out.setdefault("state_out", [])
        return out

    def get_initial_state(self) -> list:
        getter = getattr(self.inner, "get_initial_state", None)
        return getter() if getter else []


def follow_call_convention(model) -> keras.Model:
    """A model as the policy calls it: subclassed models as they are,
    functional and Sequential ones through GraphModelAdapter."""
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"the policy's model must be a keras.Model, got {model!r} ({type(model).__name__})"
        )
    if isinstance(model, keras.Sequential) or _graph_input_names(model) is not None:
        return GraphModelAdapter(model)
    return model


def _graph_input_names(model) -> list[str] | None:
    """Input names of a functional model with named dict inputs; [] for one
    unnamed input or a Sequential; None for a subclassed model."""
    if isinstance(model, keras.Sequential):
        return []
    try:
        structure = model.input
    except (AttributeError, ValueError):
        return None  # a subclassed model: it has no graph of inputs
    return list(structure) if isinstance(structure, Mapping) else []


def check_model(model: keras.Model, example: dict, num_outputs: int, initial_state: list) -> None:
    """Run one forward pass on `example` (an acting input dict of a few rows),
    which builds a lazily built model, and check the call convention.

    Every error names the model and what is wrong, so a model that would
    silently never train (no variables) or act on wrong shapes is refused here.
    """
    what = f"model {model.name!r} ({type(model).__name__})"
    rows = int(example["obs"].shape[0])
    out = model(example, training=False)
    if not isinstance(out, Mapping):
        raise ValueError(
            f"{what} must return a dict with 'action_dist_inputs' "
            f"(and 'vf_preds', 'state_out'), got {type(out).__name__}"
        )
    if "action_dist_inputs" not in out:
        raise ValueError(f"{what} returned no 'action_dist_inputs'; keys: {sorted(out)}")
    _check_shape(
        what,
        "action_dist_inputs",
        out["action_dist_inputs"],
        (rows, num_outputs),
        "the action distribution needs num_outputs inputs per row",
    )
    if "vf_preds" in out:
        _check_shape(
            what, "vf_preds", out["vf_preds"], (rows,), "one value per row; squeeze the last axis"
        )
    state_out = list(out.get("state_out", []))
    if len(state_out) != len(initial_state):
        raise ValueError(
            f"{what} returns {len(state_out)} state_out tensor(s) but its "
            f"get_initial_state() gives {len(initial_state)} state_in"
        )
    for i, (state, init) in enumerate(zip(state_out, initial_state)):
        _check_shape(
            what,
            f"state_out[{i}]",
            state,
            (rows,) + tuple(init.shape),
            f"it must match state_in_{i}",
        )
    if not model.trainable_variables:
        raise ValueError(
            f"{what} has no trainable variables after a forward pass; "
            "create its layers in __init__ and call them in call()"
        )


def _check_shape(what: str, key: str, value, expected: tuple, why: str) -> None:
    actual = tuple(value.shape)
    if actual != expected:
        raise ValueError(
            f"{what} returns {key} of shape {actual}, expected {expected} "
            f"for {expected[0]} example rows ({why})"
        )


_NUMBERED = re.compile(r"(.*?)(?:_(\d+))?")


def _unnumbered(name: str) -> str:
    """`name` without Keras's "_<n>" suffix ("dense_7" -> "dense")."""
    match = _NUMBERED.fullmatch(name)
    assert match is not None  # the pattern matches any string
    return match.group(1)


def weight_names(model: keras.Model, variables: list) -> list[str]:
    """Names of `variables` that are the same in every process.

    Keras numbers unnamed layers and variables with a process-global counter
    ("dense_7"), so the same model built in a Ray actor or a later process has
    other paths. Here names Keras made up are renumbered by order of appearance
    under their parent, as a fresh process would number them ("dense",
    "dense_1", ...); names the user gave stay, and the model's own name is dropped.
    """
    auto = {
        layer.name
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if _unnumbered(layer.name) == _snake_case(type(layer).__name__)
    }
    ranks: dict[tuple, dict] = {}
    names = []
    for variable in variables:
        segments = variable.path.split("/")
        if len(segments) > 1 and segments[0] == model.name:
            segments = segments[1:]
        canonical: list[str] = []
        for position, segment in enumerate(segments):
            base = _unnumbered(segment)
            is_variable = position == len(segments) - 1
            if segment in auto or (is_variable and base == "variable"):
                seen = ranks.setdefault((tuple(canonical), base), {})
                rank = seen.setdefault(segment, len(seen))
                segment = base if rank == 0 else f"{base}_{rank}"
            canonical.append(segment)
        names.append("/".join(canonical))
    return names


def _snake_case(class_name: str) -> str:
    """How Keras turns a class name into a default layer name ("LSTMCell" -> "lstm_cell")."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()
