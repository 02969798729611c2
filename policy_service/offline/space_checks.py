"""Whether logged actions lie inside their action space, checked a column at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np


def first_outside(space: gym.Space, actions: Any) -> tuple[int, Any] | None:
    """(row, action) of the first row of `actions` outside `space`, or None.

    Box, Discrete, MultiDiscrete and MultiBinary are checked on whole columns; Dict and
    Tuple spaces per component; other spaces row by row with `space.contains`."""
    if isinstance(space, gym.spaces.Dict) and isinstance(actions, Mapping):
        found = [first_outside(s, actions.get(k)) for k, s in space.spaces.items()]
        return _earliest(found)
    if isinstance(space, gym.spaces.Tuple) and isinstance(actions, tuple | list):
        if len(actions) != len(space.spaces):
            return 0, actions
        return _earliest([first_outside(s, a) for s, a in zip(space.spaces, actions)])
    if actions is None:
        return 0, None
    array = np.asarray(actions)
    if array.ndim == 0:
        return 0, actions
    rows = len(array)
    if rows == 0:
        return None
    if isinstance(space, gym.spaces.Discrete):
        bad = np.ones(rows, bool) if array.ndim != 1 else _not_integral(array)
        if not bad.any():
            bad = (array < space.start) | (array >= space.start + space.n)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        if array.shape[1:] != space.shape:
            return 0, array[0]
        bad = _not_integral(array) | (array < space.start) | (array >= space.start + space.nvec)
    elif isinstance(space, gym.spaces.MultiBinary):
        if array.shape[1:] != space.shape:
            return 0, array[0]
        bad = (array != 0) & (array != 1)
    elif isinstance(space, gym.spaces.Box):
        if array.shape[1:] != space.shape:
            return 0, array[0]
        inside = (array >= space.low) & (array <= space.high)  # NaN is outside
        bad = np.asarray(~inside)
    else:
        bad = np.array([not space.contains(a) for a in array])
    per_row = np.asarray(bad).reshape(rows, -1).any(axis=1)
    if not per_row.any():
        return None
    row = int(np.argmax(per_row))
    return row, array[row]


def _not_integral(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "iub":
        return np.zeros(array.shape, bool)
    if array.dtype.kind == "f":
        return array != np.round(array)
    return np.ones(array.shape, bool)


def _earliest(found: list[tuple[int, Any] | None]) -> tuple[int, Any] | None:
    hits = [f for f in found if f is not None]
    return min(hits, key=lambda hit: hit[0]) if hits else None
