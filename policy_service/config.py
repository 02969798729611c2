"""Typed configuration: a plain dict with RLlib's key names, validated into dataclasses.

Every rule a config value must follow is written here or beside its field,
in the field's metadata, together with the field's doc:

    lr: float = setting(1e-3, doc="Learning rate.", check=finite(gt=0))

Tools read the docs and rules back with `field_docs(cls)`, `field_check(cls,
name)` and `field_allowed(cls, name)` (`policy-service config ALGO` lists them);
an algorithm's config subclass declares its own keys the same way (a field it
redeclares only to change the default keeps the parent's check). A
config is checked whenever one is built, from a dict (`from_dict`) or
directly: unknown keys, then each field's type, then its range. Every error
is one line naming the key, what it must be and what it was, e.g.
"config.lr must be a finite number > 0, got nan".
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from policy_service.config_rules import (
    Rule,
    finite,
    integer,
    is_int,
    is_number,
    machine_memory_bytes,
    one_of,
    schedule_error,
)
from policy_service.errors import UserError

# the observation filters (data/observation_filters.py builds them by these names)
OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")

Check = Callable[[Any], str | None]
"""A value's rule: None when the value passes, else what it must be ("an integer >= 1").
Runs only on a value of the field's type, never on None."""

OPTIMIZERS = ("adam", "sgd", "rmsprop")
GRAD_CLIP_METHODS = ("global_norm", "value", "norm")
# Ray's placement group strategies; STRICT_SPREAD: each learner on a node of its own
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# Ray's own resources, asked for by their own keys (num_cpus_..., num_gpus_...)
BUILT_IN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
_DOC, _CHECK = "doc", "check"


class ConfigError(UserError, ValueError):
    """An unknown config key, or a value out of its range: one line naming the key."""


class ConfigTypeError(ConfigError, TypeError):
    """A config value of the wrong type."""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    check: Check | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A config dataclass field with its doc and its rule in the field metadata.

    `factory` makes a fresh default per instance (for lists and dicts).
    """
    metadata = {_DOC: doc, _CHECK: check}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _is_custom_resources(value: Any) -> bool:
    """{name: amount}: names of custom node resources (e.g. `ray start --resources`),
    amounts finite and >= 0; Ray's own resources have keys of their own."""
    return isinstance(value, dict) and all(
        isinstance(name, str)
        and name
        and name not in BUILT_IN_RESOURCES
        and not name.startswith("node:")
        and is_number(amount)
        and math.isfinite(amount)
        and amount >= 0
        for name, amount in value.items()
    )


CUSTOM_RESOURCES = Rule(
    "a dict of custom resource name -> amount >= 0 (not CPU, GPU, memory, "
    "object_store_memory or node:...)",
    _is_custom_resources,
)


def _is_count(value: Any) -> bool:
    return is_int(value) and value >= 1


def _is_conv_filter(entry: Any) -> bool:
    """[out_channels, kernel, stride]; kernel and stride an int or [h, w]."""

    def size(x):
        return _is_count(x) or (isinstance(x, list) and len(x) == 2 and all(map(_is_count, x)))

    return (
        isinstance(entry, list)
        and len(entry) == 3
        and _is_count(entry[0])
        and size(entry[1])
        and size(entry[2])
    )


def _is_keras_activation(name: str) -> bool:
    import keras  # only when a config is checked: every user of one builds a Keras model

    try:
        keras.activations.get(name)
    except ValueError:
        return False
    return True


def _exploration_config_error(exploration_config: dict) -> str | None:
    """{'type': an exploration of exploration.py, and that type's options}."""
    from policy_service.policy.exploration import exploration_config_error

    return exploration_config_error(exploration_config)


GPU_COUNT = Rule(
    "a finite number >= 0, and a whole number when above 1",
    lambda v: math.isfinite(v) and v >= 0 and (v <= 1 or v == int(v)),
)


