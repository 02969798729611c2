"""The two checks every config class's range table gets (test_config.py: the policy's
and model's keys; test_algorithm_config.py: the algorithm loop's and PPO's)."""

from __future__ import annotations

import pytest

from policy_service.config import ConfigError, from_dict


def assert_out_of_range_is_one_line(cls, key: str, value, expected: str) -> None:
    """`value` for `key` is refused in one line naming the key, its range and the value."""
    with pytest.raises(ConfigError) as err:
        from_dict(cls, {key: value})
    assert str(err.value) == f"{cls.key_prefix}.{key} must be {expected}, got {value!r}"
    assert "\n" not in str(err.value)


def assert_taken(cls, key: str, value) -> None:
    """`value` at the edge of `key`'s range is taken as given."""
    assert getattr(from_dict(cls, {key: value}), key) == value
