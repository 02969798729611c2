"""ColumnStore: transitions kept as preallocated numpy columns, written as a ring.

Each stored column is one array of `capacity` rows, allocated from the dtype
and row shape of the first batch added (nested columns, dicts/tuples of
arrays walked with dm-tree, get one array per leaf). Adding n rows copies
each column with at most two slice assignments (two when the ring wraps);
taking rows is one `ndarray.take` per leaf. Nothing loops over transitions.

Every add is checked before anything is written (columns, dtypes, row
shapes, equal row counts). A batch of flat columns whose (dtype, shape)
per column equals the store's layout for its row count is accepted with one
C-level tuple comparison; anything else (nested columns, lists, a mismatch)
takes the column-by-column check, which names what is wrong. At 32
CartPole rows, checks column by column in Python cost half as much as the copy.

Slots fill from 0; once `size == capacity` the oldest slot is overwritten
first, so slot order is insertion order modulo the capacity.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tree

LEAF_SEPARATOR = "/"
# What the fast check compares per column. Anything with an equal dtype and shape
# (an ndarray, or e.g. a tf.Tensor) copies correctly into the ring.
ARRAY_LAYOUT = operator.attrgetter("dtype", "shape")
MAX_LAYOUTS = 64  # expected layouts kept, one per row count seen


def _skeleton(value: Any) -> Any:
    """The column's nesting with None for every leaf (JSON-able: tuples become lists)."""
    if isinstance(value, np.ndarray):
        return None
    return tree.map_structure(lambda _: None, value)


def _skeleton_from_json(skeleton: Any) -> Any:
    if isinstance(skeleton, list):
        return tuple(_skeleton_from_json(s) for s in skeleton)
    if isinstance(skeleton, dict):
        return {k: _skeleton_from_json(v) for k, v in skeleton.items()}
    return skeleton


def _skeleton_to_json(skeleton: Any) -> Any:
    if isinstance(skeleton, tuple):
        return [_skeleton_to_json(s) for s in skeleton]
    if isinstance(skeleton, Mapping):
        return {str(k): _skeleton_to_json(v) for k, v in skeleton.items()}
    return skeleton


def _leaves(name: str, value: Any) -> list[tuple[str, Any]]:
    """(leaf name, leaf) pairs of one column: "obs" for a flat array, "obs/pos" nested."""
    if isinstance(value, np.ndarray):
        return [(name, value)]
    if isinstance(value, list):  # SampleBatch keeps lists (infos) as leaves
        return [(name, value)]
    return [
        (LEAF_SEPARATOR.join([name, *map(str, path)]), leaf)
        for path, leaf in tree.flatten_with_path(value)
    ]


def _tuple_getter(names: Sequence[str]) -> Callable[[Mapping], tuple]:
    """batch -> (batch[name] for name in names), always a tuple (itemgetter gives
    a bare value for one name)."""
    if len(names) == 1:
        name = names[0]
        return lambda batch: (batch[name],)
    return operator.itemgetter(*names)