LAYER_SIZES = Rule("a list of integers >= 1", lambda v: all(map(_is_count, v)))
CONV_FILTERS = Rule(
    "a non-empty list of [out_channels, kernel, stride] of integers >= 1 "
    "(kernel and stride: an int or [h, w])",
    lambda v: len(v) > 0 and all(map(_is_conv_filter, v)),
)
KERAS_ACTIVATION = Rule(
    "the name of a Keras activation (e.g. 'tanh', 'relu', 'linear')", _is_keras_activation
)
SEED = integer(ge=0, le=2**32 - 1)  # numpy's seed range


# ----- the configs --------------------------------------------------------------------------


class Config:
    """Base of the config dataclasses: every field is checked when one is built.

    `key_prefix` is how errors name this config's keys ("config.model.max_seq_len").
    A subclass with a rule across fields checks it in `__post_init__` after super's.
    """

    key_prefix: ClassVar[str] = "config"
    # what @dataclass adds to each subclass; declared so the type checker takes a
    # Config for a dataclass (dataclasses.fields, asdict, replace)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict:
        """The config as a plain dict, each key as users write it (KEY_ALIASES)."""
        values = dataclasses.asdict(self)
        for alias, name in getattr(type(self), "KEY_ALIASES", {}).items():
            values[alias] = values.pop(name)
        return values

    def check_fits_in_memory(self, key: str, needed_bytes: int, what: str) -> None:
        """A rule across the machine: `key`'s value needs at least `needed_bytes`
        (`what`), which must fit in this machine's memory (checked when the config
        is read, not at the MemoryError)."""
        memory = machine_memory_bytes()
        if needed_bytes > memory:
            raise ConfigError(
                f"{self.key_prefix}.{key} needs {what}, {needed_bytes} bytes at least, "
                f"more than this machine's {memory / 2**30:.1f} GiB of memory; got "
                f"{getattr(self, key)!r}"
            )

    def check_at_most(self, key: str, limit_key: str, why: str = "") -> None:
        """A rule across fields: `key`'s value must not exceed `limit_key`'s."""
        value, limit = getattr(self, key), getattr(self, limit_key)
        if value > limit:
            raise ConfigError(
                f"{self.key_prefix}.{key} must be <= {limit_key} ({limit}){why}, got {value}"
            )


