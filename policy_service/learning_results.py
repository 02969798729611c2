"""What a learning call returns: scalar statistics, "num_samples_trained", and the
loss's per-row outputs under PER_ROW (engine/loss_output.py)."""

from __future__ import annotations

import numpy as np

from policy_service.engine.loss_output import PER_ROW
from policy_service.engine.towers import LOSS_MASK
from policy_service.train_batches import TrainColumns

NUM_SAMPLES_TRAINED = "num_samples_trained"  # update()'s count of samples trained on


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
