"""FramePool: single frames stored once each, shared by every row that holds them.

A frame-stacked transition repeats each frame up to 2k times (k frames in obs,
k in new_obs, each frame sliding through k consecutive stacks). The pool keeps
one copy per distinct live frame, `[pool_capacity, *frame_shape]`, with a
reference count per slot; the rows hold slot ids instead of frames.

    m = pool.match(frames)        # each frame's slot (hash, then full-content check); no writes
    pool.reserve(m, released)     # grow if needed: everything that may fail, before writing
    pool.commit(m, released)      # count references, store the frames that found no equal
    pool.release(slot_ids)        # a slot reaching 0 references goes back to the free list

A hash collision only costs memory (the frame is stored again): the content a slot
id stands for is always exactly the frame that was committed. How `match` works
without a Python loop per frame, and the index's rules: docs/replay.md.
"""

from __future__ import annotations

import collections
import itertools
import math
import sys
from typing import NamedTuple

import numpy as np

HASH_WORDS = 128  # words sampled per frame for its hash (all of them if fewer)
LEADER_ROUNDS = 4  # rounds of in-batch matching among hash collisions, then alone
COMPARE_ROWS = 256  # frames compared per chunk (256 84x84 frames: 1.8 MB per side)
GROWTH = 1.25  # pool capacity factor when no free slot is left
_MULTIPLIERS = np.random.default_rng(0x5EED).integers(1, 2**63, HASH_WORDS, np.uint64) | np.uint64(
    1
)  # odd: a multiply by one is a bijection on words
_SAMPLES: dict[int, np.ndarray] = {}  # words per frame -> sampled word positions


def word_view(frames: np.ndarray) -> np.ndarray:
    """<uint>[M, W]: the bytes of contiguous frames [M, ...] read as the widest
    unsigned words that divide a frame's size (bit-exact: NaN equals NaN)."""
    flat = frames.reshape(len(frames), -1).view(np.uint8)
    width = next(w for w in (8, 4, 2, 1) if flat.shape[1] % w == 0)
    return flat.view(f"<u{width}")


def sampled_positions(num_words: int) -> np.ndarray:
    """HASH_WORDS word positions spread evenly over a frame (all if fewer)."""
    positions = _SAMPLES.get(num_words)
    if positions is None:
        positions = np.unique(
            np.linspace(0, num_words - 1, min(num_words, HASH_WORDS)).round().astype(np.intp)
        )
        _SAMPLES[num_words] = positions
    return positions


def frame_hashes(words: np.ndarray) -> np.ndarray:
    """<uint64>[M] from a fixed sample of each frame's words (words: word_view)."""
    positions = sampled_positions(words.shape[1])
    sampled = words[:, positions].astype(np.uint64) * _MULTIPLIERS[: len(positions)]
    sampled ^= sampled >> np.uint64(29)  # mix the high bits into the sum's low ones
    return sampled.sum(axis=1, dtype=np.uint64)


def rows_equal(a: np.ndarray, a_rows: np.ndarray, b: np.ndarray, b_rows: np.ndarray) -> np.ndarray:
    """<bool>[len(a_rows)]: a[a_rows[i]] == b[b_rows[i]] word for word, in chunks of
    COMPARE_ROWS so the gathered rows stay in cache instead of in fresh pages."""
    equal = np.empty(len(a_rows), bool)
    for low in range(0, len(a_rows), COMPARE_ROWS):
        high = low + COMPARE_ROWS
        equal[low:high] = (a[a_rows[low:high]] == b[b_rows[low:high]]).all(axis=1)
    return equal


