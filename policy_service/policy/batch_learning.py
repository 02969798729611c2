"""The learner role's two calls on a SampleBatch, written once for TFPolicy and LearnerGroup.

Each implements `_learn(batch, num_epochs, shuffle, buffer_index)`: prepare the
batch, train, and return the statistics with per-row outputs over its valid rows.
A LearnerGroup also overrides `_update`, to replace dead learners and run again.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from policy_service.data.sample_batch import SampleBatch
from policy_service.policy.learning_results import (
    rllib_layout,
    with_sampler_lead,
    with_samples_trained,
)


class BatchLearning(abc.ABC):
    """`update` and `learn_on_batch` over the class's own `_learn`.

    `batch_hook` (set by the algorithm: its callbacks' on_learn_on_batch) sees each
    batch before it is learned on; the statistics it returns join the call's."""

    batch_hook: Callable[[SampleBatch], dict] | None = None

    def update(
        self,
        batch: SampleBatch,
        num_epochs: int | None = None,
        shuffle: bool = True,
        buffer_index: int = 0,
    ) -> dict:
        """Train on `batch` -> statistics, "num_samples_trained" (valid rows x passes),
        "diff_num_grad_updates_vs_sampler_policy" (the policy's lead over the batch's
        sampler, the mean over the SGD steps: `with_sampler_lead`) and, when the loss
        returns per-row outputs, PER_ROW ("per_row": name -> array over the batch's
        valid rows, in order; from each row's last step).

        num_epochs None: one SGD step on the whole batch. N: the batch loaded onto
        the towers (every learner's) once, then N epochs of `minibatch_size` SGD
        steps in one compiled call (one per learner)."""
        extra = self.batch_hook(batch) if self.batch_hook is not None else {}
        stats = self._update(batch, num_epochs, shuffle, buffer_index)
        return with_samples_trained(with_sampler_lead(stats, sampler_grad_updates(batch))) | extra

    def learn_on_batch(self, batch: SampleBatch) -> dict:
        """One SGD step on the whole batch, over all towers (of all learners) ->
        statistics in RLlib's layout (learning_results.rllib_layout)."""
        extra = self.batch_hook(batch) if self.batch_hook is not None else {}
        stats = rllib_layout(self._learn(batch, None, True, 0), sampler_grad_updates(batch))
        return stats | extra

    def _update(
        self, batch: SampleBatch, num_epochs: int | None, shuffle: bool, buffer_index: int
    ) -> dict:
        """`update`'s statistics before the count of samples trained."""
        return self._learn(batch, num_epochs, shuffle, buffer_index)

    @abc.abstractmethod
    def _learn(
        self, batch: SampleBatch, num_epochs: int | None, shuffle: bool, buffer_index: int
    ) -> dict:
        """Prepare `batch`, train on it -> statistics, per-row outputs over its valid rows."""


def sampler_grad_updates(batch: SampleBatch) -> float | None:
    """The batch's sampler count; a plain dict of columns (accepted as a batch) names none."""
    return getattr(batch, "num_grad_updates", None)
