"""Policies built once per test module and handed out in the state they were built in.

Building and tracing cost seconds a policy. A module asks `BuiltPolicies.get(key, build)`
for the policy of `key`: the first call builds it and keeps its first get_state(); every
call sets that state back (weights, optimizer slots, RNGs and counters, exactly: the
set_state tests of tests/test_tf_policy.py), so each test sees a fresh policy. A loaded
buffer is not state: the calling module decides which tests may share a policy that
loads one. The module's autouse fixture `forget_at_module_end()` lets them go.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest


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

    def forget_at_module_end(self):
        """A module-scoped autouse fixture that clears these policies when the module's
        tests are done: `_forget_built_policies = _BUILT.forget_at_module_end()`."""

        @pytest.fixture(scope="module", autouse=True)
        def forget():
            yield
            self.clear()

        return forget
