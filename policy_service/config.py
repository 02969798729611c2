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
from typing import Any, ClassVar

from policy_service.config_rules import (
    Rule,
    integer,
    is_int,
    is_number,
    machine_memory_bytes,
)
from policy_service.errors import UserError

# the observation filters (data/observation_filters.py builds them by these names)
OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")

Check = Callable[[Any], str | None]
"""A value's rule: None when the value passes, else what it must be ("an integer >= 1").
Runs only on a value of the field's type, never on None."""

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


# Keras's activations most configs name, known without importing Keras (and TensorFlow):
# a Tune driver checks a trial's config without loading them (algorithms/tune.py). Any
# other name is asked to Keras; tests/test_tune_imports.py checks Keras takes these.
KERAS_BUILT_IN_ACTIVATIONS = frozenset(
    {"elu", "gelu", "leaky_relu", "linear", "relu", "relu6", "selu", "sigmoid", "silu"}
    | {"softmax", "softplus", "swish", "tanh"}
)


def _is_keras_activation(name: str) -> bool:
    if name in KERAS_BUILT_IN_ACTIVATIONS:
        return True
    import keras  # only when a config is checked: every user of one builds a Keras model

    try:
        keras.activations.get(name)
    except ValueError:
        return False
    return True


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
