"""Policies built once per test module and handed out in the state they were built in.

Building and tracing cost seconds a policy. A module asks `BuiltPolicies.get(key, build)`
for the policy of `key`: the first call builds it and keeps its first get_state(); every
call sets that state back (weights, optimizer slots, RNGs and counters, exactly: the
set_state tests of tests/test_tf_policy.py), so each test sees a fresh policy. A loaded
buffer is not state: the calling module decides which tests may share a policy that
loads one. `clear()` (a module-scoped fixture's teardown) lets the policies go.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class BuiltPolicies:
    def __init__(self):
        self._built: dict[Hashable, tuple[Any, Any]] = {}

    def get(self, key: Hashable, build: Callable[[], Any]):
        if key not in self._built:
            policy = build()
            self._built[key] = policy, policy.get_state()
        policy, state = self._built[key]
        policy.set_state(state)
        return policy

    def clear(self) -> None:
        self._built.clear()
