"""policy_service/runs/metrics_logger.py: values reduced by the rule they were logged with."""

from __future__ import annotations

import pytest

from policy_service.runs.metrics_logger import (
    LoggedMetrics,
    MetricsLogger,
    Stat,
    reduce_stats,
    stat_values,
)


def logged(*entries) -> dict:
    logger = MetricsLogger()
    for key, value, kwargs in entries:
        logger.log_value(key, value, **kwargs)
    return logger.drain()


def test_each_rule_reduces_this_iterations_values():
    metrics = LoggedMetrics()
    metrics.add(logged(("m", 1, {}), ("m", 3, {}), ("s", 2, {"reduce": "sum"})))
    metrics.add(logged(("s", 5, {"reduce": "sum"}), ("hi", 4, {"reduce": "max"})))
    metrics.add(logged(("lo", 4, {"reduce": "min"}), ("lo", -1, {"reduce": "min"})))
    metrics.add(logged(("last", 1, {"reduce": "last"}), ("last", 9, {"reduce": "last"})))
    assert metrics.reduce() == {"m": 2.0, "s": 7.0, "hi": 4.0, "lo": -1.0, "last": 9.0}
    assert metrics.reduce() == {}  # nothing logged since


def test_a_window_reduces_the_last_values_across_iterations():
    metrics = LoggedMetrics()
    metrics.add(logged(("w", 1, {"window": 3}), ("w", 2, {"window": 3})))
    assert metrics.reduce() == {"w": 1.5}
    metrics.add(logged(("w", 3, {"window": 3}), ("w", 10, {"window": 3})))
    assert metrics.reduce() == {"w": 5.0}  # 2, 3, 10
    assert metrics.reduce() == {"w": 5.0}  # the window stands when nothing new came


def test_a_key_with_two_rules_or_a_bad_rule_is_one_line():
    logger = MetricsLogger()
    logger.log_value("k", 1, reduce="max")
    with pytest.raises(ValueError, match=r"'k' was logged with reduce='max'.*now reduce='mean'"):
        logger.log_value("k", 2)
    with pytest.raises(ValueError, match=r"reduce must be one of \['mean'"):
        logger.log_value("j", 1, reduce="median")
    with pytest.raises(ValueError, match="window must be >= 1 and is for mean, min or max"):
        logger.log_value("j", 1, reduce="sum", window=5)
    metrics = LoggedMetrics()
    metrics.add(logged(("k", 1, {"reduce": "max"})))
    with pytest.raises(ValueError, match="elsewhere"):
        metrics.add(logged(("k", 1, {"reduce": "min"})))


def test_statistics_combine_by_the_rule_they_carry_over_the_dicts_that_hold_them():
    first = {"loss": Stat(1.0), "rows": Stat(10, "sum"), "lag_max": Stat(3, "max")}
    second = {"loss": Stat(4.0), "rows": Stat(30, "sum"), "lag_max": Stat(1, "max")}
    third = {"loss": Stat(7.0), "lag_min": Stat(2, "min"), "updates": Stat(5, "last")}
    reduced = reduce_stats([first, second, third, {"updates": Stat(6, "last")}])
    assert reduced == {
        "loss": Stat(4.0),  # (1 + 4 + 7) / 3
        "rows": Stat(40, "sum"),  # the third has none: not a 0 in the sum
        "lag_max": Stat(3, "max"),
        "lag_min": Stat(2, "min"),
        "updates": Stat(6, "last"),
    }
    assert list(reduced) == ["loss", "rows", "lag_max", "lag_min", "updates"]  # first seen
    assert stat_values(reduced)["rows"] == 40


def test_a_mean_is_weighted_by_its_dicts_weights_the_other_rules_are_not():
    first = {"m": Stat(1.0), "s": Stat(2, "sum")}
    reduced = reduce_stats([first, {"m": Stat(4.0), "s": Stat(5, "sum")}], weights=[3, 1])
    assert reduced == {"m": Stat((1.0 * 3 + 4.0) / 4), "s": Stat(7, "sum")}
    assert reduce_stats([]) == {}


def test_a_statistic_with_two_rules_or_a_bad_rule_is_one_line():
    with pytest.raises(ValueError, match=r"'k' must have one reduce rule, got \['max', 'mean'\]"):
        reduce_stats([{"k": Stat(1.0)}, {"k": Stat(2.0, "max")}])
    with pytest.raises(ValueError, match=r"'k': reduce must be one of .* got 'median'"):
        reduce_stats([{"k": Stat(1.0, "median")}])
