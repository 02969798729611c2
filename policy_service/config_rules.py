"""Rules a config value must pass: a rule returns None when the value passes, else
what the value must be ("an integer >= 1"), which the caller puts in a one-line
error naming the key. Its own module so that config.py and the modules whose
options it checks (exploration.py) both use it without importing each other."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Rule:
    """A check described by a fixed phrase: the value passes when `accepts(value)`."""

    expected: str
    accepts: Callable[[Any], bool]

    def __call__(self, value: Any) -> str | None:
        return None if self.accepts(value) else self.expected


def finite(*, gt: float | None = None, ge: float | None = None, le: float | None = None) -> Rule:
    """A finite number within the bounds given (NaN and inf never pass)."""

    def accepts(value):
        return (
            is_number(value)
            and math.isfinite(value)
            and (gt is None or value > gt)
            and (ge is None or value >= ge)
            and (le is None or value <= le)
        )

    return Rule(f"a finite number {bounds_phrase(gt, ge, le)}".rstrip(), accepts)


def integer(*, ge: int, le: int | None = None) -> Rule:
    """An integer within the bounds given."""
    return Rule(
        f"an integer {bounds_phrase(None, ge, le)}",
        lambda value: is_int(value) and value >= ge and (le is None or value <= le),
    )


def schedule_error(schedule) -> str | None:
    """[[timestep, value], ...]: finite numbers, timesteps >= 0 in non-decreasing order.

    None when `schedule` is one, else what it must be and what is wrong (the caller
    names the key); schedules.py has the semantics."""
    expected = "a non-empty list of [timestep, value] pairs"
    if not isinstance(schedule, (list, tuple)) or not schedule:
        return f"{expected} (it is empty or not a list)"
    for i, point in enumerate(schedule):
        if (
            not isinstance(point, (list, tuple))
            or len(point) != 2
            or not all(is_number(x) and math.isfinite(x) for x in point)
        ):
            return f"{expected} of finite numbers (entry {i} is {point!r})"
        if point[0] < 0:
            return f"{expected} with timesteps >= 0 (entry {i} is {point!r})"
        if i and point[0] < schedule[i - 1][0]:
            return (
                f"{expected} with timesteps in increasing order (entry {i}'s "
                f"{point[0]} comes after {schedule[i - 1][0]})"
            )
    return None


RATE_EXPECTED = "a finite number > 0 or a schedule [[timestep, rate], ...] of rates > 0"


def rate_error(value) -> str | None:
    """A learning rate of its own: a number, or a schedule (schedule_error) whose
    rates are > 0. None when it is one, else what it must be and what is wrong."""
    if is_number(value):
        return None if math.isfinite(value) and value > 0 else RATE_EXPECTED
    error = schedule_error(value)
    if error is not None:
        return f"{RATE_EXPECTED}: {error}"
    low = min(point[1] for point in value)
    return None if low > 0 else f"{RATE_EXPECTED} (a rate is {low})"


def machine_memory_bytes() -> int:
    """This machine's memory: physical RAM, or the cgroup's limit when lower."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return memory
    return min(memory, int(limit)) if limit.isdigit() else memory


MIN_ROW_BYTES = 16  # the least a batch or replay row can take: obs, action, reward, flags


def one_of(*choices: str) -> Rule:
    """One of the choices given; the error lists them."""
    return Rule(f"one of {list(choices)}", lambda value: value in choices)


def bounds_phrase(gt, ge, le) -> str:
    low = f"({gt}" if gt is not None else f"[{ge}" if ge is not None else None
    if low is not None and le is not None:
        return f"in {low}, {le}]"
    if gt is not None:
        return f"> {gt}"
    if ge is not None:
        return f">= {ge}"
    return f"<= {le}" if le is not None else ""


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
