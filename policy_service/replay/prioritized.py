"""PrioritizedReplayBuffer: proportional prioritized replay (Schaul et al., 2016).

Slot i is drawn with probability P(i) = p_i^alpha / sum_k p_k^alpha, where
p_i = |td_error_i| + epsilon from the last `update_priorities` (new rows get
the largest priority seen so far); the loss weighs row i by the importance weight
w_i = (N * P(i))^-beta / max_k (N * P(k))^-beta, as in the paper.

    buffer = PrioritizedReplayBuffer(50_000, alpha=0.6, beta=0.4, seed=0)
    buffer.add(rollout_batch)
    batch = buffer.sample(32)                     # + "batch_indexes", "weights"
    td_errors = ...                               # from the loss, <float>[32]
    buffer.update_priorities(batch["batch_indexes"], td_errors)

The weight's normalisation and what happens to a slot overwritten between `sample`
and `update_priorities`: docs/replay.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policy_service.data.sample_batch import SampleBatch
from policy_service.replay.priority_tree import PriorityTree
from policy_service.replay.uniform import BATCH_INDEXES, ReplayBuffer

PRIO_WEIGHTS = "weights"  # RLlib's column name for the importance weights


def _float_rows(name: str, values: Any, rows: int) -> np.ndarray:
    values = np.asarray(values, np.float64)
    if values.shape != (rows,):
        raise ValueError(f"replay buffer: {name} must have shape ({rows},), got {values.shape}")
    return values


def _bad_row(name: str, want: str, values: np.ndarray, bad: np.ndarray) -> ValueError:
    first = int(np.flatnonzero(bad)[0])
    return ValueError(
        f"replay buffer: {name} must be {want}; row {first} is {float(values[first])!r}"
    )


def _check_draws(num_items: Any, size: int) -> int:
    """A sample size for draws with replacement: any int >= 1 (more than the rows held
    too, as RLlib's), from a buffer holding at least one row."""
    if not isinstance(num_items, (int, np.integer)) or isinstance(num_items, bool) or num_items < 1:
        raise ValueError(f"replay buffer: sample size must be an int >= 1, got {num_items!r}")
    if size == 0:
        raise ValueError("replay buffer: cannot sample from an empty buffer")
    return int(num_items)


def _check_priorities(name: str, values: Any, rows: int) -> np.ndarray:
    """values as <float64>[rows], each finite and > 0."""
    values = _float_rows(name, values, rows)
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        raise _bad_row(name, "finite and > 0", values, bad)
    return values


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay over a ring of `capacity` transitions.

    alpha: how much priorities matter (0 = uniform); beta: importance-weight
    exponent (1 = full correction; anneal it by passing `beta=` to sample or
    setting `.beta`); epsilon: added to |td_error| so no row gets priority 0.
    fanout: branching of the priority tree (see PriorityTree).
    frame_stack_axis: as ReplayBuffer's (each distinct frame of obs/new_obs once).
    """

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        epsilon: float = 1e-6,
        columns: Sequence[str] | None = None,
        seed: int | None = None,
        fanout: int = 16,
        frame_stack_axis: int | None = None,
    ) -> None:
        for name, value, ok in (
            ("alpha", alpha, alpha >= 0),
            ("beta", beta, beta >= 0),
            ("epsilon", epsilon, epsilon > 0),
        ):
            if not ok or not np.isfinite(value):
                raise ValueError(
                    f"replay buffer: {name} must be "
                    f"{'> 0' if name == 'epsilon' else '>= 0'}, got {value!r}"
                )
        super().__init__(capacity, columns=columns, seed=seed, frame_stack_axis=frame_stack_axis)
        self.alpha, self.beta, self.epsilon = float(alpha), float(beta), float(epsilon)
        self.tree = PriorityTree(capacity, fanout)
        self.max_priority = 1.0  # before alpha; new rows get it

    @property
    def nbytes(self) -> int:
        return self.store.nbytes + self.tree.nbytes

    def add(self, batch: Mapping[str, Any], priorities: Any = None) -> None:
        """Copies the rows of `batch`; each gets `priorities` <float>[rows] (> 0,
        before alpha) or, by default, the largest priority seen so far."""
        if priorities is not None:
            priorities = _check_priorities("priorities", priorities, self.store.rows_in(batch))
        start, written = self.store.add(batch)
        if priorities is None:
            values = np.full(written, self.max_priority**self.alpha, np.float32)
        else:
            values = (priorities[len(priorities) - written :] ** self.alpha).astype(np.float32)
            self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.set_range(start, values)

    def sample(self, num_items: int, beta: float | None = None) -> SampleBatch:
        """`num_items` rows drawn with P(i) proportional to p_i^alpha, with
        "batch_indexes" <int64>[num_items] and "weights" <float32>[num_items]. Draws
        are with replacement, so num_items may exceed the rows held (as RLlib's)."""
        num_items = _check_draws(num_items, self.store.size)
        beta = self.beta if beta is None else float(beta)
        prefixes = self.rng.random(num_items) * self.tree.total
        indexes = self.tree.find(prefixes)
        scaled = self.tree.leaves[indexes].astype(np.float64)  # p_i^alpha
        weights = (scaled / self.tree.min) ** -beta
        columns = self.store.take(indexes)
        columns[BATCH_INDEXES] = indexes
        columns[PRIO_WEIGHTS] = weights.astype(np.float32)
        return SampleBatch.from_checked_rows(columns)

    def update_priorities(self, indexes: Any, td_errors: Any) -> None:
        """Priority of slot indexes[k] becomes |td_errors[k]| + epsilon."""
        indexes = np.asarray(indexes)
        if indexes.ndim != 1 or indexes.dtype.kind not in "iu":
            raise ValueError(
                f"replay buffer: indexes must be a 1-D integer array, got "
                f"shape {indexes.shape} dtype {indexes.dtype}"
            )
        slots = indexes.astype(np.int64, copy=False)
        # a negative slot read as unsigned is huge: one comparison checks both ends
        if np.count_nonzero(slots.view(np.uint64) >= self.store.size):
            outside = indexes[(indexes < 0) | (indexes >= self.store.size)]
            raise ValueError(
                f"replay buffer: index {int(outside[0])} is outside the {self.store.size} rows held"
            )
        td_errors = _float_rows("td_errors", td_errors, len(slots))
        priorities = np.abs(td_errors) + self.epsilon  # > 0 unless NaN or inf
        largest = float(priorities.max(initial=0.0))
        if not math.isfinite(largest):  # NaN propagates to the max: one check for both
            raise _bad_row("td_errors", "finite", td_errors, ~np.isfinite(td_errors))
        self.max_priority = max(self.max_priority, largest)
        self.tree.update(slots, (priorities**self.alpha).astype(np.float32))

    # ---- state ----------------------------------------------------------

    def get_state(self) -> dict:
        state = super().get_state()
        state["arrays"]["priorities"] = self.tree.leaves[: len(self)]
        state["meta"].update(
            alpha=self.alpha,
            beta=self.beta,
            epsilon=self.epsilon,
            max_priority=self.max_priority,
            fanout=self.tree.fanout,
        )
        return state

    def check_state(self, state: Mapping) -> None:
        super().check_state(state)
        meta, arrays = state["meta"], state["arrays"]
        for key in ("alpha", "max_priority"):
            if key not in meta:
                raise ValueError(f"replay buffer state: missing {key!r}")
        if meta["alpha"] != self.alpha:
            raise ValueError(
                f"replay buffer state: alpha {meta['alpha']}, this buffer has "
                f"{self.alpha} (stored priorities are p^alpha)"
            )
        if "priorities" not in arrays:
            raise ValueError("replay buffer state: array 'priorities' missing")
        size = meta["size"]
        priorities = np.asarray(arrays["priorities"])
        if priorities.shape != (size,) or priorities.dtype != np.float32:
            raise ValueError(
                f"replay buffer state: 'priorities' has shape {priorities.shape} "
                f"dtype {priorities.dtype}, expected ({size},) float32"
            )
        if size:
            _check_priorities("priorities", priorities, size)

    def set_state(self, state: Mapping) -> None:
        super().set_state(state)
        meta = state["meta"]
        self.beta = float(meta.get("beta", self.beta))
        self.epsilon = float(meta.get("epsilon", self.epsilon))
        self.max_priority = float(meta["max_priority"])
        self.tree.leaves[:] = 0
        self.tree.leaves[: len(self)] = state["arrays"]["priorities"]
        self.tree.rebuild()
