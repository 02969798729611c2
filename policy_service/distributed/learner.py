"""Learner: the learner role, a policy learning on train batches a LearnerGroup
prepared (`TFPolicy.prepare_train_batch`) and sharded (learner_shards.py).

A LearnerGroup calls its learners the same way wherever they live: one in the
driver is a `Learner` (distributed/learners.py: LocalLearners), each of N in a
Ray actor a `LearnerHost` (learner_actor.py), a Learner whose tower stack
combines every step with the others' inside the compiled step:

    learner.update(shard, num_epochs, shuffle, buffer_index, minibatch_size)
    learner.update_on_fragments(fragment_refs, learner_version, num_sgd_steps)  # async
    learner.get_state(); learner.set_state(state)

Every learner builds its policy from one `PolicySpec` (RLlib's name), in the driver
or in an actor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from policy_service.data.sample_batch import concat_samples
from policy_service.data.train_batches import TrainColumns
from policy_service.distributed.policy_actor import WEIGHTS_VERSION
from policy_service.policy.learning_results import valid_rows_only
from policy_service.runs.metrics_logger import Stat

POLICY_LAG_SUM, POLICY_LAG_MAX, POLICY_LAG_ROWS = "policy_lag_sum", "policy_lag_max", "lag_rows"


def resolve_fragments(fragments: list) -> list:
    """Fragments as batches: ObjectRefs read from the object store, by this process."""
    refs = [f for f in fragments if isinstance(f, ray.ObjectRef)]
    fetched = iter(ray.get(refs) if refs else [])
    return [next(fetched) if isinstance(f, ray.ObjectRef) else f for f in fragments]


class FragmentUpdate:
    """Learner.update_on_fragments in parts: the fragments read and made train columns,
    then each SGD step its own call, then the statistics. A learner that also acts
    for the env runners (acting_learner.py) answers their forward passes between
    the parts rather than after the whole update."""

    def __init__(
        self, learner: Learner, fragments: list, learner_version: int, policy_id: str | None
    ):
        batches = resolve_fragments(fragments)
        if policy_id is not None:
            batches = [b.policy_batches[policy_id] for b in batches]
        batch = concat_samples(batches)
        self.learner = learner
        self.lags = learner_version - np.asarray(batch.pop(WEIGHTS_VERSION), np.int64)
        self.train = learner.policy.train_columns(batch)
        self.num_sgd_steps = 0
        self.stats: dict = {}

    def sgd_step(self) -> None:
        with self.learner._collective():
            self.stats = self.learner.policy.update_on_train_columns(
                self.train, num_epochs=None, shuffle=True, buffer_index=0
            )
        self.num_sgd_steps += 1

    def finish(self) -> dict:
        """The last step's statistics (after_async_update sees them), the steps made
        and the rows' policy lags (Stats: summed, or the max, over the group's learners)."""
        self.learner.policy.after_async_update(self.stats)
        return {
            **valid_rows_only(self.stats, self.train),
            "num_sgd_steps": self.num_sgd_steps,
            POLICY_LAG_SUM: Stat(float(self.lags.sum()), "sum"),
            POLICY_LAG_MAX: Stat(int(self.lags.max()), "max"),
            POLICY_LAG_ROWS: Stat(len(self.lags), "sum"),
        }


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

    def update_on_fragments(
        self,
        fragments: list,
        learner_version: int,
        num_sgd_steps: int,
        policy_id: str | None = None,
    ) -> dict:
        """Asynchronous learning: sampled fragments (ObjectRefs, read here, or
        batches) -> `num_sgd_steps` SGD steps on all of them at once, with each
        row's policy lag (learner_version - the "weights_version" that acted).
        policy_id: the fragments are MultiAgentBatches, this learner's policy learns
        on its own rows of them (the caller dealt only fragments holding some)."""
        update = FragmentUpdate(self, fragments, learner_version, policy_id)
        for _ in range(num_sgd_steps):
            update.sgd_step()
        return update.finish()

    def compute_gradients(self, train: TrainColumns):
        with self._collective():
            return self.policy.compute_gradients_on_train_columns(train)

    def apply_gradients(self, gradients) -> None:
        self.policy.apply_gradients(gradients)

    def load_batch_into_buffer(
        self, train: TrainColumns, buffer_index: int, minibatch_size: int | None
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

    def weights_for_runners(self) -> tuple[dict, int]:
        """(weights, the SGD steps that made them): one call for a weights sync."""
        return self.policy.get_weights(), int(self.policy.num_grad_updates)

    def last_gradients(self) -> dict:
        with self._collective():
            return self.policy.last_gradients()

    def set_weights(self, weights: dict, new_rate: float = 1.0) -> None:
        self.policy.set_weights(weights, new_rate)

    def get_state(self) -> dict:
        return self.policy.get_state()

    def set_state(self, state: dict) -> None:
        self.policy.set_state(state)

    def weights_identical(self) -> bool:
        """True when every learner holds bit-identical weights (one alone always does)."""
        return True

    def set_global_timestep(self, timestep: int) -> None:
        """The run's env steps so far: what schedules (lr_schedule) read."""
        self.policy.global_timestep = int(timestep)

    def foreach_policy(self, fn: Callable, *args) -> Any:
        return fn(self.policy, *args)

    def _collective(self):
        """Around a call that may all-reduce with other learners: none here."""
        return contextlib.nullcontext()
