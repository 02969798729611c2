"""The run's offline keys (RLlib's names where RLlib has one) and their rules.

    input: "sampler"                 # samples from env runners (default)
           "/data/cartpole"          # a directory of Parquet or JSON-lines files,
           "/data/*/part-*.parquet"  # a glob, or a list of files, directories and globs
    output: "/data/out"              # env runners (and servers) write what they act on
    output_format: "parquet"         # or "json": RLlib's JSON lines
    output_max_file_size: 67108864   # bytes; the next file starts past it
    off_policy_estimation_methods: {"wis": {"type": "WeightedImportanceSampling"}}

AlgorithmConfig declares the fields with these rules; `check_offline_config` is its
rule across fields (one line naming the key). Whether `input` names any file is
checked where a run starts (policy-service train, the runner type "offline"), not
here: a checkpoint of an offline run must load where its data is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_service.config_rules import Rule

SAMPLER = "sampler"  # input: the env runners sample
OUTPUT_FORMATS = ("parquet", "json")  # -> policy_service.offline.WRITERS
DEFAULT_MAX_FILE_SIZE = 64 * 1024 * 1024  # RLlib's output_max_file_size
DEFAULT_HELD_OUT = 0.1  # episodes kept out of training for the estimators

# RLlib's estimator names -> the options each takes (policy_service/offline/estimators.py)
_Q_MODEL = ("q_model_config",)
ESTIMATOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "ImportanceSampling": ("epsilon_prob",),
    "WeightedImportanceSampling": ("epsilon_prob",),
    "DirectMethod": (*_Q_MODEL,),
    "DoublyRobust": ("epsilon_prob", *_Q_MODEL),
}
Q_MODEL_OPTIONS = ("n_iters", "lr", "minibatch_size", "tau", "hiddens", "seed")


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_input(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(map(_is_path, value))
    return _is_path(value)


INPUT = Rule(
    f"{SAMPLER!r}, a directory, a glob, or a non-empty list of files, directories and globs",
    _is_input,
)
OUTPUT = Rule("a directory (a non-empty string)", _is_path)
HELD_OUT = Rule(
    "a fraction in (0, 1) of the episodes",
    lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1,
)


def estimator_type_name(value: Any) -> str | None:
    """An estimator's `type` as its name: a name of ESTIMATOR_OPTIONS, or a class with one."""
    if isinstance(value, type):
        value = value.__name__
    return value if isinstance(value, str) and value in ESTIMATOR_OPTIONS else None


def estimation_methods(value: Any) -> dict[str, dict]:
    """RLlib's form ({name: {"type": ..., options}}), or a list of type names, as
    {name: {"type": type name, options}}; ValueError with what is wrong."""
    if isinstance(value, list):
        value = {str(name): {"type": name} for name in value}
    if not isinstance(value, Mapping) or not value:
        raise ValueError("a non-empty dict of name -> {'type': ..., options} or a list of types")
    methods = {}
    for name, spec in value.items():
        if isinstance(spec, str | type):
            spec = {"type": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"{name}: a dict with 'type', got {spec!r}")
        kind = estimator_type_name(spec.get("type"))
        if kind is None:
            raise ValueError(
                f"{name}: 'type' one of {list(ESTIMATOR_OPTIONS)}, got {spec.get('type')!r}"
            )
        unknown = sorted(set(spec) - {"type", *ESTIMATOR_OPTIONS[kind]})
        if unknown:
            raise ValueError(
                f"{name}: {kind} takes {['type', *ESTIMATOR_OPTIONS[kind]]}, not {unknown[0]!r}"
            )
        q_model = spec.get("q_model_config", {})
        if not isinstance(q_model, Mapping) or set(q_model) - set(Q_MODEL_OPTIONS):
            raise ValueError(f"{name}: q_model_config keys among {list(Q_MODEL_OPTIONS)}")
        methods[str(name)] = {**spec, "type": kind}
    return methods


def estimation_methods_error(value: Any) -> str | None:
    try:
        estimation_methods(value)
    except ValueError as err:
        return str(err)
    return None


def is_offline(config: Any) -> bool:
    """Whether the run reads its samples from `input` (the runner type "offline")."""
    return getattr(config, "input", SAMPLER) != SAMPLER


def check_offline_config(config: Any) -> None:
    """The offline keys against the others; ConfigError naming the key."""
    from policy_service.config import ConfigError

    prefix = config.key_prefix
    offline = is_offline(config)
    if offline and not getattr(type(config), "takes_input", True):
        name = type(config).__name__.removesuffix("Config")
        raise ConfigError(
            f"{prefix}.input: {name} samples asynchronously from env runner actors, which "
            "logged experiences do not stand in for; train bc, marwil, cql, ppo, dqn, sac or "
            f"td3 from input, got {config.input!r}"
        )
    if offline and config.external_env:
        raise ConfigError(
            f"{prefix}.input: external_env clients give this run its samples; set input "
            f"to {SAMPLER!r} or external_env to false, got {config.input!r}"
        )
    if offline and config.output is not None:
        raise ConfigError(
            f"{prefix}.output: a run reading input acts in no env, so it has nothing to "
            f"write; unset output or set input to {SAMPLER!r}, got {config.output!r}"
        )
    if offline and config.observation_filter != "NoFilter":
        raise ConfigError(
            f"{prefix}.observation_filter must be 'NoFilter' with input (the logged "
            f"observations are trained on as they were written), got {config.observation_filter!r}"
        )
    if config.off_policy_estimation_methods is not None and config.policies is not None:
        raise ConfigError(
            f"{prefix}.off_policy_estimation_methods: estimates score one policy (no "
            f"policies); unset one of them, got policies {sorted(config.policies)}"
        )
    if config.off_policy_estimation_methods is not None:
        if not offline:
            raise ConfigError(
                f"{prefix}.off_policy_estimation_methods: estimates are made on held-out "
                f"episodes of input; set input to the logged experiences, got {SAMPLER!r}"
            )
        config.off_policy_estimation_methods = estimation_methods(
            config.off_policy_estimation_methods
        )
    if (
        offline
        and config.evaluation_interval is not None
        and not config.env
        and config.off_policy_estimation_methods is None
    ):
        raise ConfigError(
            f"{prefix}.evaluation_interval: an offline run without env has nothing to "
            "evaluate; set env (episodes are played) or off_policy_estimation_methods"
        )
