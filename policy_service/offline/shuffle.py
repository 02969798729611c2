"""Chunks of rows in, batches of exactly N rows out (the last may be short), drawn at
random from a buffer of `shuffle_buffer_size` rows when one is asked for.

Rows are dicts of leaf -> rows (arrays, or lists for infos). The buffer holds at most
shuffle_buffer_size + one chunk + N rows, so memory stays bounded however much is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Rows = dict[Any, Any]


def _count(rows: Rows) -> int:
    return len(next(iter(rows.values()))) if rows else 0


def _concat(parts: list[Rows]) -> Rows:
    if len(parts) == 1:
        return parts[0]
    out: Rows = {}
    for key in parts[0]:
        leaves = [p[key] for p in parts]
        if isinstance(leaves[0], list):
            out[key] = [x for leaf in leaves for x in leaf]
        else:
            out[key] = np.concatenate(leaves)
    return out


def _take(rows: Rows, index: np.ndarray | slice) -> Rows:
    out = {}
    for key, leaf in rows.items():
        if isinstance(leaf, list):
            out[key] = leaf[index] if isinstance(index, slice) else [leaf[i] for i in index]
        else:
            out[key] = leaf[index]
    return out


class ShuffleBuffer:
    """Rows in (`add`, then `drain` at the input's end), batches of `batch_size` rows
    out (`ready`, in order): in order with no shuffle buffer; else each batch drawn
    uniformly from the rows buffered (at least shuffle_buffer_size of them until the
    input ends). Everything it holds is in `ready` and `held_rows()`, so a read can stop
    between two batches and go on from a copy (`restore`)."""

    def __init__(
        self,
        batch_size: int,
        shuffle_buffer_size: int = 0,
        rng: np.random.Generator | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if shuffle_buffer_size < 0:
            raise ValueError(f"shuffle_buffer_size must be >= 0, got {shuffle_buffer_size}")
        self.batch_size = batch_size
        self.shuffle_buffer_size = shuffle_buffer_size
        self.rng = rng if rng is not None else np.random.default_rng()
        self.ready: list[Rows] = []  # batches made, not yet handed out
        self._buffer: list[Rows] = []
        self._held = 0

    def add(self, chunk: Rows) -> None:
        count = _count(chunk)
        if not count:
            return
        self._buffer.append(chunk)
        self._held += count
        if self._held >= self.shuffle_buffer_size + self.batch_size:
            ready = (self._held - self.shuffle_buffer_size) // self.batch_size * self.batch_size
            self._split(ready)

    def drain(self) -> None:
        """The input ended: every row held goes out (the last batch may be short)."""
        if self._held:
            self._split(self._held)

    def _split(self, ready: int) -> None:
        if not self.shuffle_buffer_size:
            self._split_in_order(ready)
            return
        rows = _take(_concat(self._buffer), self.rng.permutation(self._held))
        for start in range(0, ready, self.batch_size):
            self.ready.append(_take(rows, slice(start, min(start + self.batch_size, ready))))
        self._buffer = [_take(rows, slice(ready, self._held))] if ready < self._held else []
        self._held -= ready

    def _split_in_order(self, ready: int) -> None:
        """The first `ready` rows held into batches, in order: a batch inside one chunk
        is a view of it, only one that spans chunks a copy (concatenating all that is
        held would copy every row once a chunk ends off a batch's edge)."""
        parts = self._buffer
        for start in range(0, ready, self.batch_size):
            size, pieces = min(self.batch_size, ready - start), []
            while size:
                count = _count(parts[0])
                if count <= size:
                    pieces.append(parts.pop(0))
                else:
                    pieces.append(_take(parts[0], slice(0, size)))
                    parts[0] = _take(parts[0], slice(size, count))
                size -= min(count, size)
            self.ready.append(_concat(pieces))
        self._held -= ready

    def held_rows(self) -> Rows | None:
        """The rows buffered and not yet in a batch (None: none)."""
        return _concat(self._buffer) if self._held else None

    def restore(self, ready: list[Rows], held: Rows | None) -> None:
        """Hold what `ready` and `held_rows()` of another buffer held."""
        self.ready = list(ready)
        self._buffer = [] if held is None else [held]
        self._held = _count(held) if held is not None else 0