def batch_leaders(words: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """<intp>[M]: for each frame, the first frame of the batch with the same content
    found by hash (itself when none; rounds among collisions, then itself)."""
    m = len(words)
    leader = np.arange(m)
    pending = leader
    for _ in range(LEADER_ROUNDS):
        if len(pending) < 2:
            break
        _, first, inverse = np.unique(hashes[pending], return_index=True, return_inverse=True)
        candidate = pending[first[inverse.reshape(-1)]]
        others = np.flatnonzero(candidate != pending)
        if not len(others):
            break
        same = rows_equal(words, pending[others], words, candidate[others])
        leader[pending[others[same]]] = candidate[others[same]]
        pending = pending[others[~same]]
    return leader


class FrameMatch(NamedTuple):
    """FramePool.match's answer: per distinct frame (leader) its slot (-1: new) and
    how many of the frames it stands for."""

    frames: np.ndarray  # [M, *frame_shape], as given
    hashes: np.ndarray  # <uint64>[M]
    leaders: np.ndarray  # <intp>[L] the first frame of each distinct content
    leader_of: np.ndarray  # <intp>[M] each frame's position in leaders
    uses: np.ndarray  # <int64>[L] frames per leader
    slots: np.ndarray  # <int64>[L] the live slot holding it, -1 if new


def _lookup(index: dict, keys: list) -> np.ndarray:
    """<int64>[len(keys)]: index[key], -1 where absent (C-level map, no Python loop)."""
    return np.fromiter(map(index.get, keys, itertools.repeat(-1)), np.int64, len(keys))


class FramePool:
    """Distinct frames with reference counts, a free list and a hash index.

    frame_shape, dtype: of one frame. capacity: slots allocated at first;
    max_capacity: the pool never grows beyond it (the most frames the rows can
    hold at once).
    """

    def __init__(self, frame_shape: tuple, dtype, capacity: int, max_capacity: int) -> None:
        self.frame_shape, self.dtype = tuple(frame_shape), np.dtype(dtype)
        self.max_capacity = max(1, int(max_capacity))
        self.index: dict[int, int] = {}  # hash -> newest live slot with that hash
        self._allocate(max(1, min(int(capacity), self.max_capacity)))

    def _allocate(self, capacity: int) -> None:
        self.frames = np.empty((capacity, *self.frame_shape), self.dtype)
        self.words = word_view(self.frames)
        self.refcounts = np.zeros(capacity, np.int64)
        self.hashes = np.zeros(capacity, np.uint64)
        self.free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack: top last
        self.num_free = capacity

    @property
    def capacity(self) -> int:
        return len(self.frames)

    @property
    def num_live(self) -> int:
        """Distinct frames held (slots with a reference)."""
        return self.capacity - self.num_free

    @property
    def nbytes(self) -> int:
        """Allocated arrays, and the hash index's dict with its int keys and values."""
        arrays = sum(a.nbytes for a in (self.frames, self.refcounts, self.hashes, self.free))
        # per entry: a 64-bit hash as a Python int (36 bytes) and a slot int (28)
        return arrays + sys.getsizeof(self.index) + 64 * len(self.index)

    # ---- adding and dropping references ------------------------------------------

    def match(self, frames: np.ndarray) -> FrameMatch:
        """Which frames of `frames` [M, *frame_shape] (contiguous) are already live, and
        which are new (one leader per distinct content); changes nothing, so a caller
        can reserve room and write its other columns before `commit`."""
        words = word_view(frames)
        hashes = frame_hashes(words)
        leader = batch_leaders(words, hashes)
        leaders = np.flatnonzero(leader == np.arange(len(frames)))
        leader_of = np.searchsorted(leaders, leader)  # each frame's position in leaders
        slots = _lookup(self.index, hashes[leaders].tolist())
        hit = np.flatnonzero(slots >= 0)
        if len(hit):
            slots[hit[~rows_equal(self.words, slots[hit], words, leaders[hit])]] = -1
        return FrameMatch(
            frames,
            hashes,
            leaders,
            leader_of,
            np.bincount(leader_of, minlength=len(leaders)),
            slots,
        )

    def reserve(self, match: FrameMatch, released: np.ndarray) -> None:
        """Grows the pool now if `commit(match, released)` will need more free slots
        than it has: new frames beyond those the released references free."""
        new = int(np.count_nonzero(match.slots < 0))
        if new <= self.num_free:
            return
        used, counts = np.unique(released, return_counts=True)
        left = self.refcounts[used] - counts  # references after the commit, hits aside
        hit = match.slots >= 0
        at = np.searchsorted(used, match.slots[hit])
        found = at < len(used)
        found[found] = used[at[found]] == match.slots[hit][found]
        np.add.at(left, at[found], match.uses[hit][found])
        freed = int(np.count_nonzero(left == 0))
        if new > self.num_free + freed:
            self._grow(self.num_live - freed + new)

    def commit(self, match: FrameMatch, released: np.ndarray | None = None) -> np.ndarray:
        """<int64>[M] the slot of each matched frame, each counted as one more
        reference; `released` (slots, one reference each) are dropped after the live
        frames are counted and before new ones are stored, so the pool never holds
        more than the rows reference."""
        slots = match.slots.copy()
        hit = np.flatnonzero(slots >= 0)
        np.add.at(self.refcounts, slots[hit], match.uses[hit])  # two leaders may share one
        if released is not None and len(released):
            self.release(released)
        new = np.flatnonzero(slots < 0)
        if len(new):
            leaders = match.leaders[new]
            slots[new] = self._store(match.frames[leaders], match.hashes[leaders])
            self.refcounts[slots[new]] = match.uses[new]
        return slots[match.leader_of]

    def _store(self, frames: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        if self.num_free < len(frames):
            self._grow(self.num_live + len(frames))
        slots = self.free[self.num_free - len(frames) : self.num_free][::-1].copy()
        self.num_free -= len(frames)
        self.frames[slots] = frames
        self.hashes[slots] = hashes
        self.index.update(zip(hashes.tolist(), slots.tolist()))
        return slots

    def _grow(self, needed: int) -> None:
        old = self.capacity
        capacity = min(self.max_capacity, max(needed, math.ceil(old * GROWTH)))
        if capacity < needed:
            raise RuntimeError(
                f"frame pool: {needed} frames live, more than the "
                f"{self.max_capacity} its rows can hold"
            )
        frames, refcounts, hashes = self.frames, self.refcounts, self.hashes
        free = self.free[: self.num_free]
        self._allocate(capacity)
        self.frames[:old], self.refcounts[:old], self.hashes[:old] = frames, refcounts, hashes
        del frames
        self.num_free = capacity - old + len(free)
        self.free[: capacity - old] = np.arange(capacity - 1, old - 1, -1)  # beneath the rest
        self.free[capacity - old : self.num_free] = free

    def release(self, slots: np.ndarray) -> None:
        """One reference fewer per entry of `slots`; slots left with none are freed."""
        used, counts = np.unique(slots, return_counts=True)
        self.refcounts[used] -= counts
        dead = used[self.refcounts[used] == 0]
        if len(dead):
            keys = self.hashes[dead]
            indexed = _lookup(self.index, keys.tolist()) == dead
            collections.deque(map(self.index.pop, keys[indexed].tolist()), maxlen=0)
            self.free[self.num_free : self.num_free + len(dead)] = dead[::-1]
            self.num_free += len(dead)

    def take(self, slots: np.ndarray) -> np.ndarray:
        """The frames at `slots` (any shape S): [*S, *frame_shape], a copy."""
        return self.frames.take(slots, 0)

    # ---- compaction and state ----------------------------------------------------

    def indexed(self) -> np.ndarray:
        """<bool>[capacity]: whether the hash index points at each slot."""
        return _lookup(self.index, self.hashes.tolist()) == np.arange(self.capacity)

    def compact(self) -> np.ndarray:
        """Moves the live frames into slots [0, num_live) (only those above it move,
        into the holes below it, in order); returns <int64>[capacity] old slot ->
        new slot for the caller's ids. The free list restarts at num_live."""
        live = self.refcounts > 0
        num_live = int(np.count_nonzero(live))
        holes = np.flatnonzero(~live[:num_live])
        movers = np.flatnonzero(live[num_live:]) + num_live
        remap = np.arange(self.capacity, dtype=np.int64)
        if len(movers):
            keys = self.hashes[movers]
            indexed = _lookup(self.index, keys.tolist()) == movers
            for low in range(0, len(movers), 4096):  # bounded temporaries
                src, dst = movers[low : low + 4096], holes[low : low + 4096]
                self.frames[dst] = self.frames[src]
            self.hashes[holes], self.refcounts[holes] = keys, self.refcounts[movers]
            self.index.update(zip(keys[indexed].tolist(), holes[indexed].tolist()))
            remap[movers] = holes
        self.refcounts[num_live:] = 0
        self.free[: self.capacity - num_live] = np.arange(self.capacity - 1, num_live - 1, -1)
        self.num_free = self.capacity - num_live
        return remap

    @classmethod
    def from_frames(
        cls,
        frames: np.ndarray,
        refcounts: np.ndarray,
        indexed: np.ndarray,
        capacity: int,
        max_capacity: int,
    ) -> FramePool:
        """A pool holding `frames` in slots [0, len) with these reference counts (all
        > 0), the slots marked `indexed` in the hash index: what compact() left."""
        pool = cls(frames.shape[1:], frames.dtype, max(capacity, len(frames)), max_capacity)
        live = len(frames)
        pool.frames[:live] = frames
        pool.refcounts[:live] = refcounts
        pool.hashes[:live] = frame_hashes(word_view(pool.frames[:live]))
        kept = np.flatnonzero(indexed)
        pool.index = dict(zip(pool.hashes[kept].tolist(), kept.tolist()))
        pool.num_free = pool.capacity - live
        pool.free[: pool.num_free] = np.arange(pool.capacity - 1, live - 1, -1)
        return pool
