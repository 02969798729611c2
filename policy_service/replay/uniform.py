"""ReplayBuffer: uniform sampling, with replacement, from a ring of transitions.

The loop it lives in (DQN's training step):

    buffer = ReplayBuffer(capacity=50_000, seed=config.seed)
    for _ in range(iterations):
        buffer.add(rollout_batch)                 # SampleBatch or dict of columns
        train_batch = buffer.sample(32)           # SampleBatch + "batch_indexes"
        policy.learn_on_batch(train_batch)

State for checkpoints: `get_state()` -> {"arrays": name -> ndarray (np.savez
without pickle), "meta": JSON-able dict}; `set_state(state)` restores the
content, the write position and the random generator, so a restored buffer
samples exactly the batch the original would have sampled next.

Frame-stacked observations (Atari's 84x84x4): `frame_stack_axis=-1` (or 0 for
[4, 84, 84]) stores each distinct frame of obs/new_obs once (FrameStackStore),
about 8x less memory, with the same rows sampled back byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policy_service.data.sample_batch import SampleBatch
from policy_service.replay.column_store import ColumnStore
from policy_service.replay.frame_stack_store import FrameStackStore

BATCH_INDEXES = "batch_indexes"  # RLlib's name for the slots a sampled row came from


def check_sample_size(num_items: int, size: int) -> int:
    """A sample size for draws with replacement: any int >= 1 (more than the rows held
    too, as RLlib's), from a buffer holding at least one row."""
    if not isinstance(num_items, (int, np.integer)) or isinstance(num_items, bool) or num_items < 1:
        raise ValueError(f"replay buffer: sample size must be an int >= 1, got {num_items!r}")
    if size == 0:
        raise ValueError("replay buffer: cannot sample from an empty buffer")
    return int(num_items)


class ReplayBuffer:
    """A ring of `capacity` transitions, sampled uniformly.

    capacity: transitions (rows) held; adding more overwrites the oldest.
    columns: column names to store; None = those of the first batch added.
    seed: seeds the buffer's own numpy Generator (None: fresh entropy).
    frame_stack_axis: None stores obs/new_obs whole; an int: they are stacks of
      frames along that axis of one observation, each distinct frame stored once.
    """

    def __init__(
        self,
        capacity: int,
        *,
        columns: Sequence[str] | None = None,
        seed: int | None = None,
        frame_stack_axis: int | None = None,
    ) -> None:
        self.frame_stack_axis = frame_stack_axis
        self.store = (
            ColumnStore(capacity, columns)
            if frame_stack_axis is None
            else FrameStackStore(capacity, columns, frame_stack_axis)
        )
        self.rng = np.random.default_rng(seed)

    @property
    def capacity(self) -> int:
        return self.store.capacity

    def __len__(self) -> int:
        return self.store.size

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer's arrays."""
        return self.store.nbytes

    def add(self, batch: Mapping[str, Any]) -> None:
        """Copies the rows of `batch` (a SampleBatch or dict of equal-length columns)."""
        self.store.add(batch)

    def sample(self, num_items: int) -> SampleBatch:
        """`num_items` rows drawn uniformly with replacement (so num_items may exceed the
        rows held, as RLlib's), plus "batch_indexes" <int64>[num_items], the slots they
        came from."""
        num_items = check_sample_size(num_items, self.store.size)
        indexes = self.rng.integers(0, self.store.size, num_items)
        columns = self.store.take(indexes)
        columns[BATCH_INDEXES] = indexes
        return SampleBatch.from_checked_rows(columns)

    # ---- state ----------------------------------------------------------

    def get_state(self) -> dict:
        """{"arrays": name -> ndarray, "meta": JSON-able dict}. The arrays are views of
        the filled rows (a 1M-row buffer is not copied): write them before the next add."""
        arrays, meta = self.store.get_state()
        meta = dict(meta, kind=type(self).__name__, rng=self.rng.bit_generator.state)
        return {"arrays": arrays, "meta": meta}

    def check_state(self, state: Mapping) -> None:
        """Raises ValueError naming what in `state` does not fit this buffer."""
        if not isinstance(state, Mapping) or set(state) != {"arrays", "meta"}:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"replay buffer state: expected keys ['arrays', 'meta'], got {keys}")
        meta = state["meta"]
        if meta.get("kind") != type(self).__name__:
            raise ValueError(
                f"replay buffer state: written by {meta.get('kind')!r}, "
                f"restoring into {type(self).__name__!r}"
            )
        axis = meta.get("frame_stack_axis")  # absent: written without frame stacking
        if axis != self.frame_stack_axis:
            raise ValueError(
                f"replay buffer state: written with frame_stack_axis {axis!r}, "
                f"this buffer has {self.frame_stack_axis!r}"
            )
        rng_name = (meta.get("rng") or {}).get("bit_generator")
        if rng_name != self.rng.bit_generator.state["bit_generator"]:
            raise ValueError(
                f"replay buffer state: random generator {rng_name!r}, this "
                f"buffer uses {self.rng.bit_generator.state['bit_generator']!r}"
            )
        self.store.check_state(state["arrays"], meta)

    def set_state(self, state: Mapping) -> None:
        """Restores `get_state()`'s content exactly; checks everything first."""
        self.check_state(state)
        self.store.set_state(state["arrays"], state["meta"])
        self.rng.bit_generator.state = state["meta"]["rng"]
