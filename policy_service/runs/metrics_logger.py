"""Values a user logs with their reduce rule, and the windows that reduce them.

    metrics_logger.log_value("queue_len", n, reduce="max")           # in a hook
    metrics_logger.log_value("latency_ms", ms, reduce="mean", window=50)

A value is reduced where the results are made (the driver), by the rule it was logged
with: "mean", "min", "max" over the values of this iteration (or, with `window`, over
the last `window` values logged, across iterations), "sum" of this iteration's values,
"last" the newest value. The rule travels with the value, so nothing is combined by
guessing from a key's name. A key logged with two rules is refused in one line.

Statistics the library computes (an env runner's fragment counts and times, a learner's
policy lags, an asynchronous update's, A3C's gradients', the off-policy learning calls')
travel the same way: each is a `Stat` (value, rule) from where it is computed, and
`reduce_stats` combines several dicts of them (runners, learners, policies, updates) by
those rules, with the one reduction both paths share (`reduce_values`):

    update = {"total_loss": Stat(0.5), "policy_lag_max": Stat(3, "max")}
    reduce_stats([update, next_update])  # -> {"total_loss": Stat(mean), ...}
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

REDUCE_RULES = ("mean", "min", "max", "sum", "last")


class MetricsLogger:
    """What one process logged since it was last drained (RLlib's new-stack name)."""

    def __init__(self) -> None:
        self._logged: dict[str, tuple[str, int | None, list[float]]] = {}

    def log_value(self, key: str, value: Any, reduce: str = "mean", window: int | None = None):
        check_rule(key, reduce, window)
        rule = (reduce, window)
        logged = self._logged.get(key)
        if logged is not None and logged[:2] != rule:
            raise ValueError(
                f"metrics_logger: {key!r} was logged with reduce={logged[0]!r}, "
                f"window={logged[1]!r}, now reduce={reduce!r}, window={window!r}"
            )
        if logged is None:
            logged = self._logged[key] = (reduce, window, [])
        logged[2].append(float(value))

    def drain(self) -> dict[str, tuple[str, int | None, list[float]]]:
        """Everything logged since the last drain (key -> (reduce, window, values))."""
        logged, self._logged = self._logged, {}
        return logged


def check_rule(key: str, reduce: str, window: int | None) -> None:
    if reduce not in REDUCE_RULES:
        raise ValueError(
            f"metrics_logger: {key!r}: reduce must be one of {list(REDUCE_RULES)}, got {reduce!r}"
        )
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise ValueError(f"metrics_logger: {key!r}: window must be an int >= 1, got {window!r}")
    if window is not None and (window < 1 or reduce in ("sum", "last")):
        raise ValueError(
            f"metrics_logger: {key!r}: window must be >= 1 and is for mean, min or max, "
            f"got window={window} with reduce={reduce!r}"
        )


class LoggedMetrics:
    """The driver's side: what every runner logged, reduced once an iteration."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[str, int | None]] = {}
        self._windows: dict[str, collections.deque[float]] = {}
        self._this_iteration: dict[str, list[float]] = collections.defaultdict(list)

    def add(self, logged: dict[str, tuple[str, int | None, list[float]]]) -> None:
        for key, (reduce, window, values) in logged.items():
            rule = self._rules.setdefault(key, (reduce, window))
            if rule != (reduce, window):
                raise ValueError(
                    f"metrics_logger: {key!r} was logged with reduce={rule[0]!r}, "
                    f"window={rule[1]!r} elsewhere, here with reduce={reduce!r}, window={window!r}"
                )
            self._this_iteration[key].extend(values)
            if window is not None:
                self._windows.setdefault(key, collections.deque(maxlen=window)).extend(values)

    def reduce(self) -> dict[str, float]:
        """Each key's value for this iteration's results; the iteration's values go."""
        reduced = {}
        for key, (reduce, window) in self._rules.items():
            values = list(self._windows[key]) if window is not None else self._this_iteration[key]
            if values:
                reduced[key] = reduce_values(reduce, values)
        self._this_iteration.clear()
        return reduced


class Stat(NamedTuple):
    """A statistic where it was computed: its value and the rule (REDUCE_RULES) that
    combines it with its key's values from other updates, learners or policies."""

    value: Any
    reduce: str = "mean"


def reduce_stats(
    stats: Iterable[Mapping[str, Stat]], weights: Sequence[float] | None = None
) -> dict[str, Stat]:
    """Each key's Stats over the dicts that hold it (in order), combined by its rule;
    a "mean" weighted by the dicts' `weights` (default: equal). A key given two rules
    is refused in one line."""
    stats = list(stats)
    weights = [1] * len(stats) if weights is None else list(weights)
    reduced = {}
    for key in dict.fromkeys(k for s in stats for k in s):
        held = [(s[key], w) for s, w in zip(stats, weights) if key in s]
        rules = {stat.reduce for stat, _ in held}
        if len(rules) != 1:
            raise ValueError(f"statistics: {key!r} must have one reduce rule, got {sorted(rules)}")
        [rule] = rules
        check_rule(key, rule, None)
        values = [stat.value for stat, _ in held]
        reduced[key] = Stat(reduce_values(rule, values, [w for _, w in held]), rule)
    return reduced


def stat_values(stats: Mapping[str, Stat]) -> dict[str, Any]:
    """The values alone, for results."""
    return {key: stat.value for key, stat in stats.items()}


def reduce_values(reduce: str, values: list, weights: list | None = None):
    """One key's values by `reduce`; "mean" weighted by `weights` (default: equal)."""
    if reduce == "mean":
        weights = [1] * len(values) if weights is None else weights
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)
    if reduce == "sum":
        return sum(values)
    if reduce == "last":
        return values[-1]
    return min(values) if reduce == "min" else max(values)
