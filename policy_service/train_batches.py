"""Train batches as the tower stack takes them: checked, preprocessed, padded
numpy columns with a "loss_mask" column, counted in units.

A unit is one row, or one padded sequence of T rows for recurrent models;
sequence columns ("seq_lens", "state_in_*") have one row per unit.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import tree

from policy_service import spaces
from policy_service.engine.units import LOSS_MASK, is_sequence_column
from policy_service.sample_batch import SampleBatch
from policy_service.sequencing import loss_mask, pad_batch_to_sequences_of_same_size


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
        spaces.check_actions(
            layout.action_space, np.asarray(batch[SampleBatch.ACTIONS]), check_bounds=False
        )
    for key in [k for k in batch if _drop_for_training(k, batch[k])]:
        del batch[key]
    check_flat_columns(batch)
    check_finite_columns(batch)
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


def check_flat_columns(batch: dict) -> None:
    """Every column left is one array: the tower stack carries no nested column but the
    observations (flat once preprocessed), so one is an error naming it, not dropped."""
    for name, values in batch.items():
        paths = [tree_path for tree_path, _ in tree.flatten_with_path(values)]
        if len(paths) != 1 or paths[0] != ():
            raise ValueError(
                f"train batch column {name!r} is nested ({len(paths)} arrays at "
                f"{[list(p) for p in paths][:4]}); the tower stack takes one array per "
                "column (only obs and new_obs may be nested), so it cannot reach the loss"
            )


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
