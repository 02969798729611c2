"""A prepared train batch split across learners, at unit boundaries only.

A unit is one row, or one padded sequence of T rows (recurrent models), as in
`policy_service.data.train_batches`. Shards get whole units and equal unit counts:
the batch is padded with units that count for nothing (loss_mask False,
seq_lens 0), so every learner runs the same compiled steps, the same number of
times, and takes part in every collective.
"""

from __future__ import annotations

from policy_service.data.train_batches import TrainColumns
from policy_service.data.units import (
    arrange_minibatches,
    check_minibatch_size,
    is_sequence_column,
    pad_units,
    round_up,
)


def split_units(train: TrainColumns, num_shards: int) -> list[TrainColumns]:
    """Consecutive runs of whole units, one per shard, padded to equal counts
    (for one step on the whole batch: any split gives the same combined step)."""
    target = round_up(max(train.units, 1), num_shards)
    columns = pad_units(train.columns, train.units, target)
    per_shard = target // num_shards
    return [
        TrainColumns(
            _units(columns, i * per_shard, per_shard, train.rows_per_unit),
            per_shard,
            train.rows_per_unit,
        )
        for i in range(num_shards)
    ]


def split_minibatches(
    train: TrainColumns,
    num_shards: int,
    minibatch_size: int,
    towers_per_shard: int,
    accumulation_steps: int = 1,
) -> list[TrainColumns]:
    """Shards for loaded buffers: shard i holds its 1/N of every minibatch, so the
    group's minibatch k (rows [k*mb, (k+1)*mb) of the padded batch) is the union
    of the shards' minibatch k, and every shard has the same number of them
    (rounded up to whole accumulation steps, as each learner's tower stack does).

    minibatch_size: rows per minibatch over all shards; each shard then loads
    minibatches of minibatch_size / num_shards rows."""
    check_minibatch_size(
        "minibatch_size",
        minibatch_size,
        learners=num_shards,
        towers=towers_per_shard,
        unit_rows=train.rows_per_unit,
    )
    shards, num_mb = arrange_minibatches(
        train.columns,
        train.units,
        train.rows_per_unit,
        minibatch_size,
        num_shards,
        accumulation_steps,
    )
    per_shard = minibatch_size // train.rows_per_unit // num_shards
    return [TrainColumns(shard, num_mb * per_shard, train.rows_per_unit) for shard in shards]


def _units(columns: dict, first: int, count: int, rows_per_unit: int) -> dict:
    """Units [first, first + count): sequence columns by unit, row columns by row."""
    return {
        name: values[first : first + count]
        if is_sequence_column(name)
        else values[first * rows_per_unit : (first + count) * rows_per_unit]
        for name, values in columns.items()
    }