class ColumnStore:
    """Rows of named columns in preallocated ring arrays.

    capacity: rows held; adding beyond it overwrites the oldest rows.
    columns: names to store (others in an added batch are ignored); None
      stores exactly the columns of the first batch, and later batches must
      have the same ones.
    """

    def __init__(self, capacity: int, columns: Sequence[str] | None = None) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"replay buffer: capacity must be an int >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.wanted_columns = None if columns is None else list(columns)
        self.size = 0
        self.next_index = 0
        self.num_added = 0  # rows ever added, overwritten ones included
        self._skeletons: dict[str, Any] = {}  # column -> nesting (None = flat)
        self._arrays: dict[str, np.ndarray] = {}  # leaf name -> [capacity, ...] array
        self._leaf_names: dict[str, list[str]] = {}  # column -> its leaf names, flatten order
        self._index_layout()

    # ---- layout ---------------------------------------------------------

    @property
    def columns(self) -> list[str]:
        """The stored column names (empty until the first add)."""
        return list(self._skeletons)

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated column arrays."""
        return sum(a.nbytes for a in self._arrays.values())

    @property
    def row_nbytes(self) -> int:
        """Bytes of one stored row, all columns."""
        return sum(a.itemsize * int(np.prod(a.shape[1:])) for a in self._arrays.values())

    def _allocate(self, batch: Mapping[str, Any]) -> None:
        names = list(batch) if self.wanted_columns is None else self.wanted_columns
        missing = [c for c in names if c not in batch]
        if missing:
            raise KeyError(
                f"replay buffer: column {missing[0]!r} missing from the first batch "
                f"(batch has {sorted(batch)})"
            )
        arrays: dict[str, np.ndarray] = {}
        skeletons: dict[str, Any] = {}
        leaf_names: dict[str, list[str]] = {}
        for column in names:
            value = batch[column]
            skeletons[column] = _skeleton(value)
            leaf_names[column] = []
            for leaf_name, leaf in _leaves(column, value):
                leaf = np.asarray(leaf)
                if leaf.dtype == object or leaf.ndim == 0:
                    raise TypeError(
                        f"replay buffer: column {leaf_name!r} must be a numeric "
                        f"array with a row axis, got dtype {leaf.dtype} shape "
                        f"{leaf.shape}; leave it out with columns=[...]"
                    )
                arrays[leaf_name] = np.empty((self.capacity, *leaf.shape[1:]), leaf.dtype)
                leaf_names[column].append(leaf_name)
        self._arrays, self._skeletons, self._leaf_names = arrays, skeletons, leaf_names
        self._index_layout()

    def _index_layout(self) -> None:
        """Derived from the stored arrays, for add and take: (column, array or None
        when nested) in column order; when every column is flat, a getter of the
        batch's columns as a tuple and the expected ARRAY_LAYOUT per row count."""
        self._column_arrays = [
            (c, self._arrays[c] if s is None else None) for c, s in self._skeletons.items()
        ]
        flat_arrays = tuple(a for _, a in self._column_arrays if a is not None)
        flat = bool(self._skeletons) and len(flat_arrays) == len(self._column_arrays)
        self._flat_arrays: tuple[np.ndarray, ...] | None = flat_arrays if flat else None
        self._get_flat = _tuple_getter(self.columns) if flat else None
        self._expected_layouts: dict[int, tuple] = {}

    def _expected_layout(self, rows: int) -> tuple:
        """ARRAY_LAYOUT of every flat column of a batch of `rows` rows that fits."""
        expected = self._expected_layouts.get(rows)
        if expected is None:
            if len(self._expected_layouts) >= MAX_LAYOUTS:
                self._expected_layouts.clear()
            expected = tuple((a.dtype, (rows, *a.shape[1:])) for a in self._flat_arrays or ())
            self._expected_layouts[rows] = expected
        return expected

    def _pairs_if_expected(self, batch: Mapping[str, Any]) -> tuple[zip, int] | None:
        """((stored array, batch column) pairs, rows) when the batch's stored columns
        are all flat arrays with exactly the stored dtypes and row shapes and equal
        row counts, and it has no other column unless `columns` was given; None:
        check column by column (which names what does not fit)."""
        get_flat, flat_arrays = self._get_flat, self._flat_arrays
        if get_flat is None or flat_arrays is None:
            return None
        plain = batch if batch.__class__ is dict else dict(batch)  # skips __getitem__
        if self.wanted_columns is None and len(plain) != len(flat_arrays):
            return None
        try:
            values = get_flat(plain)
            rows = len(values[0])
            expected = self._expected_layouts.get(rows) or self._expected_layout(rows)
            if tuple(map(ARRAY_LAYOUT, values)) == expected:
                return zip(flat_arrays, values), rows
        except (KeyError, TypeError, AttributeError):  # missing, unsized, not an array
            pass
        return None

    def _checked_leaves(self, batch: Mapping[str, Any]) -> tuple[list[tuple], int]:
        """_checked_column_by_column; the first batch added fixes the layout, unless
        it is refused."""
        first = not self._arrays
        if first:
            self._allocate(batch)
        try:
            return self._checked_column_by_column(batch)
        except (KeyError, ValueError):
            if first:
                self._arrays, self._skeletons, self._leaf_names = {}, {}, {}
                self._index_layout()
            raise

    def _checked_column_by_column(self, batch: Mapping[str, Any]) -> tuple[list[tuple], int]:
        """((stored array, batch leaf) pairs, rows) for any batch; raises naming the
        first column that does not fit (missing, extra, leaves, dtype, row shape,
        row count)."""
        if self.wanted_columns is None and len(batch.keys()) != len(self._skeletons):
            extra = [c for c in batch if c not in self._skeletons]
            if extra:
                raise KeyError(
                    f"replay buffer: column {extra[0]!r} is not stored in this "
                    f"buffer (stored: {self.columns})"
                )
        get: Callable[[Any, str], Any] = (  # skips __getitem__
            dict.get if isinstance(batch, dict) else type(batch).get
        )
        pairs: list[tuple] = []
        shapes = []
        for column, _ in self._column_arrays:
            value = get(batch, column)
            if value is None and column not in batch:
                raise KeyError(
                    f"replay buffer: column {column!r} missing from the batch "
                    f"(stored: {self.columns}; batch has {sorted(batch)})"
                )
            leaves = _leaves(column, value)
            if [n for n, _ in leaves] != self._leaf_names[column]:
                raise ValueError(
                    f"replay buffer: column {column!r} has leaves "
                    f"{[n for n, _ in leaves]}, the buffer stores "
                    f"{self._leaf_names[column]}"
                )
            for leaf_name, leaf in leaves:
                leaf = np.asarray(leaf)
                stored = self._arrays[leaf_name]
                if (
                    leaf.dtype != stored.dtype
                    or leaf.shape[1:] != stored.shape[1:]
                    or leaf.ndim == 0
                ):
                    raise self._mismatch(leaf_name, leaf)
                pairs.append((stored, leaf))
                shapes.append(leaf.shape[0])
        rows = shapes[0] if shapes else 0
        if shapes.count(rows) != len(shapes):
            lengths = {
                name: len(np.asarray(x))
                for c in self._skeletons
                for name, x in _leaves(c, batch[c])
            }
            raise ValueError(f"replay buffer: columns have different row counts {lengths}")
        return pairs, rows

    def _mismatch(self, leaf_name: str, leaf: np.ndarray) -> ValueError:
        stored = self._arrays[leaf_name]
        return ValueError(
            f"replay buffer: column {leaf_name!r} has rows of shape "
            f"{leaf.shape[1:]} dtype {leaf.dtype}, the buffer stores rows of "
            f"shape {stored.shape[1:]} dtype {stored.dtype}"
        )

    # ---- rows -----------------------------------------------------------

    def rows_in(self, batch: Mapping[str, Any]) -> int:
        """Rows of the batch's first stored column (the count `add` would check)."""
        names = self.columns or self.wanted_columns or list(batch)
        if not names or names[0] not in batch:
            return 0
        return len(np.asarray(_leaves(names[0], batch[names[0]])[0][1]))

    def add(self, batch: Mapping[str, Any]) -> tuple[int, int]:
        """Copies the batch's rows into the ring; returns (first slot, rows written).

        The rows written occupy slots first, first+1, ... modulo capacity. A
        batch longer than the capacity keeps only its last `capacity` rows
        (the earlier ones would be overwritten by them anyway).
        """
        pairs, n = self._pairs_if_expected(batch) or self._checked_leaves(batch)
        start, written = self.next_index, n
        if start + n <= self.capacity:  # no wrap: whole columns, no slice views (faster)
            for stored, leaf in pairs:
                stored[start : start + n] = leaf
        else:
            skip = max(0, n - self.capacity)
            start = (self.next_index + skip) % self.capacity
            written = n - skip
            head = min(written, self.capacity - start)
            for stored, leaf in pairs:
                stored[start : start + head] = leaf[skip : skip + head]
                if head < written:
                    stored[: written - head] = leaf[skip + head :]
        self.next_index = (self.next_index + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        self.num_added += n
        return start, written

    def take(self, indexes: np.ndarray) -> dict[str, Any]:
        """Column -> the rows at `indexes` (copies), nested columns rebuilt."""
        return {
            column: stored.take(indexes, 0)
            if stored is not None
            else self._take_nested(column, indexes)
            for column, stored in self._column_arrays
        }

    def _take_nested(self, column: str, indexes: np.ndarray) -> Any:
        leaves = [self._arrays[name].take(indexes, 0) for name in self._leaf_names[column]]
        return tree.unflatten_as(self._skeletons[column], leaves)

    # ---- state ----------------------------------------------------------

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta): the filled rows of every leaf (views, not copies: save
        them before the next add) and a JSON-able description of the layout."""
        arrays = {f"columns/{name}": a[: self.size] for name, a in self._arrays.items()}
        meta = {
            "capacity": self.capacity,
            "size": self.size,
            "next_index": self.next_index,
            "num_added": self.num_added,
            "wanted_columns": self.wanted_columns,
            "column_order": self.columns,  # JSON writers may sort the "columns" keys
            "columns": {
                c: {"skeleton": _skeleton_to_json(s), "leaves": self._leaf_names[c]}
                for c, s in self._skeletons.items()
            },
            "leaf_layout": {
                name: {"dtype": a.dtype.str, "row_shape": list(a.shape[1:])}
                for name, a in self._arrays.items()
            },
        }
        return arrays, meta

    def check_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        """Raises ValueError naming the first thing in (arrays, meta) that cannot be
        restored into this store; assigns nothing."""
        for key in ("capacity", "size", "next_index", "num_added", "columns", "leaf_layout"):
            if key not in meta:
                raise ValueError(f"replay buffer state: missing {key!r}")
        if meta["capacity"] != self.capacity:
            raise ValueError(
                f"replay buffer state: capacity {meta['capacity']}, this buffer has {self.capacity}"
            )
        size, next_index = meta["size"], meta["next_index"]
        if (
            not 0 <= size <= self.capacity
            or not 0 <= next_index < self.capacity
            or (size < self.capacity and next_index != size)
        ):
            raise ValueError(
                f"replay buffer state: size {size} and next_index {next_index} "
                f"do not fit capacity {self.capacity}"
            )
        order = meta.get("column_order") or list(meta["columns"])
        if sorted(order) != sorted(meta["columns"]):
            raise ValueError(
                f"replay buffer state: column_order {order} does not list the "
                f"columns {sorted(meta['columns'])}"
            )
        leaves = [name for c in order for name in meta["columns"][c]["leaves"]]
        if sorted(leaves) != sorted(meta["leaf_layout"]):
            raise ValueError(
                f"replay buffer state: the columns' leaves {leaves} differ from "
                f"leaf_layout {sorted(meta['leaf_layout'])}"
            )
        for name, layout in meta["leaf_layout"].items():
            key = f"columns/{name}"
            if key not in arrays:
                raise ValueError(f"replay buffer state: array {key!r} missing")
            array = arrays[key]
            want = (size, *layout["row_shape"])
            if array.shape != want or array.dtype != np.dtype(layout["dtype"]):
                raise ValueError(
                    f"replay buffer state: array {key!r} has shape {array.shape} "
                    f"dtype {array.dtype}, expected {want} "
                    f"{np.dtype(layout['dtype'])}"
                )
        if self._arrays:
            ours = {
                n: {"dtype": a.dtype.str, "row_shape": list(a.shape[1:])}
                for n, a in self._arrays.items()
            }
            if ours != dict(meta["leaf_layout"]):
                raise ValueError(
                    f"replay buffer state: columns {meta['leaf_layout']} differ "
                    f"from this buffer's {ours}"
                )

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        """Restores get_state()'s content exactly (checked first, see check_state)."""
        self.check_state(arrays, meta)
        if not self._arrays:
            self._arrays = {
                name: np.empty((self.capacity, *layout["row_shape"]), np.dtype(layout["dtype"]))
                for name, layout in meta["leaf_layout"].items()
            }
        order = meta.get("column_order") or list(meta["columns"])
        self._skeletons = {c: _skeleton_from_json(meta["columns"][c]["skeleton"]) for c in order}
        self._leaf_names = {c: list(meta["columns"][c]["leaves"]) for c in order}
        self._index_layout()
        self.wanted_columns = meta.get("wanted_columns")
        size = int(meta["size"])
        for name, stored in self._arrays.items():
            stored[:size] = arrays[f"columns/{name}"]
        self.size, self.next_index = size, int(meta["next_index"])
        self.num_added = int(meta["num_added"])