@dataclass
class ModelConfig(Config):
    """How the built-in models are shaped (RLlib's `model` sub-dict)."""

    key_prefix: ClassVar[str] = "config.model"

    fcnet_hiddens: list = setting(
        doc="Hidden layer sizes of the dense stack.", check=LAYER_SIZES, factory=lambda: [256, 256]
    )
    fcnet_activation: str = setting(
        "tanh", doc="Activation of the hidden dense layers.", check=KERAS_ACTIVATION
    )
    vf_share_layers: bool = setting(
        False, doc="Value head on the policy trunk instead of its own branch."
    )
    conv_filters: list | None = setting(
        None,
        doc="[[out_channels, [kh, kw], stride], ...] for image observations; "
        "None: sized to the image.",
        check=CONV_FILTERS,
    )
    conv_activation: str = setting(
        "relu", doc="Activation of the conv layers.", check=KERAS_ACTIVATION
    )
    conv_last_padding: str = setting(
        "same",
        doc='Padding of the last conv layer: "same", or "valid" as in RLlib\'s vision network '
        "(whose default last filter covers the whole map: 11x11 on 84x84 images).",
        check=one_of("same", "valid"),
    )
    post_fcnet_hiddens: list = setting(
        doc="Dense layers after the encoder (RLlib's): after fcnet_hiddens for vectors, "
        "after the conv stack and fcnet_hiddens for images, after the concatenated "
        "components of Dict and Tuple observations.",
        check=LAYER_SIZES,
        factory=list,
    )
    post_fcnet_activation: str = setting(
        "relu",
        doc="Activation of the post_fcnet_hiddens layers; for vectors with fcnet_hiddens "
        "they take fcnet_activation, as in RLlib's fully connected model.",
        check=KERAS_ACTIVATION,
    )
    free_log_std: bool = setting(
        False,
        doc="A Box action's log std is a trainable variable, the same for every "
        "observation, instead of half of the model's outputs (RLlib's).",
    )
    use_lstm: bool = setting(False, doc="Wrap the trunk in an LSTM.")
    lstm_cell_size: int = setting(256, doc="LSTM units.", check=integer(ge=1))
    max_seq_len: int = setting(
        20, doc="Longest training sequence for recurrent models.", check=integer(ge=1)
    )
    lstm_use_prev_action: bool = setting(False, doc="Feed the previous action to the LSTM.")
    lstm_use_prev_reward: bool = setting(False, doc="Feed the previous reward to the LSTM.")
    use_attention: bool = setting(
        False,
        doc="A GTrXL (gated transformer) over the encoder, its memory the recurrent state "
        "(RLlib's; attention.py).",
    )
    attention_num_transformer_units: int = setting(
        1, doc="Transformer units of the GTrXL.", check=integer(ge=1)
    )
    attention_dim: int = setting(
        64, doc="Width of the units' inputs and outputs.", check=integer(ge=1)
    )
    attention_num_heads: int = setting(1, doc="Attention heads per unit.", check=integer(ge=1))
    attention_head_dim: int = setting(32, doc="Width of each attention head.", check=integer(ge=1))
    attention_memory_inference: int = setting(
        50,
        doc="Past inputs per unit held in the state and attended to while acting.",
        check=integer(ge=1),
    )
    attention_memory_training: int = setting(
        50,
        doc="Past inputs per unit attended to in training (at most attention_memory_inference).",
        check=integer(ge=1),
    )
    attention_position_wise_mlp_dim: int = setting(
        32, doc="Hidden width of each unit's position-wise MLP.", check=integer(ge=1)
    )
    attention_init_gru_gate_bias: float = setting(
        2.0,
        doc="Initial bias of the GRU gates (> 0: each unit starts near the identity).",
        check=finite(),
    )
    attention_use_n_prev_actions: int = setting(
        0, doc="Feed the previous action to the GTrXL (0 or 1 here).", check=integer(ge=0)
    )
    attention_use_n_prev_rewards: int = setting(
        0, doc="Feed the previous reward to the GTrXL (0 or 1 here).", check=integer(ge=0)
    )
    use_batch_norm: bool = setting(False, doc="Batch normalization after each hidden dense layer.")
    custom_model: str | None = setting(None, doc="Name given to register_custom_model.")
    custom_model_config: dict = setting(doc="Passed to the custom model.", factory=dict)
    custom_action_dist: str | None = setting(
        None, doc="Name given to register_custom_action_dist (RLlib's key)."
    )

    def __post_init__(self):
        super().__post_init__()
        if self.use_lstm and self.use_attention:
            raise ConfigError(
                "config.model.use_attention and use_lstm are two memories: set one, got both True"
            )
        sizes = self.fcnet_hiddens
        weights = sum(a * b for a, b in zip(sizes, sizes[1:]))
        self.check_fits_in_memory("fcnet_hiddens", 4 * weights, "4 bytes a weight, layer to layer")


