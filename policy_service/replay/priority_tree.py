"""PriorityTree: sums and minima of slot priorities, for proportional sampling.

A `fanout`-ary tree over `capacity` leaves (PER's sum tree, Schaul et al.
2016, with fanout 2). Level 0 holds the leaves <float32>[capacity padded];
level l+1 holds the sums <float64> (and minima <float32>) of groups of
`fanout` nodes of level l, up to one root. A wider tree has fewer levels (5
instead of 20 for 1M slots at fanout 16) and its inner nodes take
1/(fanout-1) of the leaves' count, so the sums and minima add ~1 byte per
slot. Every operation works on a whole batch of slots level by level:

  update(slots, values)   leaves, then each level's parents of those slots
  find(prefixes)          for each prefix in [0, total): the slot whose
                          interval [sum of earlier leaves, that + its leaf)
                          holds it, descending all prefixes together

Zero leaves (empty slots) are never found and do not count in the minimum.
Sums are recomputed from the children, never adjusted by differences, so
rounding does not accumulate over millions of updates.
"""

from __future__ import annotations

import numpy as np


class PriorityTree:
    """Sum and min tree over `capacity` non-negative float32 leaves."""

    def __init__(self, capacity: int, fanout: int = 16) -> None:
        if capacity < 1 or fanout < 2:
            raise ValueError(
                f"PriorityTree: capacity >= 1 and fanout >= 2 needed, got {capacity}, {fanout}"
            )
        self.capacity, self.fanout = int(capacity), int(fanout)
        widths = [-(-self.capacity // fanout) * fanout]  # level 0 padded to whole groups
        while widths[-1] > 1:
            nodes = widths[-1] // fanout
            widths.append(nodes if nodes == 1 else -(-nodes // fanout) * fanout)
        self.leaves = np.zeros(widths[0], np.float32)
        # sums[l] / mins[l] are level l; level 0 is the leaves themselves
        self.sums = [self.leaves] + [np.zeros(w, np.float64) for w in widths[1:]]
        self.mins = [self.leaves] + [np.full(w, np.inf, np.float32) for w in widths[1:]]

    @property
    def total(self) -> float:
        return float(self.sums[-1][0])

    @property
    def min(self) -> float:
        """The smallest positive leaf (inf when every leaf is 0)."""
        return float(self.mins[-1][0])

    @property
    def nbytes(self) -> int:
        return self.leaves.nbytes + sum(a.nbytes for a in self.sums[1:] + self.mins[1:])

    def _children(self, level: int, nodes: np.ndarray | slice | None):
        """Sums and minima of the children of `nodes` (indexes or a slice) of
        `level` (all nodes: None)."""
        sums = self.sums[level - 1].reshape(-1, self.fanout)
        mins = self.mins[level - 1].reshape(-1, self.fanout)
        if nodes is not None:
            sums, mins = sums[nodes], mins[nodes]
        if level == 1:  # leaves: 0 means empty, not a minimum
            mins = np.where(mins > 0, mins, np.float32(np.inf))
        return sums.sum(axis=1, dtype=np.float64), mins.min(axis=1)

    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        """leaves[slots] = values (>= 0, float32), then their ancestors. Duplicate
        slots: the last value wins, as in numpy assignment."""
        self.leaves[slots] = values
        nodes = np.asarray(slots, np.int64)
        for level in range(1, len(self.sums)):
            nodes = nodes // self.fanout
            if len(nodes) * 4 >= len(self.sums[level]):  # most of the level: redo it whole
                self._redo_level(level)
                nodes = np.arange(len(self.sums[level - 1]) // self.fanout, dtype=np.int64)
            else:
                self.sums[level][nodes], self.mins[level][nodes] = self._children(level, nodes)

    def set_range(self, start: int, values: np.ndarray) -> None:
        """leaves[start:start + len(values)] = values, wrapping at the capacity: the
        slots `add` writes. Slices instead of gathers, so an insert is cheap."""
        values = np.asarray(values, np.float32)
        if values.ndim == 0:
            raise ValueError("PriorityTree.set_range: values must be a 1-D array")
        head = min(len(values), self.capacity - start)
        self._set_slice(start, values[:head])
        if head < len(values):
            self._set_slice(0, values[head:])

    def _set_slice(self, start: int, values: np.ndarray) -> None:
        low, high = start, start + len(values)
        self.leaves[low:high] = values
        for level in range(1, len(self.sums)):
            low, high = low // self.fanout, (high - 1) // self.fanout + 1
            sums, mins = self._children(level, slice(low, high))
            self.sums[level][low:high], self.mins[level][low:high] = sums, mins

    def rebuild(self) -> None:
        """Recomputes every inner level from the leaves."""
        for level in range(1, len(self.sums)):
            self._redo_level(level)

    def _redo_level(self, level: int) -> None:
        sums, mins = self._children(level, None)
        self.sums[level][: len(sums)], self.mins[level][: len(mins)] = sums, mins

    def find(self, prefixes: np.ndarray) -> np.ndarray:
        """<int64>[n] slots holding `prefixes` <float64>[n] in [0, total).

        A prefix at or above the total (rounding) gives the last non-empty slot
        of the subtree it reached, so an empty slot is never returned.
        """
        prefixes = np.array(prefixes, np.float64)  # a copy: consumed below
        nodes = np.zeros(len(prefixes), np.int64)
        rows = np.arange(len(prefixes))
        for level in range(len(self.sums) - 1, 0, -1):
            children = self.sums[level - 1].reshape(-1, self.fanout)[nodes]
            cumulative = np.cumsum(children, axis=1, dtype=np.float64)
            beyond = cumulative > prefixes[:, None]
            child = beyond.argmax(axis=1)
            if np.count_nonzero(beyond[:, -1]) < len(child):  # a prefix past the children
                overflow = ~beyond[:, -1]
                positive = children[overflow] > 0
                child[overflow] = self.fanout - 1 - positive[:, ::-1].argmax(axis=1)
            before = np.where(child > 0, cumulative[rows, child - 1], 0.0)
            prefixes -= before
            nodes = nodes * self.fanout + child
        return nodes
