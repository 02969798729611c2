"""LearnerStateCopy: the driver's last full copy of the learner actors' state.

Learner actors can die apart from the driver; a LearnerGroup is then replaced
from a copy of the state (weights, optimizer variables, RNG, counters) taken
after the last update. Fetching that copy after every update made the driver
wait for the learner to serialize it. Here the copy is only asked for after
an update: the learner serializes it while the driver samples, and the driver
fetches it when the next copy is asked for (finished by then) or when a
replacement needs it.

    copy = LearnerStateCopy(group)
    copy.refresh()                      # after every update; does not wait
    group.restart(copy.latest())        # a learner died
"""
from __future__ import annotations

import ray
from ray.exceptions import RayError


class LearnerStateCopy:
    """The newest state asked for, and the one before it, fetched, as the fallback
    when the learners died before serving the newest (a replacement then resumes
    one update earlier). A group whose learner lives in the driver needs no copy."""

    def __init__(self, group) -> None:
        self._group = group
        # the newest get_state(), maybe not done yet (None: the learner is in the driver)
        self._asked: ray.ObjectRef | None = None
        self._fetched: dict | None = None  # an older state, already in the driver
        self.refresh()

    def refresh(self) -> None:
        """Ask learner 0 for its state now; keep the previous answer, done by now
        (the actor ran it before the update that just finished)."""
        if self._group.local_policy is not None:
            return
        previous, self._asked = self._asked, self._group.get_state_ref()
        if previous is not None:
            try:
                self._fetched = ray.get(previous, timeout=self._group.call_timeout_s)
            except RayError:
                pass  # a group replaced meanwhile: the older copy stays

    def latest(self) -> dict:
        """The newest state the learners served; the one before it if they died first."""
        if self._group.local_policy is not None or self._asked is None:
            raise RuntimeError("a learner in the driver (num_learners=0) keeps no copy")
        try:
            return ray.get(self._asked, timeout=self._group.call_timeout_s)
        except RayError:
            if self._fetched is None:
                raise
            return self._fetched
