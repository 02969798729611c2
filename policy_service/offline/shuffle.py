"""Chunks of rows in, batches of exactly N rows out (the last may be short), drawn at
random from a buffer of `shuffle_buffer_size` rows when one is asked for.

Rows are dicts of leaf -> rows (arrays, or lists for infos). The buffer holds at most
shuffle_buffer_size + one chunk + N rows, so memory stays bounded however much is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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


def rebatch(
    chunks: Iterable[Rows],
    batch_size: int,
    shuffle_buffer_size: int = 0,
    rng: np.random.Generator | None = None,
) -> Iterator[Rows]:
    """Batches of `batch_size` rows from `chunks`: in order with no shuffle buffer; else
    each batch drawn uniformly from the rows buffered (at least shuffle_buffer_size of
    them until the input ends)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if shuffle_buffer_size < 0:
        raise ValueError(f"shuffle_buffer_size must be >= 0, got {shuffle_buffer_size}")
    rng = rng if rng is not None else np.random.default_rng()
    buffer: list[Rows] = []
    held = 0
    for chunk in chunks:
        count = _count(chunk)
        if not count:
            continue
        buffer.append(chunk)
        held += count
        if held < shuffle_buffer_size + batch_size:
            continue
        rows = _concat(buffer)
        if shuffle_buffer_size:
            rows = _take(rows, rng.permutation(held))
        ready = (held - shuffle_buffer_size) // batch_size * batch_size
        for start in range(0, ready, batch_size):
            yield _take(rows, slice(start, start + batch_size))
        buffer = [_take(rows, slice(ready, held))]
        held -= ready
    if held:
        rows = _concat(buffer)
        if shuffle_buffer_size:
            rows = _take(rows, rng.permutation(held))
        for start in range(0, held, batch_size):
            yield _take(rows, slice(start, min(start + batch_size, held)))
