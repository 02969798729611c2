"""`policy-service config ALGO`: every config key of an algorithm with its default, its
doc and what it accepts, read from the config dataclasses (config.py `setting(...)`).

The listing is a YAML file of the defaults, each key under a comment with its doc
and allowed values, so users need not read the source, and a copy of it is a
valid `--config FILE` to edit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from typing import Any

from policy_service.config import Config, field_allowed, field_docs, is_config
from policy_service.errors import UserError

WIDTH = 88


class UnknownAlgorithmError(UserError, ValueError):
    """`policy-service config` was given a name no algorithm is registered under."""


def print_config(algorithm: str) -> int:
    """Print the listing of the algorithm registered as `algorithm`."""
    from algorithms import get_algorithm_class
    from policy_service.io.checkpoints import class_path

    try:
        algorithm_class = get_algorithm_class(algorithm)
    except ValueError as err:
        raise UnknownAlgorithmError(str(err)) from None
    config_class = algorithm_class.config_class
    print(config_listing(config_class, f"{algorithm} ({class_path(config_class)})"), end="")
    return 0


def config_listing(config_class: type[Config], title: str) -> str:
    """The defaults of `config_class` as commented YAML, headed by `title`."""
    lines = [f"# {title}: every config key, its default, doc and allowed values."]
    lines.append("# Set one with --set KEY=VALUE, or edit a copy of this and pass --config FILE.")
    _add_fields(lines, config_class(), indent="")
    return "\n".join(lines) + "\n"


def _add_fields(lines: list[str], config: Config, indent: str) -> None:
    cls = type(config)
    docs = field_docs(cls)
    for field in dataclasses.fields(cls):
        value = getattr(config, field.name)
        lines.append("")
        comment = docs[field.name] or "(no doc)"
        if not is_config(value):
            comment += f" Allowed: {field_allowed(cls, field.name)}."
        lines.extend(
            textwrap.wrap(
                comment, WIDTH, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}#   "
            )
        )
        if is_config(value):
            lines.append(f"{indent}{field.name}:")
            _add_fields(lines, value, indent + "  ")
        else:
            lines.append(f"{indent}{field.name}: {yaml_flow(value)}")


def yaml_flow(value: Any) -> str:
    """A default as YAML reads it back: JSON-like flow, floats always with a dot or
    an exponent YAML 1.1 takes as a float ("5e-05" would be read as a string)."""
    if value is None or isinstance(value, (bool, int, str)):
        return json.dumps(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return {math.inf: ".inf", -math.inf: "-.inf"}.get(value, ".nan")
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return mantissa + (f"e{exponent if exponent[0] in '+-' else '+' + exponent}" if e else "")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))}: {yaml_flow(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"a config default of type {type(value).__name__} has no YAML form: {value!r}")
