"""Learner: the learner role, a policy learning on train batches a LearnerGroup
prepared (`TFPolicy.prepare_train_batch`) and sharded (learner_shards.py).

A LearnerGroup calls its learners the same way wherever they live: one in the
driver is a `Learner` (distributed/learners.py: LocalLearners), each of N in a
Ray actor a `LearnerHost` (learner_actor.py), a Learner whose tower stack
combines every step with the others' inside the compiled step:

    learner.update(shard, num_epochs, shuffle, buffer_index, minibatch_size)
    learner.get_state(); learner.set_state(state)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from policy_service.train_batches import TrainColumns


class Learner:
    """A policy's learning and state methods on prepared train columns. Every learner
    of a group must make the same learning calls, in the same order."""

    def __init__(self, policy) -> None:
        self.policy = policy

    def info(self) -> dict:
        """What the group needs to prepare and shard batches for this learner."""
        return {
            "num_towers": self.policy.towers.num_towers,
            "devices": self.policy.devices,
            "num_state_tensors": self.policy.num_state_tensors(),
            "dist_inputs_width": self.policy.num_outputs,
        }

    # ----- learning -------------------------------------------------------------------

    def update(
        self,
        train: TrainColumns,
        num_epochs: int | None,
        shuffle: bool,
        buffer_index: int,
        minibatch_size: int | None,
    ) -> dict:
        """TFPolicy.update_on_train_columns: one SGD step on the shard, or the shard
        loaded and num_epochs of minibatch SGD over it."""
        with self._collective():
            return self.policy.update_on_train_columns(
                train, num_epochs, shuffle, buffer_index, minibatch_size
            )

    def compute_gradients(self, train: TrainColumns):
        with self._collective():
            return self.policy.compute_gradients_on_train_columns(train)

    def apply_gradients(self, gradients) -> None:
        self.policy.apply_gradients(gradients)

    def load_batch_into_buffer(
        self, train: TrainColumns, buffer_index: int, minibatch_size: int
    ) -> int:
        return self.policy.load_train_columns_into_buffer(train, buffer_index, minibatch_size)

    def get_num_samples_loaded_into_buffer(self, buffer_index: int = 0) -> int:
        return self.policy.get_num_samples_loaded_into_buffer(buffer_index)

    def learn_on_loaded_batch(self, offset: int, buffer_index: int) -> dict:
        with self._collective():
            return self.policy.learn_on_loaded_batch(offset, buffer_index)

    def learn_on_loaded_epochs(
        self, num_epochs: int | None, buffer_index: int, shuffle: bool
    ) -> dict:
        with self._collective():
            return self.policy.learn_on_loaded_epochs(num_epochs, buffer_index, shuffle)

    # ----- weights and state ---------------------------------------------------------

    def get_weights(self) -> dict:
        return self.policy.get_weights()

    def set_weights(self, weights: dict, new_rate: float = 1.0) -> None:
        self.policy.set_weights(weights, new_rate)

    def get_state(self) -> dict:
        return self.policy.get_state()

    def set_state(self, state: dict) -> None:
        self.policy.set_state(state)

    def weights_identical(self) -> bool:
        """True when every learner holds bit-identical weights (one alone always does)."""
        return True

    def foreach_policy(self, fn: Callable, *args) -> Any:
        return fn(self.policy, *args)

    def _collective(self):
        """Around a call that may all-reduce with other learners: none here."""
        return contextlib.nullcontext()
