"""What a learning call returns: scalar statistics, "num_samples_trained", the
policy's "num_grad_updates_lifetime" and its lead over the batch's sampler, and the
per-row outputs (a loss's LossExtras or a policy's stats() of shape [rows]) under
PER_ROW (engine/loss_output.py).
`learn_on_batch` and `learn_on_loaded_batch` give RLlib's layout (`rllib_layout`)."""

from __future__ import annotations

import numpy as np

from policy_service.data.train_batches import TrainColumns
from policy_service.engine.loss_output import PER_ROW
from policy_service.engine.towers import LOSS_MASK

NUM_SAMPLES_TRAINED = "num_samples_trained"  # update()'s count of samples trained on
NUM_GRAD_UPDATES_LIFETIME = "num_grad_updates_lifetime"  # the policy's SGD steps so far
DIFF_NUM_GRAD_UPDATES = "diff_num_grad_updates_vs_sampler_policy"
LEARNER_STATS = "learner_stats"


def rllib_layout(stats: dict, sampler_grad_updates: float | None = None) -> dict:
    """A learning call's statistics in RLlib's layout: {"learner_stats": the scalar
    statistics, "num_grad_updates_lifetime": n, "diff_num_grad_updates_vs_sampler_policy"
    (`with_sampler_lead`)}, the per-row outputs (extra fetches) beside them, and the
    flat statistics kept too, so callers reading stats["total_loss"] go on working."""
    lifetime = int(stats[NUM_GRAD_UPDATES_LIFETIME])
    scalars = {k: v for k, v in stats.items() if k not in (PER_ROW, NUM_GRAD_UPDATES_LIFETIME)}
    return {
        **with_sampler_lead(stats, sampler_grad_updates),
        LEARNER_STATS: scalars,
        NUM_GRAD_UPDATES_LIFETIME: lifetime,
    }


def with_sampler_lead(stats: dict, sampler_grad_updates: float | None) -> dict:
    """The statistics with "diff_num_grad_updates_vs_sampler_policy": RLlib's `n - 1 -
    (the batch's num_grad_updates or 0)` for each SGD step (n: the policy's count after
    it), so 0 for the first step on a batch sampled with the weights it started from;
    over the call's "num_sgd_steps" steps (minibatches of all epochs), their mean, as
    RLlib's learner info averages its minibatches' results."""
    lifetime = int(stats[NUM_GRAD_UPDATES_LIFETIME])
    steps = int(stats.get("num_sgd_steps", 1))
    first = lifetime - steps + 1  # the count after the call's first step
    lead = (first + lifetime) / 2 - 1 - float(sampler_grad_updates or 0)
    return {**stats, DIFF_NUM_GRAD_UPDATES: lead}


def samples_trained(stats: dict) -> int:
    """Valid rows trained on, from a learning call's statistics: "valid_rows" is per
    SGD step (the mean over the steps of a loaded-epochs call, "num_sgd_steps")."""
    if "valid_rows" not in stats:
        raise KeyError(f"learning statistics lack 'valid_rows' (have {sorted(stats)})")
    return round(float(stats["valid_rows"]) * float(stats.get("num_sgd_steps", 1)))


def with_samples_trained(stats: dict) -> dict:
    return {**stats, NUM_SAMPLES_TRAINED: samples_trained(stats)}


def first_rows(stats: dict, rows: int) -> dict:
    """The statistics with per-row outputs cut to the first `rows` rows (the padding
    that sharding appended after them dropped)."""
    if PER_ROW not in stats:
        return stats
    return {**stats, PER_ROW: {name: values[:rows] for name, values in stats[PER_ROW].items()}}


def valid_rows_only(stats: dict, train: TrainColumns) -> dict:
    """The statistics with per-row outputs over all of `train`'s rows reduced to its
    valid rows (loss_mask True), in order."""
    if PER_ROW not in stats:
        return stats
    mask = np.asarray(train.columns[LOSS_MASK], bool)
    return {
        **stats,
        PER_ROW: {name: values[: len(mask)][mask] for name, values in stats[PER_ROW].items()},
    }
