"""Replay buffer throughput and memory beside a plain-numpy ceiling.

CartPole-shaped and Atari-shaped (frame-stacked 84x84x4) transitions at capacity 1M,
uniform and prioritized, batch 32 and 512: insert, sample and update_priorities in
transitions per second, "vs_ceiling" = ours / ceiling (goal >= 0.8), and bytes held
over bytes stored (goal <= 1.1). Frames are stored once each ("pool", default) or
whole (`--frames-storage whole`, at 50k).

    python -m benchmarks.replay            # ~20 min (each child fills two 1M buffers)
    python -m benchmarks.replay --smoke
    python -m benchmarks.replay --shapes frames --frames-capacity 20000 --bursts 1
    python -m benchmarks.replay --shapes cartpole --kinds uniform --ops insert --batches 32

The shapes, the stream, the ceiling and the memory figures, exactly, and the
latest results: benchmarks/history/methods.md ("What each script measures") and
off_policy.md ("Replay buffers").
"""

from __future__ import annotations

import sys
import time

from benchmarks import harness, plots, stats

NAME = "replay"
VALUE = "transitions_per_s"
KEYS = ("shape", "kind", "op", "batch", "impl")
WORKLOAD = "replay buffers: CartPole and 84x84x4 frame-stacked streams"
FRAME_SHAPE = (84, 84, 4)
ISSUE_CAPACITY = 1_000_000  # what the issue asks for, for both shapes
WHOLE_FRAMES_CAPACITY = 50_000  # obs + new_obs stored whole: what fits twice in 24 GiB
SUB_ENVS = 8  # sub-envs interleaved in each frames batch
EPISODE_STEPS = (200, 400)  # frames episodes' lengths, drawn uniformly
SCALARS = ("actions", "rewards", "terminateds", "truncateds", "eps_id")


# ----- data ------------------------------------------------------------------------


