"""LearnerStateCopy: the driver's last full copy of the learner actors' state.

Learner actors can die apart from the driver; their group is then replaced
from a copy of the state (weights, optimizer variables, RNG, counters) taken
after the last change. Fetching that copy after every update made the driver
wait for the learner to serialize it. Here the copy is only asked for: the
learner serializes it while the driver samples, and the driver fetches it
when the next copy is asked for (finished by then) or when a replacement
needs it. `RemoteLearners` (learners.py) keeps one:

    copy = LearnerStateCopy(partial(remote_call, actors[0], Learner.get_state))  # asks now
    copy.refresh(timeout_s)              # after every change; does not wait
    restart from copy.latest(timeout_s)  # a learner died
"""

from __future__ import annotations

from collections.abc import Callable

import ray
from ray.exceptions import RayError


class LearnerStateCopy:
    """The newest state asked for, and the one before it, fetched, as the fallback
    when the learners died before serving the newest (a replacement then resumes
    one change earlier). ask() -> an ObjectRef of a learner's get_state()."""

    def __init__(self, ask: Callable) -> None:
        self._ask = ask
        self._asked: ray.ObjectRef = ask()  # the newest get_state(), maybe not done yet
        self._fetched: dict | None = None  # an older state, already in the driver

    def refresh(self, timeout_s: float) -> None:
        """Ask for the state now; keep the previous answer, done by now (the actor
        ran it before the call that just finished)."""
        previous, self._asked = self._asked, self._ask()
        try:
            self._fetched = ray.get(previous, timeout=timeout_s)
        except RayError:
            pass  # learners replaced meanwhile: the older copy stays

    def newest(self, timeout_s: float) -> dict | None:
        """The state after the last change, or None when the learners died before
        serving it (the one before it would not match what was counted since)."""
        try:
            return ray.get(self._asked, timeout=timeout_s)
        except RayError:
            return None

    def latest(self, timeout_s: float) -> dict:
        """The newest state the learners served; the one before it if they died first."""
        try:
            return ray.get(self._asked, timeout=timeout_s)
        except RayError:
            if self._fetched is None:
                raise
            return self._fetched
