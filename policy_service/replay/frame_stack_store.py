"""FrameStackStore: a ColumnStore whose obs and new_obs are stacks of frames, each
distinct frame kept once in a FramePool.

With frame stacking (k frames per observation), one 84x84 frame sits in up to
2k stored rows: k stacks of obs and k of new_obs. Stored whole, 1M Atari
transitions take 56 GB; here a row of obs/new_obs is 2k int32 slot ids into
the pool (obs's k frames, then new_obs's), and the pool holds each distinct
live frame once, so the frames cost about one frame per transition, whatever
the n-step distance, the sub-envs interleaved in a batch or the split of a
stream into add() calls. Every other column stays in a ColumnStore.

The stack axis is per row: -1 for [84, 84, 4], 0 for gymnasium's
FrameStackObservation [4, 84, 84]. `take` rebuilds obs and new_obs exactly as
they were added (contiguous, same dtype and shape).

Same interface as ColumnStore (what ReplayBuffer and PrioritizedReplayBuffer
use): capacity, size, next_index, num_added, nbytes, rows_in, add, take,
get_state, check_state, set_state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policy_service.replay.column_store import ColumnStore
from policy_service.replay.frame_pool import FramePool

FRAME_COLUMNS = ("obs", "new_obs")  # SampleBatch.OBS, SampleBatch.NEXT_OBS
POOL_HEADROOM = 16  # the pool starts at capacity * (1 + 1/16) frames: one per row, spare


class FrameStackStore:
    """Rows of a ring of `capacity` transitions; obs/new_obs as frame ids into a pool.

    columns: as ColumnStore's (None: those of the first batch); the stacked
      columns are those of obs/new_obs that are stored.
    frame_stack_axis: the stack axis within one observation (negative counts
      from the end).
    """

    def __init__(self, capacity: int, columns: Sequence[str] | None, frame_stack_axis: int) -> None:
        if isinstance(frame_stack_axis, bool) or not isinstance(
            frame_stack_axis, (int, np.integer)
        ):
            raise ValueError(
                f"replay buffer: frame_stack_axis must be an int or None, got {frame_stack_axis!r}"
            )
        self.axis = int(frame_stack_axis)
        self.frame_columns = [c for c in FRAME_COLUMNS if columns is None or c in columns]
        if not self.frame_columns:
            raise ValueError(
                f"replay buffer: frame_stack_axis needs 'obs' or 'new_obs' "
                f"among the columns, got {list(columns or ())}"
            )
        others = None if columns is None else [c for c in columns if c not in self.frame_columns]
        if others == []:
            raise ValueError(
                f"replay buffer: frame_stack_axis needs a column besides "
                f"{self.frame_columns}, got columns {list(columns or ())}"
            )
        self.wanted_columns = None if columns is None else list(columns)
        self.others = ColumnStore(capacity, others)
        self.row_shape: tuple | None = None  # of one observation, set by the first add
        self.dtype: np.dtype | None = None
        self.column_order: list[str] = []
        self.pool: FramePool | None = None
        self.row_ids: np.ndarray | None = None  # <int32>[capacity, len(frame_columns) * k]

    # ---- layout ---------------------------------------------------------

    capacity = property(lambda self: self.others.capacity)
    size = property(lambda self: self.others.size)
    next_index = property(lambda self: self.others.next_index)
    num_added = property(lambda self: self.others.num_added)

    @property
    def columns(self) -> list[str]:
        return list(self.column_order)

    @property
    def stack_axis(self) -> int:
        """The stack axis of one observation, counted from 0."""
        assert self.row_shape is not None, "no frames added yet"
        return self.axis % len(self.row_shape)

    @property
    def num_frames(self) -> int:
        """Distinct frames held (each stored once, however many rows share it)."""
        return 0 if self.pool is None else self.pool.num_live

    @property
    def nbytes(self) -> int:
        """The other columns, the row ids and the pool (allocated slots, refcounts,
        hash index)."""
        if self.pool is None or self.row_ids is None:
            return self.others.nbytes
        return self.others.nbytes + self.pool.nbytes + self.row_ids.nbytes

    def _start(self, row_shape: tuple, dtype: np.dtype, pool: FramePool | None = None) -> None:
        """Fixes the layout: a pool (a new one unless given) and the rows' frame ids."""
        self.row_shape, self.dtype = tuple(row_shape), np.dtype(dtype)
        k = self.row_shape[self.stack_axis]
        frame_shape = tuple(s for i, s in enumerate(self.row_shape) if i != self.stack_axis)
        ids_per_row = len(self.frame_columns) * k
        capacity = self.capacity
        self.pool = pool or FramePool(
            frame_shape, dtype, capacity + capacity // POOL_HEADROOM + 2 * k, self.max_frames(k)
        )
        self.row_ids = np.zeros((capacity, ids_per_row), np.int32)

    def max_frames(self, stack: int) -> int:
        """The most distinct frames the rows can hold: every id of every row."""
        return self.capacity * len(self.frame_columns) * stack

    # ---- checks ---------------------------------------------------------

    def _checked_stacks(self, batch: Mapping[str, Any]) -> list[np.ndarray]:
        """The frame columns as arrays [n, *row_shape]; raises naming the column when
        one is missing, not one array, without the stack axis, or unlike the other
        frame column or the stored rows."""
        stacks: list[np.ndarray] = []
        for column in self.frame_columns:
            if column not in batch:
                raise KeyError(
                    f"replay buffer: column {column!r} missing from the batch "
                    f"(batch has {sorted(batch)})"
                )
            value = batch[column]
            if isinstance(value, (Mapping, tuple)):
                raise ValueError(
                    f"replay buffer: column {column!r} must be one array of "
                    f"frame stacks (frame_stack_axis={self.axis}), got "
                    f"{type(value).__name__}"
                )
            value = np.asarray(value)
            if (
                value.dtype == object
                or value.ndim < 3
                or not -(value.ndim - 1) <= self.axis < value.ndim - 1
            ):
                raise ValueError(
                    f"replay buffer: column {column!r} must have rows of at "
                    f"least 2 dimensions with the stack on axis {self.axis}, "
                    f"got rows of shape {value.shape[1:]} dtype {value.dtype}"
                )
            want: tuple[tuple, Any] | None = (
                (self.row_shape, self.dtype)
                if self.row_shape is not None
                else (stacks[0].shape[1:], stacks[0].dtype)
                if stacks
                else None
            )
            if want is not None and (value.shape[1:], value.dtype) != want:
                than = (
                    "the buffer stores"
                    if self.row_shape is not None
                    else f"column {self.frame_columns[0]!r} has"
                )
                raise ValueError(
                    f"replay buffer: column {column!r} has rows of shape "
                    f"{value.shape[1:]} dtype {value.dtype}, {than} rows of "
                    f"shape {tuple(want[0])} dtype {want[1]}"
                )
            if stacks and len(value) != len(stacks[0]):
                raise ValueError(
                    f"replay buffer: column {column!r} has {len(value)} rows, "
                    f"column {self.frame_columns[0]!r} has {len(stacks[0])}"
                )
            stacks.append(value)
        return stacks

    def _other_columns(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        names = self.wanted_columns if self.wanted_columns is not None else list(batch)
        return {c: batch[c] for c in names if c not in self.frame_columns and c in batch}

    # ---- rows -----------------------------------------------------------

    def rows_in(self, batch: Mapping[str, Any]) -> int:
        """Rows of the batch's first frame column (what `add` checks the rest against)."""
        column = self.frame_columns[0]
        return len(np.asarray(batch[column])) if column in batch else 0

    def add(self, batch: Mapping[str, Any]) -> tuple[int, int]:
        """Copies the batch's rows; returns (first slot, rows written) as ColumnStore.add.
        Everything is checked, the pool grown and the frames gathered before anything
        is written."""
        stacks = self._checked_stacks(batch)
        others = self._other_columns(batch)
        if not others:
            raise ValueError(
                f"replay buffer: the batch has no column besides "
                f"{self.frame_columns} (batch has {sorted(batch)})"
            )
        rows = self.others.rows_in(others)
        if rows != len(stacks[0]):
            first = self.others.columns[0] if self.others.columns else next(iter(others))
            raise ValueError(
                f"replay buffer: column {self.frame_columns[0]!r} has "
                f"{len(stacks[0])} rows, column {first!r} has {rows}"
            )
        size_before, starting = self.size, self.pool is None
        if starting:
            self._start(stacks[0].shape[1:], stacks[0].dtype)
        pool, row_ids = self.pool, self.row_ids
        assert pool is not None and row_ids is not None  # set by _start
        n = len(stacks[0])
        skip = max(0, n - self.capacity)  # rows a batch longer than the ring does not keep
        # [written, columns, k, *frame] -> one frame per entry, in the row ids' order
        frames = np.stack([np.moveaxis(s[skip:], 1 + self.stack_axis, 1) for s in stacks], 1)
        match = pool.match(frames.reshape(-1, *pool.frame_shape))
        positions = (self.next_index + skip + np.arange(n - skip)) % self.capacity
        overwritten = row_ids[positions[positions < size_before]].ravel()
        pool.reserve(match, overwritten)  # grown now, not after the columns are written
        try:
            start, written = self.others.add(others)  # checks its columns before writing
        except BaseException:
            if starting:
                self.pool = self.row_ids = self.row_shape = self.dtype = None
            raise
        if starting:
            self.column_order = [
                c
                for c in (self.wanted_columns or list(batch))
                if c in self.frame_columns or c in self.others.columns
            ]
        row_ids[positions] = pool.commit(match, overwritten).reshape(written, -1)
        return start, written

    def take(self, indexes: np.ndarray) -> dict[str, Any]:
        """Column -> the rows at `indexes` (copies), obs/new_obs rebuilt from the pool."""
        columns = self.others.take(indexes)
        pool, row_ids, row_shape = self.pool, self.row_ids, self.row_shape
        assert pool is not None and row_ids is not None and row_shape is not None, (
            "take before any add"
        )
        ids = row_ids[indexes]
        k = row_shape[self.stack_axis]
        for i, column in enumerate(self.frame_columns):
            column_ids = ids[:, i * k : (i + 1) * k]
            if self.stack_axis == 0:
                columns[column] = pool.take(column_ids)  # [B, k, *frame]: the layout
                continue
            # frame by frame into its place on the axis: 3x faster than moving the axis
            stacks = np.empty((len(ids), *row_shape), self.dtype)
            for j in range(k):
                stacks[(slice(None),) * (1 + self.stack_axis) + (j,)] = pool.take(column_ids[:, j])
            columns[column] = stacks
        return {c: columns[c] for c in self.column_order}

    # ---- state ----------------------------------------------------------

    def get_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta): ColumnStore's, plus the live frames compacted to the front of
        the pool ("frames/pool"), each row's frame ids into them ("frames/row_ids")
        and which frames the hash index holds ("frames/indexed"); views: save them
        before the next add."""
        arrays, meta = self.others.get_state()
        layout: dict[str, Any] = {
            "columns": self.frame_columns,
            "column_order": self.column_order,
            "row_shape": None,
            "dtype": None,
            "num_frames": 0,
            "pool_capacity": 0,
        }
        if self.pool is not None:
            assert (
                self.row_ids is not None and self.row_shape is not None and self.dtype is not None
            )  # set with the pool
            remap = self.pool.compact()
            self.row_ids[: self.size] = remap[self.row_ids[: self.size]]
            live = self.pool.num_live
            arrays["frames/pool"] = self.pool.frames[:live]
            arrays["frames/row_ids"] = self.row_ids[: self.size]
            arrays["frames/indexed"] = self.pool.indexed()[:live]
            layout.update(
                row_shape=list(self.row_shape),
                dtype=self.dtype.str,
                num_frames=live,
                pool_capacity=self.pool.capacity,
            )
        return arrays, dict(meta, frame_stack=layout, frame_stack_axis=self.axis)

    def check_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        """Raises ValueError naming what does not fit: ColumnStore's checks, then the
        frames' layout, arrays, and ids (each in range, each frame used by a row)."""
        layout = meta.get("frame_stack")  # its axis is meta's "frame_stack_axis", which
        if not isinstance(layout, Mapping):  # the buffer compares before this is called
            raise ValueError("replay buffer state: missing 'frame_stack' (the frames' layout)")
        self.others.check_state(arrays, meta)
        if layout.get("columns") != self.frame_columns:
            raise ValueError(
                f"replay buffer state: frame columns {layout.get('columns')}, "
                f"this buffer stacks {self.frame_columns}"
            )
        missing = [
            key
            for key in ("column_order", "row_shape", "dtype", "num_frames", "pool_capacity")
            if key not in layout
        ]
        if missing:
            raise ValueError(f"replay buffer state: frame_stack misses {missing[0]!r}")
        size = meta["size"]
        if layout["row_shape"] is None:
            if size:
                raise ValueError(f"replay buffer state: {size} rows but no frame layout")
            return
        row_shape, dtype = tuple(layout["row_shape"]), np.dtype(layout["dtype"])
        if self.row_shape is not None and (row_shape, dtype) != (self.row_shape, self.dtype):
            raise ValueError(
                f"replay buffer state: frame stacks of shape {row_shape} dtype "
                f"{dtype}, this buffer stores {self.row_shape} {self.dtype}"
            )
        if len(row_shape) < 2 or not -len(row_shape) <= self.axis < len(row_shape):
            raise ValueError(
                f"replay buffer state: frame stacks of shape {row_shape} have no axis {self.axis}"
            )
        k = row_shape[self.axis % len(row_shape)]
        frame_shape = (
            row_shape[: self.axis % len(row_shape)] + row_shape[self.axis % len(row_shape) + 1 :]
        )
        live = layout["num_frames"]
        if not isinstance(live, int) or not isinstance(layout["pool_capacity"], int):
            raise ValueError(
                f"replay buffer state: num_frames {live!r} and pool_capacity "
                f"{layout['pool_capacity']!r} must be ints"
            )
        want = {
            "frames/pool": ((live, *frame_shape), dtype),
            "frames/row_ids": ((size, len(self.frame_columns) * k), np.dtype(np.int32)),
            "frames/indexed": ((live,), np.dtype(bool)),
        }
        for key, (shape, want_dtype) in want.items():
            if key not in arrays:
                raise ValueError(f"replay buffer state: array {key!r} missing")
            array = arrays[key]
            if array.shape != shape or array.dtype != want_dtype:
                raise ValueError(
                    f"replay buffer state: array {key!r} has shape "
                    f"{array.shape} dtype {array.dtype}, expected {shape} "
                    f"{want_dtype}"
                )
        ids = np.asarray(arrays["frames/row_ids"])
        if ids.size and (ids.min() < 0 or ids.max() >= live):
            raise ValueError(
                f"replay buffer state: 'frames/row_ids' must lie in [0, {live}), "
                f"got [{ids.min()}, {ids.max()}]"
            )
        unused = np.flatnonzero(np.bincount(ids.ravel(), minlength=live) == 0)
        if len(unused):
            raise ValueError(
                f"replay buffer state: frame {int(unused[0])} of 'frames/pool' is used by no row"
            )
        if not live <= layout["pool_capacity"] <= self.max_frames(k):
            raise ValueError(
                f"replay buffer state: pool_capacity {layout['pool_capacity']} "
                f"does not fit {live} frames and {self.capacity} rows"
            )

    def set_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        """Restores get_state()'s content exactly (checked first, see check_state)."""
        self.check_state(arrays, meta)
        self.others.set_state(arrays, meta)
        layout = meta["frame_stack"]
        self.column_order = list(layout["column_order"])
        if layout["row_shape"] is None:
            return
        ids = np.asarray(arrays["frames/row_ids"])
        refcounts = np.bincount(ids.ravel(), minlength=layout["num_frames"])
        pool = FramePool.from_frames(
            np.asarray(arrays["frames/pool"]),
            refcounts,
            np.asarray(arrays["frames/indexed"]),
            layout["pool_capacity"],
            self.max_frames(ids.shape[1] // len(self.frame_columns)),
        )
        self._start(tuple(layout["row_shape"]), np.dtype(layout["dtype"]), pool)
        assert self.row_ids is not None  # set by _start
        self.row_ids[: len(ids)] = ids
