"""Typed configuration: a plain dict with RLlib's key names, validated into dataclasses.

An unknown or mistyped key is an error that names it, so a typo never silently
falls back to a default.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ModelConfig:
    """How the built-in models are shaped (RLlib's `model` sub-dict)."""

    fcnet_hiddens: list = field(default_factory=lambda: [256, 256])  # hidden layer sizes
    fcnet_activation: str = "tanh"  # activation of the hidden layers
    vf_share_layers: bool = False  # value head on the policy trunk instead of its own branch
    conv_filters: Optional[list] = None  # [[out_channels, [kh, kw], stride], ...] for images
    conv_activation: str = "relu"  # activation of the conv layers
    use_lstm: bool = False  # wrap the trunk in an LSTM
    lstm_cell_size: int = 256  # LSTM units
    max_seq_len: int = 20  # longest training sequence for recurrent models
    lstm_use_prev_action: bool = False  # feed the previous action to the LSTM
    lstm_use_prev_reward: bool = False  # feed the previous reward to the LSTM
    use_batch_norm: bool = False  # batch normalization after each hidden dense layer
    custom_model: Optional[str] = None  # name given to register_custom_model
    custom_model_config: dict = field(default_factory=dict)  # passed to the custom model


@dataclass
class PolicyConfig:
    """What every TFPolicy needs; algorithms subclass it to add their own keys."""

    num_gpus: float = 0  # towers: 0 -> one CPU tower, fraction -> one shared GPU, N -> N
    _fake_gpus: bool = False  # with no GPU, N towers on N logical CPU devices
    lr: float = 1e-3  # learning rate
    optimizer: str = "adam"  # "adam", "sgd" or "rmsprop"
    adam_epsilon: float = 1e-7  # Adam's epsilon
    grad_clip: Optional[float] = None  # clip threshold; None turns clipping off
    grad_clip_method: str = "global_norm"  # "global_norm", "value" or "norm" (per tensor)
    l2_coeff: float = 0.0  # L2 regularization on trainable weights
    gamma: float = 0.99  # discount factor
    seed: Optional[int] = None  # seed for weights and action sampling
    explore: bool = True  # sample (True) or act deterministically (False) by default
    exploration_config: dict = field(
        default_factory=lambda: {"type": "StochasticSampling"})  # see exploration.py
    minibatch_size: int = 128  # rows per SGD step on a loaded buffer
    num_epochs: int = 1  # passes over a loaded buffer per training step
    model: ModelConfig = field(default_factory=ModelConfig)  # model shape

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


T = typing.TypeVar("T")


def _type_matches(value: Any, annotation: Any) -> bool:
    """Whether `value` fits a (simple) annotation; ints are accepted for floats."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_matches(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        annotation = origin
    return isinstance(value, annotation)


def from_dict(cls: type[T], values: dict | T | None, where: str = "config") -> T:
    """Build dataclass `cls` from a dict, naming any unknown or mistyped key."""
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values):
        values = dataclasses.asdict(values)
    if not isinstance(values, dict):
        raise TypeError(f"{where} must be a dict, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {where} key(s) {unknown}; known keys: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = from_dict(annotation, value, where=f"{where}.{name}")
            continue
        if not _type_matches(value, annotation):
            raise TypeError(f"{where}.{name} must be {_describe(annotation)}, "
                            f"got {value!r} ({type(value).__name__})")
        kwargs[name] = float(value) if annotation is float else value
    return cls(**kwargs)


def _describe(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def check_choice(value: str, choices: tuple, name: str) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


# The device keys of a policy config, and their values for acting on one CPU device.
CPU_ONLY = {"num_gpus": 0, "_fake_gpus": False}


def config_for(policy_cls: type, config: Any):
    """`config` (a dict or a dataclass) as `policy_cls.config_class`; as given
    when the class declares no config class."""
    config_class = getattr(policy_cls, "config_class", None)
    return from_dict(config_class, config) if config_class is not None else config


def on_cpu(config: Any, **changes):
    """A copy of a policy config (dataclass or dict) that acts on one CPU device:
    rollout workers, evaluation and hosts without GPUs."""
    if isinstance(config, dict):
        return {**config, **CPU_ONLY, **changes}
    return dataclasses.replace(config, **CPU_ONLY, **changes)
