"""The scalar arguments of the public policy calls, checked where they enter.

TFPolicy, LearnerGroup and PolicyActor take the same `explore`, `timestep`,
`buffer_index`, `offset`, `num_epochs`, weights `version` and gradients; each is
checked here once, before anything changes, and a bad one is a one-line error
naming the argument with what was expected and what came ("abc" would otherwise
be truthy, or fail later with a message that names nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT64_MAX = int(np.iinfo(np.int64).max)  # counts reach the compiled steps as int64


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def flag(value: Any, name: str) -> bool:
    """A bool argument (the string "no" is truthy: refused)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True, False or None, got {value!r}")


def count(value: Any, name: str) -> int:
    """An integer in [0, INT64_MAX] (a timestep, a row offset): beyond it the int64
    the compiled steps take would fail with Python's OverflowError, naming nothing."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if int(value) > INT64_MAX:
        raise ValueError(f"{name} must be at most {INT64_MAX} (int64), got {int(value)}")
    return int(value)


def buffer_index(value: Any) -> int:
    """Which loaded buffer: an integer >= 0."""
    return count(value, "buffer_index")


def num_epochs(value: Any, default: int) -> int:
    """Epochs over a loaded buffer: None for `default` (the config's), else >= 1."""
    if value is None:
        return default
    if not _is_int(value) or value < 1:
        raise ValueError(f"num_epochs must be None or >= 1, got {value!r}")
    return int(value)


def weights_version(value: Any) -> int | None:
    """A weights version: None (the current one + 1) or an integer >= 0."""
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise ValueError(f"version must be None or an integer >= 0, got {value!r}")
    return int(value)


def gradient_lists(value: Any) -> list:
    """apply_gradients' argument: a list (or tuple) of arrays, or of such lists."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            "gradients must be a list of arrays, one per trainable variable (as "
            f"compute_gradients returns it), got {type(value).__name__}"
        )
    return list(value)
