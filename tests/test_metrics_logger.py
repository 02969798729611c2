"""policy_service/runs/metrics_logger.py: values reduced by the rule they were logged with."""

from __future__ import annotations

import pytest

from policy_service.runs.metrics_logger import LoggedMetrics, MetricsLogger


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
