"""A run's config: file < --set key=value < flags, validated by the algorithm's
config class, the environment and the devices before anything starts."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import yaml

from algorithms import environments
from policy_service.cli.run_options import RunOptions, TrainingSetupError
from policy_service.errors import one_line
from policy_service.io import checkpoints
from policy_service.runs.run_directory import json_safe

if TYPE_CHECKING:  # imported where used: the registry loads the algorithms
    from algorithms.algorithm import Algorithm

_EXPONENT_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KB; more is a mistake or an attack
MAX_CONFIG_DEPTH = 32  # nesting of lists and mappings (model configs nest 2-3 levels)


def load_config_file(path: str) -> dict:
    """A mapping of config keys from a YAML or JSON file: UTF-8, at most
    MAX_CONFIG_BYTES, nested at most MAX_CONFIG_DEPTH levels, no YAML aliases."""
    where = f"config file {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise TrainingSetupError(f"cannot read config file {path}: {err.strerror or err}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise TrainingSetupError(
            f"{where}: larger than {MAX_CONFIG_BYTES} bytes, the most a config file may hold"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TrainingSetupError(
            f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None
    if path.endswith(".json"):
        try:
            values = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise TrainingSetupError(f"{where} is not valid JSON: {one_line(err)}") from None
        _check_depth(values, where)
    else:
        values = parse_yaml(text, where)
    if values is None:
        return {}
    values = exponent_floats(values)
    if not isinstance(values, dict):
        raise TrainingSetupError(
            f"config file {path} must hold a mapping of config keys, got {type(values).__name__}"
        )
    return values


def parse_yaml(text: str, where: str) -> Any:
    """yaml.safe_load(text), refusing aliases (an alias bomb expands a few hundred
    bytes to millions of values) and nesting past MAX_CONFIG_DEPTH before anything
    is built; errors name `where`."""
    depth = 0
    try:  # the event parser is iterative: a 20,000-deep text neither recurses nor builds
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise TrainingSetupError(
                    f"{where}: YAML aliases are not allowed, found *{event.anchor} on line {line}"
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    raise TrainingSetupError(
                        f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as err:
        raise TrainingSetupError(f"{where} is not valid YAML: {one_line(err)}") from None


def _check_depth(values: Any, where: str) -> None:
    depth = checkpoints.nesting_depth(values)
    if depth > MAX_CONFIG_DEPTH:
        raise TrainingSetupError(
            f"{where}: nested {depth} levels deep, expected at most {MAX_CONFIG_DEPTH}"
        )


def apply_override(config: dict, assignment: str) -> None:
    """Set one "key=value" (value parsed as YAML; "a.b=1" sets config["a"]["b"])."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise TrainingSetupError(f"--set expects key=value, got {assignment!r}")
    value = exponent_floats(parse_yaml(text, f"--set {key} value {text!r}"))
    *parents, leaf = key.split(".")
    target = config
    for depth, part in enumerate(parents):
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrainingSetupError(
                f"--set {key}: {'.'.join(parents[: depth + 1])} is {child!r}, not a mapping"
            )
        target = child
    target[leaf] = value


def build_config(options: RunOptions, base: dict | None = None) -> dict:
    """`base` (a saved run's config, or nothing) updated by --config, each --set, the flags."""
    config = json.loads(json.dumps(base or {}))  # a deep copy
    if options.config_file:
        _merge(config, load_config_file(options.config_file))
    for assignment in options.overrides:
        apply_override(config, assignment)
    config.update(options.config_flags())
    return config


def _merge(target: dict, updates: dict) -> None:
    """Nested dicts are merged key by key; any other value replaces."""
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def algorithm_name(name: str | None) -> str:
    """The algorithm named on the command line, or the error that none was."""
    if not name:
        raise TrainingSetupError(
            "no algorithm given: train ALGO --env ENV, e.g. train ppo --env CartPole-v1"
        )
    return name


def check_algorithm_name(name: str | None) -> None:
    """The algorithm is registered: checked from the registry, which loads no TensorFlow,
    so a misspelt name is one line before the seconds TensorFlow takes to load."""
    from algorithms.registry import registered_name

    try:
        registered_name(algorithm_name(name))
    except ValueError as err:
        raise TrainingSetupError(str(err)) from None


def algorithm_class(name: str | None) -> type[Algorithm]:
    from algorithms import get_algorithm_class

    try:
        return get_algorithm_class(algorithm_name(name))
    except ValueError as err:
        raise TrainingSetupError(str(err)) from None


def validate_config(algo_cls: type[Algorithm], config: dict) -> dict:
    """The full config (every key, defaults filled in) or an error naming the bad key."""
    from policy_service.config import from_dict

    try:
        typed = from_dict(algo_cls.config_class, config)
    except (ValueError, TypeError) as err:
        raise TrainingSetupError(f"invalid config: {err}") from None
    offline = typed.input != "sampler"  # logged experiences: the env is for evaluation only
    if not typed.env and not offline:
        raise TrainingSetupError(
            "no environment given: pass --env ENV (e.g. CartPole-v1) "
            "or set 'env' in the config file"
        )
    if offline:
        from policy_service.offline.reader import find_files

        find_files(typed.input, "config.input")  # names nothing: one line (OfflineDataError)
    try:
        if typed.env:
            environments.check_env_id(typed.env)
            environments.check_env_config(typed.env, typed.env_config)
    except environments.EnvironmentSetupError as err:
        raise TrainingSetupError(str(err)) from None
    if typed.model.custom_model is not None:
        from policy_service.policy import models

        try:
            models.check_custom_model(typed.model.custom_model)
        except ValueError as err:
            raise TrainingSetupError(str(err)) from None
    if typed.model.custom_action_dist is not None:
        from policy_service.policy import distributions

        try:
            distributions.custom_action_dist(typed.model.custom_action_dist)
        except ValueError as err:
            raise TrainingSetupError(str(err)) from None
    check_devices(typed)
    return json_safe(typed.to_dict())


def check_devices(config) -> None:
    """The learner's towers fit the GPUs this process sees (when the learner lives here:
    num_learners 0), and a minibatch splits evenly over them, whole sequences for the
    built-in LSTM."""
    import tensorflow as tf  # listing physical devices leaves TF free to set up fake GPUs

    from policy_service.engine import devices

    try:
        tower_devices = devices.choose_tower_devices(
            config.num_gpus if config.num_learners == 0 else 0,
            config._fake_gpus,
            len(tf.config.list_physical_devices("GPU")),
        )
    except ValueError as err:
        raise TrainingSetupError(f"config.num_gpus: {err}") from None
    from policy_service.data.units import check_minibatch_size

    rows_per_sequence = config.model.max_seq_len if config.model.use_lstm else 1
    try:
        check_minibatch_size(
            "config.minibatch_size",
            config.minibatch_size,
            learners=1,
            towers=tower_devices.num_towers,
            unit_rows=rows_per_sequence,
        )
    except ValueError as err:
        raise TrainingSetupError(str(err)) from None


def exponent_floats(value: Any) -> Any:
    """Strings like "3e-4" as floats: YAML 1.1 reads an exponent without a dot as text."""
    if isinstance(value, dict):
        return {k: exponent_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [exponent_floats(v) for v in value]
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value.strip()):
        return float(value)
    return value
