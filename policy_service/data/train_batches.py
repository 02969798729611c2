"""Train batches as the tower stack takes them: checked, preprocessed, padded
numpy columns with a "loss_mask" column, counted in units.

A unit is one row, or one padded sequence of T rows for recurrent models;
sequence columns ("seq_lens", "state_in_*") have one row per unit.

The tower stack carries one array per column, so a nested column (the actions of
a Tuple or Dict action space, say) travels as one column per leaf, named
`leaf_column(name, path)` ('actions@[0]', 'actions@["move"]'); `nest_columns`
puts the leaves back together for the loss, which reads the column as it was.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import tree

from policy_service.data import spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.sequencing import (
    chop_into_sequences,
    loss_mask,
    pad_batch_to_sequences_of_same_size,
)
from policy_service.data.units import LOSS_MASK, is_sequence_column


class LossColumn(NamedTuple):
    """What a loss reads from one train-batch column, checked before any tensor work."""

    kind: str = "float"  # "float": any float dtype; "number": any int or float dtype
    shape: tuple | None = ()  # per-row shape (() for one number per row); None: any


class TrainLayout(NamedTuple):
    """What preparing a train batch needs to know of the policy that learns on it."""

    preprocessor: spaces.ObservationPreprocessor
    action_space: gym.Space
    num_state_tensors: int  # 0: not recurrent
    max_seq_len: int
    dist_inputs_width: int  # the action distribution's inputs per row


class TrainColumns(NamedTuple):
    """A prepared train batch."""

    columns: dict  # name -> numpy array; row columns have units * rows_per_unit rows
    units: int  # rows, or padded sequences
    rows_per_unit: int  # 1, or the padded sequence length T


def prepare_train_columns(
    batch, layout: TrainLayout, *, loss_columns: dict | None = None, fixed_seq_len: bool = False
) -> TrainColumns:
    """Check and preprocess a train batch; recurrent batches are chopped into padded
    sequences (T = max_seq_len when `fixed_seq_len`, else the longest one).
    `loss_columns` (name -> LossColumn) are the columns the loss reads."""
    if not isinstance(batch, dict):  # a SampleBatch is a dict
        raise TypeError(
            f"train batch must be a SampleBatch or a dict of columns, got {type(batch).__name__}"
        )
    if not isinstance(batch, SampleBatch):
        batch = SampleBatch(batch)
    if batch.count == 0:
        raise ValueError("train batch is empty")
    if SampleBatch.OBS not in batch:
        raise ValueError(
            f"train batch is missing column 'obs', which every model reads; "
            f"columns: {sorted(batch)}"
        )
    check_loss_columns(batch, loss_columns or {})
    _check_dist_inputs(batch, layout.dist_inputs_width)
    preprocessor, num_state_tensors = layout.preprocessor, layout.num_state_tensors
    batch = batch.copy(shallow=True)
    for column in (SampleBatch.OBS, SampleBatch.NEXT_OBS):
        if column in batch:
            batch[column] = preprocessor.transform_compact(batch[column], column=column)
    if SampleBatch.ACTIONS in batch:
        spaces.check_actions(layout.action_space, batch[SampleBatch.ACTIONS], check_bounds=False)
    for key in [k for k in batch if _drop_for_training(k, batch[k])]:
        del batch[key]
    check_finite_columns(batch)
    nested = [k for k in batch if tree.is_nested(batch[k])]
    leaves = flatten_nested_columns({k: batch[k] for k in nested})
    for key in nested:
        del batch[key]
    for key, values in leaves.items():
        batch[key] = values
    if num_state_tensors:
        return _sequence_columns(batch, num_state_tensors, layout.max_seq_len, fixed_seq_len)
    columns = {k: _as_tensor_array(k, v) for k, v in batch.items()}
    columns[LOSS_MASK] = np.ones(batch.count, bool)
    return TrainColumns(columns, batch.count, 1)


def _sequence_columns(
    batch: SampleBatch, num_state_tensors: int, max_seq_len: int, fixed_seq_len: bool
) -> TrainColumns:
    for i in range(num_state_tensors):
        if f"state_in_{i}" not in batch:
            raise ValueError(
                f"recurrent train batch is missing column 'state_in_{i}' "
                f"(initial state of each sequence); columns: {sorted(batch)}"
            )
    if SampleBatch.SEQ_LENS not in batch and SampleBatch.EPS_ID not in batch:
        raise ValueError(
            "recurrent train batch needs 'seq_lens' or 'eps_id' to form "
            f"sequences; columns: {sorted(batch)}"
        )
    if not batch.zero_padded:
        pad_batch_to_sequences_of_same_size(batch, max_seq_len)
    seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], np.int32)
    num_seqs = len(seq_lens)
    length = batch.max_seq_len
    assert length is not None  # set whenever a batch has seq_lens, as it has now
    columns = {k: _as_tensor_array(k, v) for k, v in batch.items()}
    if fixed_seq_len and length != max_seq_len:
        columns = {
            k: v if is_sequence_column(k) else _pad_time(v, num_seqs, length, max_seq_len)
            for k, v in columns.items()
        }
        length = max_seq_len
    columns[SampleBatch.SEQ_LENS] = seq_lens
    columns[LOSS_MASK] = loss_mask(seq_lens, length)
    return TrainColumns(columns, num_seqs, length)


def without_short_minibatch(
    batch: SampleBatch, minibatch_size: int, max_seq_len: int | None = None
) -> SampleBatch:
    """`batch` less the rows of its last minibatch when that one would be shorter than
    half a minibatch: a full optimizer step on a sliver (one real row of 128) weighs
    it like a whole minibatch. RLlib drops a leftover too. Units are counted as a
    loaded batch's minibatches are: rows, or, with `max_seq_len` (a recurrent policy),
    sequences of up to max_seq_len rows (`seq_lens`, else cut by eps_id, unroll_id and
    agent_index), minibatch_size / max_seq_len of them a minibatch. The last rows go;
    a batch of at most one minibatch is kept whole."""
    rows_per_unit = 1 if max_seq_len is None else int(max_seq_len)
    units_per_minibatch = max(1, minibatch_size // rows_per_unit)
    unit_rows = _unit_rows(batch, max_seq_len)
    leftover = len(unit_rows) % units_per_minibatch
    if len(unit_rows) <= units_per_minibatch or not 0 < 2 * leftover < units_per_minibatch:
        return batch
    return batch.slice(0, batch.count - int(unit_rows[-leftover:].sum()))


def _unit_rows(batch: SampleBatch, max_seq_len: int | None) -> np.ndarray:
    """<int>[units]: the rows of each unit, in batch order."""
    if max_seq_len is None:
        return np.ones(batch.count, np.int64)
    if SampleBatch.SEQ_LENS in batch:
        return np.asarray(batch[SampleBatch.SEQ_LENS], np.int64)
    id_columns = (SampleBatch.EPS_ID, SampleBatch.UNROLL_ID, SampleBatch.AGENT_INDEX)
    ids = [batch.get(c) for c in id_columns]
    if ids[0] is None:
        raise ValueError(
            "recurrent train batch needs 'seq_lens' or 'eps_id' to form "
            f"sequences; columns: {sorted(batch)}"
        )
    *_, seq_lens = chop_into_sequences(
        feature_columns=[],
        state_columns=[],
        max_seq_len=int(max_seq_len),
        episode_ids=ids[0],
        unroll_ids=ids[1],
        agent_indices=ids[2],
    )
    return np.asarray(seq_lens, np.int64)


def check_loss_columns(batch: SampleBatch, loss_columns: dict) -> None:
    """Each column the loss reads is present, of its kind of dtype and per-row shape;
    else an error naming the column, what was expected and what is there."""
    for name, want in loss_columns.items():
        if name not in batch:
            raise ValueError(
                f"train batch is missing column {name!r}, which the loss reads; "
                f"columns: {sorted(batch)}"
            )
        for leaf in tree.flatten(batch[name]):
            values = np.asarray(leaf)
            kinds = "f" if want.kind == "float" else "iuf"
            if values.dtype.kind not in kinds:
                raise ValueError(
                    f"column {name!r} has dtype {values.dtype}, expected "
                    f"{'a float' if want.kind == 'float' else 'a numeric'} dtype"
                )
            if want.shape is not None and values.shape[1:] != tuple(want.shape):
                expected = ("rows",) + tuple(want.shape)
                raise ValueError(
                    f"column {name!r} has shape {values.shape}, expected "
                    f"({', '.join(map(str, expected))})"
                )


# marks a leaf of a nested column: name, mark, the leaf's dm-tree path as JSON
NEST_MARK = "@"


def leaf_column(name: str, path: tuple) -> str:
    """The flat column that carries the leaf at `path` of nested column `name`."""
    return f"{name}{NEST_MARK}{json.dumps(list(path))}"


def flatten_nested_columns(batch: dict) -> dict:
    """The columns with each nested one replaced by one column per leaf (leaf_column
    names). A nest the tower stack cannot carry (no arrays, a leaf without rows or
    with another row count, a path of other than indices and string keys) is an
    error naming the column."""
    out = {}
    for name, values in batch.items():
        if not tree.is_nested(values):
            out[name] = values
            continue
        leaves = tree.flatten_with_path(values)
        shapes = {tuple(p): np.shape(leaf) for p, leaf in leaves}
        rows = {shape[0] if shape else None for shape in shapes.values()}
        keys_ok = all(isinstance(k, (int, str)) for p in shapes for k in p)
        if not leaves or len(rows) != 1 or None in rows or not keys_ok:
            raise ValueError(
                f"train batch column {name!r} is nested ({len(leaves)} arrays of shapes "
                f"{ {action_path: s for action_path, s in list(shapes.items())[:4]} }); the "
                "tower stack carries a nest of arrays with the same rows, indexed by "
                "positions and string keys, so it cannot reach the loss"
            )
        out.update({leaf_column(name, tuple(p)): leaf for p, leaf in leaves})
    return out


def nest_columns(columns: dict) -> dict:
    """Leaf columns (leaf_column names) put back into their nested columns; a batch
    without any comes back as it is."""
    if not any(NEST_MARK in name for name in columns):
        return columns
    out: dict = {}
    nests: dict = {}
    for name, values in columns.items():
        base, mark, path = name.partition(NEST_MARK)
        if not mark:
            out[name] = values
            continue
        node = nests.setdefault(base, {})
        keys = json.loads(path)
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = values
    out.update({base: _as_nest(node) for base, node in nests.items()})
    return out


def _as_nest(node):
    """Dicts keyed 0..n-1 become tuples (dm-tree gives positions for sequences)."""
    if not isinstance(node, dict):
        return node
    items = {key: _as_nest(value) for key, value in node.items()}
    if all(isinstance(key, int) for key in items):
        return tuple(items[i] for i in range(len(items)))
    return items


def _check_dist_inputs(batch: SampleBatch, width: int) -> None:
    """The behaviour policy's distribution inputs, as wide as this policy's."""
    if SampleBatch.ACTION_DIST_INPUTS not in batch:
        return
    shape = np.shape(batch[SampleBatch.ACTION_DIST_INPUTS])
    if shape[1:] != (width,):
        raise ValueError(
            f"column 'action_dist_inputs' has shape {shape}, expected (rows, {width}): "
            "this policy's action distribution takes that many inputs per row"
        )


def check_finite_columns(batch: dict) -> None:
    """NaN/inf anywhere in a float column is an error naming the column and row."""
    for name, values in batch.items():
        for leaf in tree.flatten(values):
            arr = np.asarray(leaf)
            if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                row = int(np.argwhere(~np.isfinite(arr))[0][0])
                raise ValueError(
                    f"column {name!r} has NaN or inf (first at row {row}, "
                    f"shape {arr.shape}); weights unchanged"
                )


def _drop_for_training(name: str, values) -> bool:
    """Columns no loss reads as tensors: infos, object or text arrays, next-step states."""
    if name == SampleBatch.INFOS or name.startswith("state_out_"):
        return True
    return any(np.asarray(leaf).dtype.kind in "OUS" for leaf in tree.flatten(values))


def _as_tensor_array(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == np.float64:
        return arr.astype(np.float32)
    if arr.dtype.kind in "iub" or arr.dtype == np.float32:
        return arr
    raise ValueError(f"column {name!r} has dtype {arr.dtype}, which cannot be trained on")


def _pad_time(values: np.ndarray, num_seqs: int, length: int, target: int) -> np.ndarray:
    shaped = values.reshape((num_seqs, length) + values.shape[1:])
    pad = np.zeros((num_seqs, target - length) + values.shape[1:], values.dtype)
    return np.concatenate([shaped, pad], axis=1).reshape((num_seqs * target,) + values.shape[1:])