def make_batch(shape: str, rows: int, rng):
    """Random columns of `rows` transitions (CartPole shape; frames: see FrameStream)."""
    import numpy as np

    if shape == "cartpole":
        obs = rng.normal(size=(rows, 4)).astype(np.float32)
        new_obs = rng.normal(size=(rows, 4)).astype(np.float32)
    else:
        obs = rng.integers(0, 256, (rows, *FRAME_SHAPE), dtype=np.uint8)
        new_obs = rng.integers(0, 256, (rows, *FRAME_SHAPE), dtype=np.uint8)
    return {
        "obs": obs,
        "new_obs": new_obs,
        "actions": rng.integers(0, 2, rows),
        "rewards": rng.random(rows, dtype=np.float32),
        "terminateds": rng.random(rows) < 0.02,
        "truncateds": np.zeros(rows, bool),
        "eps_id": np.repeat(np.arange(rows // 20 + 1), 20)[:rows].astype(np.int64),
    }


class FrameStream:
    """Batches of `rows` frame-stacked transitions from SUB_ENVS sub-envs, each a
    fragment of rows / SUB_ENVS consecutive steps (stack k = FRAME_SHAPE[-1] on the
    last axis); episodes of EPISODE_STEPS steps start from the reset frame repeated
    k times; every step draws a new random frame; new_obs is the next stack."""

    def __init__(self, rows: int, seed: int):
        import numpy as np

        self.np, self.rng = np, np.random.default_rng(seed)
        self.envs = min(SUB_ENVS, rows)
        self.fragment = rows // self.envs
        self.rows = self.envs * self.fragment
        k = FRAME_SHAPE[-1]
        self.stacks = [None] * self.envs  # each env's last k frames [k, 84, 84]
        self.left = [0] * self.envs  # steps left in each env's episode
        self.episode = list(range(self.envs))
        self.next_episode = self.envs
        self.k = k

    def frames(self, n: int):
        return self.rng.integers(0, 256, (n, *FRAME_SHAPE[:-1]), dtype=self.np.uint8)

    def __call__(self) -> dict:
        np = self.np
        obs = np.empty((self.rows, *FRAME_SHAPE), np.uint8)
        new_obs = np.empty_like(obs)
        terminateds = np.zeros(self.rows, bool)
        eps_id = np.empty(self.rows, np.int64)
        row = 0
        for env in range(self.envs):
            done = 0
            while done < self.fragment:
                if self.left[env] == 0:  # reset: the stack is the first frame k times
                    self.stacks[env] = np.repeat(self.frames(1), self.k, 0)
                    self.left[env] = int(self.rng.integers(*EPISODE_STEPS))
                    self.episode[env], self.next_episode = self.next_episode, self.next_episode + 1
                m = min(self.fragment - done, self.left[env])
                seq = np.concatenate([self.stacks[env], self.frames(m)])  # [k + m, 84, 84]
                for j in range(self.k):  # frame j of each stack; new_obs: one step on
                    obs[row : row + m, ..., j] = seq[j : j + m]
                    new_obs[row : row + m, ..., j] = seq[j + 1 : j + 1 + m]
                self.stacks[env] = seq[m:]
                self.left[env] -= m
                terminateds[row + m - 1] = self.left[env] == 0
                eps_id[row : row + m] = self.episode[env]
                row, done = row + m, done + m
        return {
            "obs": obs,
            "new_obs": new_obs,
            "actions": self.rng.integers(0, 2, self.rows),
            "rewards": self.rng.random(self.rows, dtype=np.float32),
            "terminateds": terminateds,
            "truncateds": np.zeros(self.rows, bool),
            "eps_id": eps_id,
        }


def batches(shape: str, rows: int, rng, seed: int):
    """A callable giving the next batch: a new stretch of the frame stream for
    frames, one of 4 random batches in turn for CartPole."""
    if shape == "frames":
        return FrameStream(rows, seed)
    data = [make_batch(shape, rows, rng) for _ in range(4)]
    turn = [0]

    def next_batch():
        turn[0] = (turn[0] + 1) % 4
        return data[turn[0]]

    return next_batch


def row_bytes(batch: dict) -> int:
    return sum(v.itemsize * (v.size // len(v)) for v in batch.values())


def rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----- the ceiling: the same arithmetic, bare numpy ----------------------------------


class Ceiling:
    """Preallocated columns and the same fanout sum/min tree, written inline."""

    def __init__(
        self,
        capacity: int,
        first: dict,
        prioritized: bool,
        fanout: int = 16,
        alpha: float = 0.6,
        beta: float = 0.4,
        seed: int = 0,
    ):
        import numpy as np

        self.np = np
        self.capacity, self.k, self.alpha, self.beta = capacity, fanout, alpha, beta
        self.columns = {c: np.empty((capacity, *v.shape[1:]), v.dtype) for c, v in first.items()}
        self.pos, self.size, self.rng = 0, 0, np.random.default_rng(seed)
        self.prioritized = prioritized
        if prioritized:
            widths = [-(-capacity // fanout) * fanout]
            while widths[-1] > 1:
                nodes = widths[-1] // fanout
                widths.append(nodes if nodes == 1 else -(-nodes // fanout) * fanout)
            self.leaves = np.zeros(widths[0], np.float32)
            self.sums = [self.leaves] + [np.zeros(w) for w in widths[1:]]
            self.mins = [self.leaves] + [np.full(w, np.inf, np.float32) for w in widths[1:]]

    @property
    def nbytes(self) -> int:
        held = sum(a.nbytes for a in self.columns.values())
        if self.prioritized:
            held += self.leaves.nbytes + sum(a.nbytes for a in self.sums[1:] + self.mins[1:])
        return held

    def _parents(self, level, nodes):
        np, k = self.np, self.k
        sums = self.sums[level - 1].reshape(-1, k)
        mins = self.mins[level - 1].reshape(-1, k)
        if nodes is not None:
            sums, mins = sums[nodes], mins[nodes]
        if level == 1:
            mins = np.where(mins > 0, mins, np.float32(np.inf))
        return sums.sum(axis=1, dtype=np.float64), mins.min(axis=1)

    def _set(self, slots, values):
        self.leaves[slots] = values
        nodes = slots
        for level in range(1, len(self.sums)):
            nodes = nodes // self.k
            if len(nodes) * 4 >= len(self.sums[level]):  # most of the level: all of it
                count = len(self.sums[level - 1]) // self.k
                self.sums[level][:count], self.mins[level][:count] = self._parents(level, None)
                nodes = self.np.arange(count)
            else:
                self.sums[level][nodes], self.mins[level][nodes] = self._parents(level, nodes)

    def _set_slice(self, low, high, value):
        self.leaves[low:high] = value
        for level in range(1, len(self.sums)):
            low, high = low // self.k, (high - 1) // self.k + 1
            sums, mins = self._parents(level, slice(low, high))
            self.sums[level][low:high], self.mins[level][low:high] = sums, mins

    def add(self, batch: dict):
        np = self.np
        n = len(batch["actions"])
        start = self.pos
        head = min(n, self.capacity - start)
        if head == n:  # no wrap: whole columns, no slice views
            for c, stored in self.columns.items():
                stored[start : start + n] = batch[c]
        else:
            for c, stored in self.columns.items():
                stored[start : start + head] = batch[c][:head]
                stored[: n - head] = batch[c][head:]
        self.pos = (start + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        if self.prioritized:
            self._set_slice(start, start + head, np.float32(1.0))
            if head < n:
                self._set_slice(0, n - head, np.float32(1.0))

    def sample(self, n: int) -> dict:
        np = self.np
        if not self.prioritized:
            idx = self.rng.integers(0, self.size, n)
            out = {c: a.take(idx, 0) for c, a in self.columns.items()}
            out["batch_indexes"] = idx
            return out
        prefix = self.rng.random(n) * self.sums[-1][0]
        node, rows = np.zeros(n, np.int64), np.arange(n)
        for level in range(len(self.sums) - 1, 0, -1):
            children = self.sums[level - 1].reshape(-1, self.k)[node]
            cum = np.cumsum(children, axis=1, dtype=np.float64)
            child = (cum > prefix[:, None]).argmax(axis=1)
            prefix -= np.where(child > 0, cum[rows, child - 1], 0.0)
            node = node * self.k + child
        weights = (self.leaves[node].astype(np.float64) / self.mins[-1][0]) ** -self.beta
        out = {c: a.take(node, 0) for c, a in self.columns.items()}
        out["batch_indexes"], out["weights"] = node, weights.astype(np.float32)
        return out

    def update_priorities(self, idx, td):
        self._set(idx, ((self.np.abs(td) + 1e-6) ** self.alpha).astype(self.np.float32))


class FramePoolCeiling(Ceiling):
    """Ceiling's columns and tree for the scalars; obs/new_obs [n, 84, 84, k] as 2k
    int32 frame ids per row into a pool of single frames, written inline: the
    same word hash, in-batch leaders, dict lookups through map, full-content
    verification, reference counts, free stack and geometric growth as FramePool
    and FrameStackStore, without their checks and method layers."""

    def __init__(self, capacity: int, first: dict, prioritized: bool, **kwargs):
        import numpy as np

        super().__init__(capacity, {c: first[c] for c in SCALARS}, prioritized, **kwargs)
        self.stack = first["obs"].shape[-1]
        self.frame_shape = first["obs"].shape[1:-1]
        self.ids = np.zeros((capacity, 2 * self.stack), np.int32)
        self.index = {}
        self._allocate(capacity + capacity // 16 + 2 * self.stack)

    def _allocate(self, slots: int, keep: int = 0):
        from policy_service.replay.frame_pool import word_view

        np = self.np
        old = (self.pool[:keep], self.refs[:keep], self.hashes[:keep]) if keep else None
        free = self.free[: self.num_free] if keep else np.zeros(0, np.int64)
        self.pool = np.empty((slots, *self.frame_shape), np.uint8)
        self.words = word_view(self.pool)
        self.refs, self.hashes = np.zeros(slots, np.int64), np.zeros(slots, np.uint64)
        self.free = np.empty(slots, np.int64)
        fresh = np.arange(slots - 1, keep - 1, -1)
        self.num_free = len(fresh) + len(free)
        self.free[: len(fresh)], self.free[len(fresh) : self.num_free] = fresh, free
        if old:
            self.pool[:keep], self.refs[:keep], self.hashes[:keep] = old

    @property
    def nbytes(self) -> int:
        import sys

        pool = sum(a.nbytes for a in (self.pool, self.refs, self.hashes, self.free, self.ids))
        return super().nbytes + pool + sys.getsizeof(self.index) + 64 * len(self.index)

    def add(self, batch: dict):
        import collections
        import itertools

        from policy_service.replay.frame_pool import (
            batch_leaders,
            frame_hashes,
            rows_equal,
            word_view,
        )

        np = self.np
        n, start, size_before = len(batch["actions"]), self.pos, self.size
        super().add(batch)
        frames = np.stack(
            [np.moveaxis(batch["obs"], -1, 1), np.moveaxis(batch["new_obs"], -1, 1)], 1
        ).reshape(-1, *self.frame_shape)
        words = word_view(frames)
        hashes = frame_hashes(words)
        leader = batch_leaders(words, hashes)
        leaders = np.flatnonzero(leader == np.arange(len(frames)))
        leader_of = np.searchsorted(leaders, leader)
        uses = np.bincount(leader_of, minlength=len(leaders))
        keys = hashes[leaders].tolist()
        slots = np.fromiter(map(self.index.get, keys, itertools.repeat(-1)), np.int64, len(keys))
        hit = np.flatnonzero(slots >= 0)
        if len(hit):
            same = rows_equal(self.words, slots[hit], words, leaders[hit])
            slots[hit[~same]] = -1
            np.add.at(self.refs, slots[hit[same]], uses[hit[same]])
        positions = (start + np.arange(n)) % self.capacity
        old = self.ids[positions[positions < size_before]].ravel()
        if len(old):  # release the overwritten rows' frames
            used, counts = np.unique(old, return_counts=True)
            self.refs[used] -= counts
            dead = used[self.refs[used] == 0]
            keys = self.hashes[dead].tolist()
            mine = (
                np.fromiter(map(self.index.get, keys, itertools.repeat(-1)), np.int64, len(keys))
                == dead
            )
            collections.deque(
                map(self.index.pop, itertools.compress(keys, mine.tolist())), maxlen=0
            )
            self.free[self.num_free : self.num_free + len(dead)] = dead[::-1]
            self.num_free += len(dead)
        new = np.flatnonzero(slots < 0)
        if len(new):
            if self.num_free < len(new):
                live = len(self.pool) - self.num_free
                self._allocate(max(live + len(new), len(self.pool) * 5 // 4), len(self.pool))
            got = self.free[self.num_free - len(new) : self.num_free][::-1].copy()
            self.num_free -= len(new)
            self.pool[got] = frames[leaders[new]]
            self.hashes[got] = hashes[leaders[new]]
            self.index.update(zip(hashes[leaders[new]].tolist(), got.tolist()))
            self.refs[got] = uses[new]
            slots[new] = got
        self.ids[positions] = slots[leader_of].reshape(n, -1)

    def sample(self, n: int) -> dict:
        np = self.np
        out = super().sample(n)
        ids = self.ids[out["batch_indexes"]]
        k = self.stack
        for column, first in (("obs", 0), ("new_obs", k)):
            stacks = np.empty((n, *self.frame_shape, k), np.uint8)
            for j in range(k):
                stacks[..., j] = self.pool.take(ids[:, first + j], 0)
            out[column] = stacks
        return out

    @property
    def num_frames(self) -> int:
        return len(self.pool) - self.num_free


# ----- measuring -------------------------------------------------------------------


def burst(fn, seconds: float, prepare=None) -> tuple[int, float]:
    """(calls, seconds) of calling fn for about `seconds`; with `prepare`, fn takes
    what prepare() returns, made before each call and outside the time counted."""
    calls, timed = 0, 0.0
    while timed < seconds:
        arg = prepare() if prepare is not None else None
        start = time.perf_counter()
        fn(arg)
        timed += time.perf_counter() - start
        calls += 1
    return calls, timed


def make_buffers(spec: dict, first: dict):
    """(ours, the ceiling) for the spec, empty."""
    from policy_service.replay import PrioritizedReplayBuffer, ReplayBuffer

    prioritized = spec["kind"] == "prioritized"
    pool = spec["shape"] == "frames" and spec.get("storage") == "pool"
    axis = -1 if pool else None
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    ours = cls(spec["capacity"], seed=0, frame_stack_axis=axis)
    ceiling = (FramePoolCeiling if pool else Ceiling)(spec["capacity"], first, prioritized)
    return ours, ceiling


def fill(buffer, next_batch, capacity: int) -> None:
    added = 0
    while added < capacity:
        batch = next_batch()
        buffer.add(batch)
        added += len(batch["actions"])


def memory_record(spec: dict, ours, ceiling, raw_row: int, rss_grown: int) -> dict:
    capacity = spec["capacity"]
    raw = capacity * raw_row
    record = {
        "bench": NAME,
        "shape": spec["shape"],
        "kind": spec["kind"],
        "op": "memory",
        "impl": "ours",
        "round": spec["round"],
        "capacity": capacity,
        "storage": spec.get("storage"),
        "raw_row_bytes": raw_row,
        "bytes_held": ours.nbytes,
        "raw_bytes": raw,
        "memory_ratio": ours.nbytes / raw,
        "ceiling_memory_ratio": ceiling.nbytes / raw,
        "rss_growth_ratio": rss_grown / raw,
    }
    frames = getattr(ours.store, "num_frames", None)
    if frames is not None:
        frame_bytes = FRAME_SHAPE[0] * FRAME_SHAPE[1]
        unique = frames * frame_bytes + capacity * (raw_row - 2 * frame_bytes * FRAME_SHAPE[2])
        record.update(
            distinct_frames=frames,
            unique_bytes=unique,
            unique_ratio=ours.nbytes / unique,
            ceiling_unique_ratio=ceiling.nbytes / unique,
            rss_growth_unique_ratio=rss_grown / unique,
        )
    return record


def measure(spec: dict):
    import numpy as np

    shape, capacity = spec["shape"], spec["capacity"]
    rng = np.random.default_rng(spec["round"])
    fill_rows = min(512, capacity)
    first = batches(shape, fill_rows, rng, spec["round"])()
    raw_row = row_bytes(first)

    rss_before = rss_bytes()
    ours, ceiling = make_buffers(spec, first)
    fill(ours, batches(shape, fill_rows, rng, spec["round"]), capacity)
    rss_grown = rss_bytes() - rss_before
    fill(ceiling, batches(shape, fill_rows, rng, spec["round"]), capacity)
    yield memory_record(spec, ours, ceiling, raw_row, rss_grown)

    ops = [op for op in spec["ops"] if op != "update" or spec["kind"] == "prioritized"]
    for batch_size in spec["batches"]:
        # the same stream for both, each from its own generator: every add brings new rows
        streams = {
            impl: batches(shape, batch_size, np.random.default_rng(batch_size), spec["round"] + 1)
            for impl in ("ours", "ceiling")
        }
        indexes = [rng.integers(0, capacity, batch_size) for _ in range(4)]
        tds = [rng.normal(size=batch_size) for _ in range(4)]
        for op in ops:
            totals = {"ours": [0, 0.0], "ceiling": [0, 0.0]}
            for _ in range(spec["bursts"]):
                for impl, target in (("ours", ours), ("ceiling", ceiling)):
                    turn = [0]
                    if op == "insert":
                        call, prepare = target.add, streams[impl]
                    elif op == "sample":
                        call, prepare = (lambda _, t=target, n=batch_size: t.sample(n)), None
                    else:

                        def call(_, target=target, turn=turn, indexes=indexes, tds=tds):
                            turn[0] = (turn[0] + 1) % 4
                            target.update_priorities(indexes[turn[0]], tds[turn[0]])

                        prepare = None
                    call(prepare() if prepare else None)  # warm-up
                    calls, seconds = burst(call, spec["burst_s"], prepare)
                    totals[impl][0] += calls
                    totals[impl][1] += seconds
            for impl, (calls, seconds) in totals.items():
                yield {
                    "bench": NAME,
                    "shape": shape,
                    "kind": spec["kind"],
                    "op": op,
                    "batch": batch_size,
                    "impl": impl,
                    "round": spec["round"],
                    "capacity": capacity,
                    "storage": spec.get("storage"),
                    "calls": calls,
                    "seconds": seconds,
                    "calls_per_s": calls / seconds,
                    VALUE: calls * batch_size / seconds,
                }


# ----- parent ----------------------------------------------------------------------


def configurations(args) -> list[dict]:
    batches = [int(b) for b in args.batches.split(",")]
    frames_default = ISSUE_CAPACITY if args.frames_storage == "pool" else WHOLE_FRAMES_CAPACITY
    capacities = {
        "cartpole": 2000 if args.smoke else args.cartpole_capacity,
        "frames": 600 if args.smoke else args.frames_capacity or frames_default,
    }
    return [
        dict(
            shape=shape,
            kind=kind,
            capacity=capacities[shape],
            batches=batches,
            storage=args.frames_storage if shape == "frames" else "whole",
            ops=args.ops.split(","),
            bursts=1 if args.smoke else args.bursts,
            burst_s=0.02 if args.smoke else args.burst_s,
            prepare_tf=False,
        )
        for shape in args.shapes.split(",")
        for kind in args.kinds.split(",")
    ]


def capacity_reason(shape: str, capacity: int, storage: str = "whole") -> str:
    """ "<shape> at capacity N", how frames are stored, and why when below the issue's 1M."""
    text = f"{shape} at capacity {capacity:,}"
    whole_gb = ISSUE_CAPACITY * (2 * FRAME_SHAPE[0] * FRAME_SHAPE[1] * FRAME_SHAPE[2] + 22) / 1e9
    if shape == "frames" and storage == "pool":
        text += (
            f", frame pool (each distinct 84x84 frame once, ~7 KB per transition; "
            f"obs + new_obs whole would be {whole_gb:.1f} GB at {ISSUE_CAPACITY:,})"
        )
    if capacity < ISSUE_CAPACITY and shape == "frames" and storage == "whole":
        text += (
            f" (not {ISSUE_CAPACITY:,}: that many obs + new_obs frames stored whole "
            f"are {whole_gb:.1f} GB, over this machine's 24 GiB; per-row costs of "
            f"28 KB rows do not depend on the capacity; --frames-storage pool runs 1M)"
        )
    elif capacity < ISSUE_CAPACITY:
        text += f" (not {ISSUE_CAPACITY:,}: a smaller run was asked for)"
    return text


def capacity_note(specs: list[dict]) -> str:
    return "; ".join(
        capacity_reason(*key)
        for key in sorted({(s["shape"], s["capacity"], s["storage"]) for s in specs})
    )


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize(records, KEYS, VALUE)
    capacities = {r["shape"]: r["capacity"] for r in records if "capacity" in r}
    for row in summary:
        row["capacity"] = capacities.get(row["shape"])
        if row["impl"] == "ours":
            ceiling = stats.find(
                summary, VALUE, **{k: row[k] for k in KEYS if k != "impl"}, impl="ceiling"
            )
            row["vs_ceiling"] = stats.ratio(row[VALUE], ceiling)
    memory = [r for r in records if r.get("op") == "memory" and "error" not in r]
    for shape, kind in sorted({(r["shape"], r["kind"]) for r in memory}):
        rows = [r for r in memory if (r["shape"], r["kind"]) == (shape, kind)]
        first = rows[0]
        row = {
            "shape": shape,
            "kind": kind,
            "op": "memory",
            "impl": "ours",
            "capacity": first["capacity"],
            "storage": first.get("storage", "whole"),
            "raw_row_bytes": first["raw_row_bytes"],
            "bytes_held": first["bytes_held"],
            "raw_bytes": first["raw_bytes"],
            "capacity_note": capacity_reason(
                shape, first["capacity"], first.get("storage") or "whole"
            ),
            "memory_ratio": round(first["memory_ratio"], 4),
            "ceiling_memory_ratio": round(first["ceiling_memory_ratio"], 4),
            "rss_growth_ratio": round(stats.median([r["rss_growth_ratio"] for r in rows]), 4),
        }
        if "unique_bytes" in first:  # frame pool: against the distinct frames' bytes too
            row.update({key: first[key] for key in ("distinct_frames", "unique_bytes")})
            row.update(
                {key: round(first[key], 4) for key in ("unique_ratio", "ceiling_unique_ratio")}
            )
            row["rss_growth_unique_ratio"] = round(
                stats.median([r["rss_growth_unique_ratio"] for r in rows]), 4
            )
        summary.append(row)
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    rows = [r for r in summary if r["op"] != "memory" and r["impl"] == "ours"]
    groups = sorted({(r["shape"], r["kind"], r["op"]) for r in rows})
    batches = sorted({r["batch"] for r in rows})
    series = {
        f"batch {b}": [
            stats.find(summary, "vs_ceiling", shape=s, kind=k, op=o, batch=b, impl="ours")
            for s, k, o in groups
        ]
        for b in batches
    }
    capacity = {r["shape"]: short_count(r.get("capacity") or 0) for r in rows}
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "Replay buffer throughput / plain-numpy ceiling (goal >= 0.8)",
        "x ceiling",
        [f"{s} {capacity[s]}\n{k}\n{o}" for s, k, o in groups],
        series,
        hlines={"goal 0.8": 0.8},
    )


def short_count(n: int) -> str:
    """1000000 -> "1M", 50000 -> "50k": capacities in the plot's labels."""
    for size, unit in ((1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:g}{unit}"
    return str(n)


def add_flags(parser) -> None:
    parser.add_argument("--shapes", default="cartpole,frames")
    parser.add_argument("--batches", default="32,512")
    parser.add_argument("--kinds", default="uniform,prioritized")
    parser.add_argument(
        "--ops", default="insert,sample,update", help="update runs for prioritized buffers only"
    )
    parser.add_argument("--cartpole-capacity", type=int, default=1_000_000)
    parser.add_argument(
        "--frames-capacity",
        type=int,
        default=None,
        help=f"default {ISSUE_CAPACITY:,} with the pool, {WHOLE_FRAMES_CAPACITY:,} whole",
    )
    parser.add_argument(
        "--frames-storage",
        choices=("pool", "whole"),
        default="pool",
        help="pool: frame_stack_axis=-1, each distinct frame once; whole: "
        "obs and new_obs as they are",
    )
    parser.add_argument("--bursts", type=int, default=4, help="alternating bursts per impl")
    parser.add_argument("--burst-s", type=float, default=0.25)


def run_meta(args, specs: list[dict]) -> dict:
    return {
        "capacities": {s["shape"]: s["capacity"] for s in specs},
        "capacity_note": capacity_note(specs),
        "frames_storage": args.frames_storage,
    }


def timeout(spec: dict) -> float:
    return 3600 if spec["capacity"] >= 200_000 else 900


if __name__ == "__main__":
    args = harness.parse_args(__doc__, add_flags)
    harness.run(args, harness.Benchmark.of(sys.modules[__name__], timeout=timeout, meta=run_meta))
    if not args.child:  # after the records, where a reader of the run looks
        print(f"# {capacity_note(configurations(args))}", file=sys.stderr)
