"""Functions over every array of a nest (dicts, lists, tuples and namedtuples of arrays),
walked by hand: dm-tree's map_structure costs a call ~10-30 us, more than the work it
does on acting's hot paths (a request's rows cut out of a pass, a pass's rows joined,
a step's row recorded), which run once or more per request.

    map_arrays(np.add, {"a": x, "b": (y, z)}, {"a": 1, "b": (2, 3)})
    join_rows([obs_of_request_1, obs_of_request_2])   # one nest, rows concatenated
    row_range(outputs, 4, 6)                          # rows 4 and 5 of every array
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def map_arrays(fn: Callable, nest, *more):
    """fn(leaf, *the same leaf of each of `more`) for every leaf, in the nest's structure
    (dict keys in the first nest's order; any dict comes back a plain dict, and other
    objects are leaves); ValueError when `more` are shaped otherwise."""
    if isinstance(nest, dict):
        if any(not isinstance(m, dict) or m.keys() != nest.keys() for m in more):
            raise ValueError(f"nests differ: keys {sorted(nest)} in the first")
        return {key: map_arrays(fn, value, *(m[key] for m in more)) for key, value in nest.items()}
    if isinstance(nest, (list, tuple)):
        if any(not isinstance(m, (list, tuple)) or len(m) != len(nest) for m in more):
            raise ValueError(f"nests differ: a sequence of {len(nest)} in the first")
        parts = [map_arrays(fn, *values) for values in zip(nest, *more)]
        return type(nest)(*parts) if hasattr(nest, "_fields") else type(nest)(parts)
    return fn(nest, *more)


def join_rows(nests: Sequence) -> Any:
    """Several nests of one structure -> one, each array their rows concatenated (a
    single nest is returned as it is, not copied)."""
    if len(nests) == 1:
        return nests[0]
    return map_arrays(lambda *parts: np.concatenate(parts, axis=0), *nests)


def row_range(nest, start: int, stop: int) -> Any:
    """Rows start..stop-1 of every array (views, not copies)."""
    return map_arrays(lambda array: array[start:stop], nest)
