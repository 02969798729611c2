"""The unit layout of a train batch: how rows group into the pieces we split.

A unit is one row, or one padded sequence of T rows for recurrent models. Row
columns hold units*T rows; sequence columns ("seq_lens", "state_in_*") one row
per unit. Towers and learners get whole units only, so a sequence is never cut,
and padding units (loss_mask False, seq_lens 0) even the counts out so that
every tower and learner runs the same compiled step.

The learner group (distributed/learner_shards.py) and each learner's tower
stack (towers.py) lay minibatches out with the same `arrange_minibatches`, so
the group's minibatch k is the union of the towers' minibatch k on every
learner, and `check_minibatch_size` is the one rule for a minibatch that splits.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

LOSS_MASK = "loss_mask"
SEQ_LENS = "seq_lens"


def is_sequence_column(name: str) -> bool:
    """Columns with one row per sequence rather than per time step."""
    return name == SEQ_LENS or name.startswith("state_in_")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def rows_per_unit(columns: dict, num_units: int) -> int:
    """T for sequence batches, 1 otherwise, read from the loss mask's length."""
    rows = len(columns[LOSS_MASK])
    if num_units == 0 or rows % num_units:
        raise ValueError(f"{rows} rows do not split into {num_units} equal units")
    return rows // num_units


def pad_units(columns: dict, num_units: int, target_units: int) -> dict:
    """Append units up to `target_units` that count for nothing (loss_mask False,
    seq_lens 0). They repeat real units rather than zeros, so a loss that is
    finite on real data (say log of a positive column) is finite there too:
    masking drops padding in the forward pass, but 0 * inf is NaN backwards."""
    if target_units == num_units:
        return columns
    unit_rows = rows_per_unit(columns, num_units)
    source_units = np.arange(target_units - num_units) % num_units
    source_rows = (source_units[:, None] * unit_rows + np.arange(unit_rows)).ravel()
    out = {}
    for name, values in columns.items():
        extra = values[source_units if is_sequence_column(name) else source_rows]
        if name in (LOSS_MASK, SEQ_LENS):
            extra = np.zeros_like(extra)
        out[name] = np.concatenate([values, extra])
    return out


def gather_units(buffer: dict, unit_idx: tf.Tensor) -> dict:
    """Rows of the given units: sequence columns by unit, row columns by the
    unit's T rows. unit_idx <int32>[units]."""
    if SEQ_LENS in buffer:
        units = tf.shape(buffer[SEQ_LENS])[0]
        unit_rows = tf.shape(buffer[LOSS_MASK])[0] // units
        row_idx = tf.reshape(unit_idx[:, None] * unit_rows + tf.range(unit_rows)[None, :], [-1])
    else:
        row_idx = unit_idx
    return {
        name: tf.gather(values, unit_idx if is_sequence_column(name) else row_idx)
        for name, values in buffer.items()
    }


def check_minibatch_size(
    key: str, minibatch_size: int, *, learners: int, towers: int, unit_rows: int
) -> None:
    """A minibatch must split into whole sequences, equally over every learner's
    towers: a ValueError naming `key` and the values otherwise."""
    quantum = learners * towers * unit_rows
    if minibatch_size % quantum:
        raise ValueError(
            f"{key}={minibatch_size} must be a multiple of {learners} learner(s) x "
            f"{towers} tower(s) x {unit_rows} row(s) per sequence = {quantum}"
        )


def arrange_minibatches(
    columns: dict,
    num_units: int,
    unit_rows: int,
    minibatch_size: int,
    num_parts: int,
    accumulation_steps: int = 1,
) -> tuple[list[dict], int]:
    """Split a padded batch into `num_parts` parts (learners, or one learner's
    towers) so that part i holds its 1/num_parts of every minibatch: minibatch k
    (rows [k*mb, (k+1)*mb) of the batch) is the union of the parts' minibatch k.
    Padding units round the minibatch count up to whole accumulation steps.

    Returns (parts, number of minibatches); each part has
    num_minibatches * minibatch_size / num_parts rows (contiguous arrays).
    minibatch_size must already pass check_minibatch_size."""
    units_per_mb = minibatch_size // unit_rows
    num_mb = round_up(max(1, -(-num_units // units_per_mb)), accumulation_steps)
    columns = pad_units(columns, num_units, num_mb * units_per_mb)
    per_part = units_per_mb // num_parts
    parts: list[dict] = [{} for _ in range(num_parts)]
    for name, values in columns.items():
        unit = 1 if is_sequence_column(name) else unit_rows
        arranged = values.reshape((num_mb, num_parts, per_part * unit) + values.shape[1:])
        for i in range(num_parts):
            parts[i][name] = np.ascontiguousarray(arranged[:, i]).reshape((-1,) + values.shape[1:])
    return parts, num_mb


def interleave_minibatches(parts: list, num_minibatches: int) -> np.ndarray:
    """Rows of a loaded batch back in batch order from its parts (towers, or
    learners), each holding its slice of every minibatch in turn."""
    return np.stack(
        [p.reshape((num_minibatches, -1) + p.shape[1:]) for p in parts], axis=1
    ).reshape((-1,) + parts[0].shape[1:])
