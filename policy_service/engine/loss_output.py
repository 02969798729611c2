"""What a loss returns: its losses, and what else it computed on the way.

    def loss(self, model, dist_class, train_batch):
        td = ...                                   # <float32>[rows] of this tower's shard
        loss = masked_mean(huber_loss(td), train_batch["loss_mask"])
        return loss, LossExtras(stats={"mean_td_error": masked_mean(td, mask)},
                                per_row={"td_error": td})

A plain tensor, or a list with one loss per optimizer, is still a loss output
(with no extras); `TFPolicy.stats(train_batch)` may still add statistics.
"""

from __future__ import annotations

from typing import NamedTuple

PER_ROW = "per_row"  # a learning call's result key: the loss's per-row outputs (name -> array)


class LossExtras(NamedTuple):
    """stats: name -> scalar tensor, combined over towers and learners weighted by
    their valid rows (as every statistic). per_row: name -> <float>[rows] tensor, one
    value per row of the tower's shard, returned unreduced by the same compiled step
    under PER_ROW: valid rows only, in batch order (towers and learners
    concatenated back)."""

    stats: dict = {}
    per_row: dict = {}


def split_loss_output(output) -> tuple[list, LossExtras]:
    """A loss's return value -> (its losses as a list, its extras)."""
    extras = LossExtras()
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], LossExtras):
        output, extras = output
    losses = list(output) if isinstance(output, (list, tuple)) else [output]
    return losses, extras
