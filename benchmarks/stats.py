"""Medians, percentiles and timing loops for the benchmark records."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between ranks."""
    values = sorted(values)
    if not values:
        return None
    pos = (len(values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return float(values[lo] + (values[hi] - values[lo]) * (pos - lo))


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def timed_with_cpu(
    fn: Callable[[], object], repeats: int, warmup: int = 1
) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of `repeats` calls after `warmup`.

    CPU seconds count the work of every thread of this process, so they stay
    meaningful on a machine busy with other work, where wall time mostly
    measures waiting for a core."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return walls, cpus


def process_tree_cpu_s(root: int) -> dict[int, float] | None:
    """pid -> CPU seconds (user + system) of `root` and of every process below it now
    alive (a local Ray's GCS, raylet, workers, actors), read from /proc; None where
    there is no /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = int(fields[11]) + int(fields[12])
    per_second = os.sysconf("SC_CLK_TCK")
    found, pending = {}, [root]
    while pending:
        pid = pending.pop()
        found[pid] = ticks.get(pid, 0) / per_second
        pending += children.get(pid, [])
    return found


def summarize(records: list[dict], keys: tuple, value: str) -> list[dict]:
    """Group records by `keys` and give the median (and spread) of `value` over the
    rounds; records with an "error" are kept apart and reported as such."""
    groups: dict = {}
    for record in records:
        if "error" in record or record.get(value) is None:
            continue
        groups.setdefault(tuple(json.dumps(record.get(k)) for k in keys), []).append(record)
    summary = []
    for group in groups.values():
        values = [r[value] for r in group]
        row = {k: group[0].get(k) for k in keys}
        row.update(
            {
                value: median(values),
                f"{value}_min": min(values),
                f"{value}_max": max(values),
                "rounds": len(values),
            }
        )
        summary.append(row)
    return summary


def summarize_each(records: list[dict], keys: tuple, values: tuple) -> list[dict]:
    """`summarize` of every one of `values`, merged into one row per key."""
    summary: list[dict] = []
    for value in values:
        for row in summarize(records, keys, value):
            match = next((s for s in summary if all(s[k] == row[k] for k in keys)), None)
            if match is None:
                summary.append(row)
            else:
                match.update({k: v for k, v in row.items() if k not in keys})
    return summary


def find(summary: list[dict], value: str, **match):
    """The `value` of the one summary row matching every key=value given."""
    for row in summary:
        if all(row.get(k) == v for k, v in match.items()):
            return row.get(value)
    return None


def vs(summary: list[dict], value: str, row: dict, **match) -> float | None:
    """`row`'s `value` over that of the summary row matching every key=value given."""
    return ratio(row.get(value), find(summary, value, **match))


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None
