"""How a SampleBatch's columns are laid out as Arrow columns, and back.

Each array leaf of a column (a nested observation has several) becomes one Arrow
column named by its path joined with "/" ("obs", "obs/image", "obs/0"): a row of
shape () as a plain column, a row of shape (d1, ..., dk) as a fixed-size list of
d1*...*dk values, so Parquet keeps it columnar and compressed and Ray Data and pandas
read it. `infos` is one JSON string per row. The leaf's dtype and row shape are kept
in a `LeafSpec` (the manifest holds them), which rebuilds the same arrays on read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from policy_service.data.sample_batch import SampleBatch
from policy_service.errors import UserError

INFOS = SampleBatch.INFOS
SEPARATOR = "/"
_KINDS = "?biufUS"  # bool, ints, floats, fixed strings: what Parquet keeps exactly


class OfflineDataError(UserError, ValueError):
    """Experience data that cannot be written or read as asked: one line naming the
    file (or directory) and the column, with what was expected and what was found."""


@dataclass(frozen=True)
class LeafSpec:
    """One stored column: its name, its path inside the batch column (dict keys are
    strings, tuple positions ints), and each row's dtype and shape."""

    name: str
    path: tuple[str | int, ...]
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "path": list(self.path), "dtype": self.dtype,
                "shape": list(self.shape)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping) -> LeafSpec:
        return cls(data["name"], tuple(data["path"]), data["dtype"], tuple(data["shape"]))

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


INFOS_SPEC = LeafSpec(INFOS, (INFOS,), "json", ())


def _leaves(path: tuple, value: Any) -> list[tuple[tuple, Any]]:
    if isinstance(value, Mapping):
        return [leaf for k, v in value.items() for leaf in _leaves((*path, str(k)), v)]
    if isinstance(value, tuple):
        return [leaf for i, v in enumerate(value) for leaf in _leaves((*path, i), v)]
    return [(path, value)]


def leaf_specs(batch: Mapping[str, Any], where: str) -> list[LeafSpec]:
    """The stored columns of `batch`'s row columns (seq_lens, a sequence column, is
    not one), checked to be storable; `where` names the destination in errors."""
    specs = []
    for key, value in batch.items():
        if key == SampleBatch.SEQ_LENS:
            continue
        if key == INFOS:
            specs.append(INFOS_SPEC)
            continue
        for path, leaf in _leaves((key,), value):
            name = SEPARATOR.join(str(p) for p in path)
            if any(SEPARATOR in str(p) for p in path):
                raise OfflineDataError(f"{where}: column {name!r}: a key holds {SEPARATOR!r}")
            array = np.asarray(leaf)
            if array.dtype.kind not in _KINDS or array.ndim == 0:
                raise OfflineDataError(
                    f"{where}: column {name!r}: expected rows of bool, int, float or string "
                    f"values, got {array.dtype} of shape {array.shape}"
                )
            if array.dtype.kind in "US" and array.ndim > 1:
                raise OfflineDataError(f"{where}: column {name!r}: strings only one per row")
            specs.append(LeafSpec(name, path, array.dtype.newbyteorder("=").str, array.shape[1:]))
    return specs


def leaf_value(columns: Mapping[str, Any], spec: LeafSpec) -> Any:
    """The rows of the leaf `spec` names inside batch columns."""
    value: Any = columns
    for part in spec.path:
        value = value[part]
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-safe")


def info_text(info: Any) -> str | None:
    """An info dict as JSON (numpy values as plain ones), or None when it holds
    something JSON cannot say (it is then not kept)."""
    try:
        return json.dumps(info, default=_json_safe, allow_nan=True)
    except (TypeError, ValueError):
        return None


def to_arrow(batch: Mapping[str, Any], specs: list[LeafSpec]) -> pa.Table:
    """`batch`'s rows as an Arrow table of the stored columns `specs`."""
    arrays, names = [], []
    for spec in specs:
        if spec is INFOS_SPEC or spec.dtype == "json":
            arrays.append(pa.array([info_text(i) for i in batch[INFOS]], pa.string()))
        else:
            array = np.ascontiguousarray(leaf_value(batch, spec), dtype=np.dtype(spec.dtype))
            if spec.shape:
                flat = pa.array(array.reshape(-1))
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, math.prod(spec.shape)))
            else:
                arrays.append(pa.array(array))
        names.append(spec.name)
    return pa.Table.from_arrays(arrays, names=names)


def leaf_from_arrow(column: pa.ChunkedArray | pa.Array, spec: LeafSpec, where: str) -> Any:
    """One stored column as the rows it held: an array of `spec`'s dtype and row shape,
    or for infos a list of dicts."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count and spec.dtype != "json":
        raise OfflineDataError(f"{where}: column {spec.name!r}: {array.null_count} null rows")
    if spec.dtype == "json":
        return [{} if text is None else json.loads(text) for text in array.to_pylist()]
    dtype = np.dtype(spec.dtype)
    if spec.shape:
        if not pa.types.is_fixed_size_list(array.type):
            raise OfflineDataError(
                f"{where}: column {spec.name!r}: expected rows of shape {list(spec.shape)}, "
                f"got Arrow type {array.type}"
            )
        size = math.prod(spec.shape)  # the values of these rows (flatten's kernel, no copy)
        values = array.values.slice(array.offset * size, len(array) * size)
        out = values.to_numpy(zero_copy_only=False).reshape((len(array), *spec.shape))
    else:
        out = array.to_numpy(zero_copy_only=False)
    if out.dtype != dtype and not (dtype.kind in "US" and out.dtype.kind == "O"):
        raise OfflineDataError(
            f"{where}: column {spec.name!r}: expected dtype {dtype}, got {out.dtype}"
        )
    return out.astype(dtype, copy=False)


def columns_from_leaves(leaves: Mapping[LeafSpec, Any]) -> dict[str, Any]:
    """Batch columns (nested where the leaves' paths say so) from stored leaves."""
    columns: dict[Any, Any] = {}
    for spec, value in leaves.items():
        node = columns
        for part in spec.path[:-1]:
            node = node.setdefault(part, {})
        node[spec.path[-1]] = value
    return {key: _tuples(value) for key, value in columns.items()}


def _tuples(node: Any) -> Any:
    """Dicts keyed 0..n-1 by ints (tuple positions in a path) back into tuples."""
    if not isinstance(node, dict):
        return node
    items = {k: _tuples(v) for k, v in node.items()}
    if items and all(isinstance(k, int) for k in items):
        return tuple(items[i] for i in range(len(items)))
    return items
