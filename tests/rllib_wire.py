"""JSON lines between the differential test and the RLlib oracle process.

Both sides import this file (the oracle runs in RLlib's own virtualenv, which
has numpy but not this package), so it needs nothing beyond numpy. Arrays
travel as nested lists with their dtype and shape; Python floats print
exactly, so a round trip is lossless for the int, float and bool dtypes used.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np


def encode(value: Any) -> Any:
    """numpy arrays, tuples and dicts -> JSON-safe values (lists stay lists)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return {"__object__": [encode(v) for v in value.tolist()]}
        return {"__nd__": value.tolist(), "dtype": value.dtype.str, "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {"__dict__": [[k, encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, dict):
        if "__nd__" in value:
            return np.array(value["__nd__"], dtype=np.dtype(value["dtype"])).reshape(
                value["shape"])
        if "__object__" in value:
            items = [decode(v) for v in value["__object__"]]
            out = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                out[i] = item
            return out
        if "__dict__" in value:
            return {k: decode(v) for k, v in value["__dict__"]}
        if "__tuple__" in value:
            return tuple(decode(v) for v in value["__tuple__"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(encode(value))


def loads(line: str) -> Any:
    return decode(json.loads(line))