@dataclass
class PolicyConfig(Config):
    """What every TFPolicy needs; algorithms subclass it to add their own keys."""

    num_gpus: float = setting(
        0,
        doc="Towers: 0 -> one CPU tower, a fraction -> one tower sharing a GPU, N -> N.",
        check=GPU_COUNT,
    )
    _fake_gpus: bool = setting(False, doc="With no GPU, N towers on N logical CPU devices.")
    lr: float = setting(1e-3, doc="Learning rate.", check=finite(gt=0))
    lr_schedule: list | None = setting(
        None,
        doc="[[timestep, lr], ...]: lr piecewise linear on the global timestep, the last "
        "value before the first point and after the last (RLlib's); replaces lr.",
        check=schedule_error,
    )
    optimizer: str = setting("adam", doc="The optimizer.", check=one_of(*OPTIMIZERS))
    adam_epsilon: float = setting(1e-7, doc="Adam's epsilon.", check=finite(gt=0))
    grad_clip: float | None = setting(
        None, doc="Gradient clip threshold; None turns clipping off.", check=finite(gt=0)
    )
    grad_clip_method: str = setting(
        "global_norm",
        doc="Clip by global norm, by value, or by each tensor's norm.",
        check=one_of(*GRAD_CLIP_METHODS),
    )
    l2_coeff: float = setting(
        0.0, doc="L2 regularization on the trainable weights.", check=finite(ge=0)
    )
    gamma: float = setting(0.99, doc="Discount factor.", check=finite(ge=0, le=1))
    seed: int | None = setting(None, doc="Seed for weights and action sampling.", check=SEED)
    explore: bool = setting(True, doc="Sample (True) or act deterministically (False) by default.")
    normalize_actions: bool = setting(
        False,
        doc="Box actions: the policy acts in [-1, 1] and the env gets low + (a + 1) * "
        "(high - low) / 2, clipped to the bounds (RLlib's; RLlib's default is True).",
    )
    clip_actions: bool = setting(
        True,
        doc="Box actions the env gets are clipped to the space's bounds (without "
        "normalize_actions; RLlib's default is False: raw actions).",
    )
    acting_xla: bool = setting(
        True,
        doc="Env runners act through an XLA-compiled acting function made for their "
        "vector's size (~0.6x the CPU per step for small models), and policy servers "
        "(PolicyActor, Serve replicas) through one per batch size of a ladder, each "
        "compiled when first used. Models with "
        "convolutions, which XLA runs slower on CPUs, and models XLA cannot compile (one "
        "warning) keep TensorFlow's executor.",
    )
    exploration_config: dict = setting(
        doc="How actions are chosen: {'type': ..., options}; see exploration.py.",
        check=_exploration_config_error,
        factory=lambda: {"type": "StochasticSampling"},
    )
    minibatch_size: int = setting(
        128, doc="Rows per SGD step on a loaded buffer.", check=integer(ge=1)
    )
    num_epochs: int = setting(
        1, doc="Passes over a loaded buffer per training step.", check=integer(ge=1)
    )
    model: ModelConfig = setting(doc="The model's shape.", factory=ModelConfig)
    observation_filter: str = setting(
        "NoFilter",
        doc="MeanStdFilter: observations normalized by the running mean and std of all "
        "env runners' observations (RLlib's), saved with the policy and part of exports.",
        check=one_of(*OBSERVATION_FILTERS),
    )
    batch_norm_sync: bool = setting(
        True,
        doc="Batch norm in training normalizes every tower's rows with the moments "
        "of the whole batch (all towers' and learners' valid rows: one device's step); "
        "False: each tower with its own shard's (RLlib's and DDP's), an approximation. "
        "Moving statistics are combined over the whole batch either way.",
    )
    num_grad_accumulation_steps: int = setting(
        1,
        doc="Minibatches of a loaded buffer whose gradients are summed before one "
        "all-reduce and one optimizer step (= one step on them concatenated).",
        check=integer(ge=1),
    )
    # The learner group's keys live here, not in the algorithm's config: a
    # policy_service.LearnerGroup reads them from the config of the policy it hosts.
    num_learners: int = setting(
        0,
        doc="Learner actors training data-parallel; 0: the learner lives in the driver.",
        check=integer(ge=0),
    )
    num_gpus_per_learner: float = setting(
        0,
        doc="Towers per learner actor, as num_gpus (with _fake_gpus: N logical CPU "
        "devices in the actor, and no GPU asked of Ray).",
        check=GPU_COUNT,
    )
    num_cpus_per_learner: float = setting(
        1, doc="Ray CPUs reserved per learner actor.", check=finite(ge=0)
    )
    custom_resources_per_learner: dict = setting(
        doc="Custom Ray resources reserved per learner actor (e.g. {'node_1': 0.01} to "
        "put learners on the nodes that declare it); RLlib's key.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )
    learner_placement_strategy: str = setting(
        "PACK",
        doc="How the learners' placement group spreads over nodes (Ray's strategies): "
        "PACK, SPREAD (best effort), STRICT_PACK (all on one node), STRICT_SPREAD "
        "(each on a node of its own: num_learners <= alive nodes).",
        check=one_of(*PLACEMENT_STRATEGIES),
    )
    learner_update_timeout_s: float = setting(
        1800.0,
        doc="Longest wait for one call to the learner actors (e.g. an update's "
        "epochs); past it the group counts as hung and is replaced like a dead learner.",
        check=finite(gt=0),
    )
    # Read by the EnvRunnerGroup, which starts the inference actor from this config.
    num_gpus_per_policy_actor: float = setting(
        0,
        doc="GPUs Ray reserves for the inference PolicyActor (remote_inference): 0, a "
        "fraction (it shares the GPU) or N; the actor acts on the GPUs Ray assigned it.",
        check=GPU_COUNT,
    )
    custom_resources_per_policy_actor: dict = setting(
        doc="Custom Ray resources reserved for the inference PolicyActor, e.g. "
        "{'node_2': 0.01} to start it on the node that declares node_2.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )
    # Read by the EnvRunnerGroup too (beside num_gpus_per_policy_actor): it starts them.
    custom_resources_per_env_runner: dict = setting(
        doc="Custom Ray resources reserved per env runner actor (RLlib's key), e.g. "
        "{'node_1': 0.01} to start the runners on the node that declares node_1.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )


def entropy_coeff_setting(default: float) -> Any:
    """The `entropy_coeff` key of an algorithm whose loss has an entropy bonus (PPO,
    IMPALA), with that algorithm's default; `entropy_coeff_schedule_setting` beside it."""
    return setting(default, doc="Weight of the entropy bonus.", check=finite(ge=0))


def entropy_coeff_schedule_setting() -> Any:
    """The `entropy_coeff_schedule` key beside `entropy_coeff_setting` (schedules.py)."""
    return setting(
        None,
        doc="[[timestep, coeff], ...]: entropy_coeff piecewise linear on the global "
        "timestep (RLlib's semantics, lr_schedule's); replaces entropy_coeff.",
        check=schedule_error,
    )


# ----- building and checking ----------------------------------------------------------------


T = typing.TypeVar("T", bound="Config")


def from_dict(cls: type[T], values: dict | T | None, where: str | None = None) -> T:
    """Build config dataclass `cls` from a dict, naming any unknown or bad key."""
    where = where or str(getattr(cls, "key_prefix", "config"))
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        values = dataclasses.asdict(values)
    if not isinstance(values, dict):
        raise ConfigTypeError(f"{where} must be a dict, got {type(values).__name__}")
    values = with_field_names(cls, values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(values) - known))
    if unknown:
        raise ConfigError(unknown_keys_message(where, unknown, known))
    return cls(**values)


def user_key(cls: type, name: str) -> str:
    """How users write field `name` of config class `cls` (its alias, if it has one)."""
    aliases = getattr(cls, "KEY_ALIASES", {})
    return next((alias for alias, field in aliases.items() if field == name), name)


def with_field_names(cls: type, values: dict) -> dict:
    """`values` with each key a config class spells otherwise (its KEY_ALIASES, e.g. RLlib's
    flat "callbacks" for the field callbacks_class) as its field's name; both at once is
    an error naming them."""
    aliases = getattr(cls, "KEY_ALIASES", {})
    if not any(alias in values for alias in aliases):
        return values
    renamed = dict(values)
    for alias, name in aliases.items():
        if alias in renamed:
            if name in renamed:
                raise ConfigError(f"config keys {alias!r} and {name!r} are one setting: give one")
            renamed[name] = renamed.pop(alias)
    return renamed


def unknown_keys_message(where: str, unknown: list[str], known: set[str]) -> str:
    """One line naming each unknown key with the known keys closest to it (difflib), and
    the command that lists them all (a list of every key made this line ~1,200 wide)."""
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        guess = (
            f"did you mean {' or '.join(map(repr, close))}?" if close else "no known key is close"
        )
        named.append(f"{key!r} ({guess})")
    keys = "key" if len(unknown) == 1 else "keys"
    return (
        f"unknown {where} {keys} {', '.join(named)}; "
        "`policy-service config ALGO` lists every key of an algorithm"
    )


def check_fields(config: Config) -> None:
    """Check every field's type, then its rule; ints given for floats become floats;
    a dict given for a nested config is built into one."""
    cls = type(config)
    hints = _type_hints(typing.cast(type, cls))  # mypy takes a class for unhashable
    for f in dataclasses.fields(cls):
        name, annotation = f.name, hints[f.name]
        value = getattr(config, name)
        key = f"{cls.key_prefix}.{user_key(cls, name)}"
        if isinstance(annotation, type) and issubclass(annotation, Config):
            if not isinstance(value, annotation):
                setattr(config, name, from_dict(annotation, value, where=key))
            continue
        if not _type_matches(value, annotation):
            raise ConfigTypeError(
                f"{key} must be {_describe(annotation)}, got {value!r} ({type(value).__name__})"
            )
        if value is None:
            continue
        check = field_check(cls, name)
        expected = check(value) if check is not None else None
        if expected is not None:
            if _type_matches(None, annotation):
                expected = f"None or {expected}"
            raise ConfigError(f"{key} must be {expected}, got {value!r}")
        if annotation is float:
            setattr(config, name, float(value))


def field_docs(cls: type) -> dict[str, str]:
    """Each field's doc (inherited when a subclass only changes the default)."""
    return {f.name: _inherited_metadata(cls, f.name, _DOC) or "" for f in dataclasses.fields(cls)}


def field_check(cls: type, name: str) -> Check | None:
    """The rule of field `name` (inherited when a subclass only changes the default)."""
    return _inherited_metadata(cls, name, _CHECK)


def field_allowed(cls: type, name: str) -> str:
    """What field `name` accepts, in words: its type, then its rule ("float: a finite
    number > 0"); a rule that is a function is told by its docstring's first line."""
    allowed = _describe(_type_hints(cls)[name])
    check = field_check(cls, name)
    if isinstance(check, Rule):
        return f"{allowed}: {check.expected}"
    if check is not None and check.__doc__:
        return f"{allowed}: {check.__doc__.strip().splitlines()[0]}"
    return allowed


def _inherited_metadata(cls: type, name: str, key: str) -> Any:
    for klass in cls.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and declared.metadata.get(key) is not None:
            return declared.metadata[key]
    return None


@functools.cache
def _type_hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


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
        return is_number(value)
    if annotation is int:
        return is_int(value)
    if origin is not None:
        annotation = origin
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


# The device keys of a policy config, and their values for acting on one CPU device.
CPU_ONLY = {"num_gpus": 0, "_fake_gpus": False}


def is_config(value: Any) -> bool:
    """Whether `value` is a config dataclass instance (not a dict, not a class)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def config_for(policy_cls: type, config: Any):
    """`config` (a dict or a dataclass) as `policy_cls.config_class`; as given
    when the class declares no config class."""
    config_class = getattr(policy_cls, "config_class", None)
    return from_dict(config_class, config) if config_class is not None else config


def config_value(config: Any, key: str, default: Any) -> Any:
    """`key` of a policy config (a dict, a dataclass, or None), else `default`."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def on_cpu(config: Any, **changes):
    """A copy of a policy config (dataclass or dict) that acts on one CPU device:
    rollout workers, evaluation and hosts without GPUs."""
    if isinstance(config, dict):
        return {**config, **CPU_ONLY, **changes}
    return dataclasses.replace(config, **CPU_ONLY, **changes)
