"""V-trace over a train batch laid out as units: one unit per trajectory chunk.

IMPALA-style losses need time-major `[T, B]` inputs, one column per piece of a
trajectory. A train batch becomes that layout here:

    train = sequence_units(train)        # prepare time, numpy: non-recurrent rows ->
                                         # one padded unit per chunk (recurrent batches
                                         # are sequences already)
    vs, pg_adv = vtrace_on_units(...)    # in the loss: V-trace per unit, back in rows

A chunk is one sub-env, one episode and one fragment (eps_id, unroll_id); a
recurrent batch's units are its sequences of at most max_seq_len. Each unit
bootstraps from the learner's value of its last row's new_obs; a termination
zeroes the discount there, a truncation or a cut does not. Padding is made
transparent to the recursion (rho 1, reward 0, discount 1, value = the
bootstrap), so the valid rows get exactly per-unit V-trace.
"""

from __future__ import annotations

import tensorflow as tf

from policy_service.data.sample_batch import SampleBatch
from policy_service.data.sequencing import chop_into_sequences, loss_mask
from policy_service.data.train_batches import TrainColumns
from policy_service.data.units import LOSS_MASK, SEQ_LENS
from policy_service.returns import vtrace

_CHUNK_IDS = (SampleBatch.EPS_ID, SampleBatch.UNROLL_ID)


def sequence_units(train: TrainColumns) -> TrainColumns:
    """Flat prepared columns (one row per unit) -> one right-padded unit per
    trajectory chunk, T = the longest chunk; recurrent batches are returned as
    they are (their units are sequences already)."""
    if SEQ_LENS in train.columns:
        return train
    columns = dict(train.columns)
    for name in _CHUNK_IDS:
        if name not in columns:
            raise ValueError(
                f"train batch is missing column {name!r}, which cuts it into trajectory "
                f"chunks for V-trace; columns: {sorted(columns)}"
            )
    columns.pop(LOSS_MASK)
    names = list(columns)
    padded, _, seq_lens = chop_into_sequences(
        feature_columns=[columns[n] for n in names],
        state_columns=[],
        max_seq_len=train.units,
        episode_ids=columns[SampleBatch.EPS_ID],
        unroll_ids=columns[SampleBatch.UNROLL_ID],
        agent_indices=columns.get(SampleBatch.AGENT_INDEX),
        dynamic_max=True,
    )
    length = int(seq_lens.max())
    out = dict(zip(names, padded))
    out[SEQ_LENS] = seq_lens
    out[LOSS_MASK] = loss_mask(seq_lens, length)
    return TrainColumns(out, len(seq_lens), length)


def time_major(x: tf.Tensor, num_units: tf.Tensor) -> tf.Tensor:
    """<[units * T]> rows -> <[T, units]>."""
    return tf.transpose(tf.reshape(x, [num_units, -1]))


def rows_major(x: tf.Tensor) -> tf.Tensor:
    """<[T, units]> -> <[units * T]> rows, the inverse of `time_major`."""
    return tf.reshape(tf.transpose(x), [-1])


def last_rows(train_batch: dict) -> tf.Tensor:
    """<int32>[units]: each unit's last valid row (its first for an empty padding unit)."""
    seq_lens = tf.cast(train_batch[SEQ_LENS], tf.int32)
    units = tf.shape(seq_lens)[0]
    length = tf.shape(train_batch[LOSS_MASK])[0] // units
    return tf.range(units) * length + tf.maximum(seq_lens - 1, 0)


def bootstrap_values(model, train_batch: dict, model_out: dict) -> tf.Tensor:
    """<float32>[units] V(new_obs of each unit's last row), training=False, no gradient.
    A recurrent model continues from the state its pass over the unit ended in."""
    rows = last_rows(train_batch)
    inputs = {SampleBatch.OBS: tf.gather(train_batch[SampleBatch.NEXT_OBS], rows)}
    states = list(model_out.get("state_out", []))
    if states:
        inputs.update({f"state_in_{i}": s for i, s in enumerate(states)})
        inputs[SEQ_LENS] = tf.ones_like(train_batch[SEQ_LENS], tf.int32)
        inputs[SampleBatch.PREV_ACTIONS] = tf.gather(train_batch[SampleBatch.ACTIONS], rows)
        inputs[SampleBatch.PREV_REWARDS] = tf.gather(train_batch[SampleBatch.REWARDS], rows)
    return tf.stop_gradient(model(inputs, training=False)[SampleBatch.VF_PREDS])


def vtrace_on_units(
    *,
    log_rhos: tf.Tensor,
    values: tf.Tensor,
    bootstrap_value: tf.Tensor,
    train_batch: dict,
    gamma: float,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float = 1.0,
) -> vtrace.VTraceReturns:
    """V-trace per unit -> (vs, pg_advantages) <float32>[units * T], row layout.

    log_rhos, values: <float32>[units * T] rows; bootstrap_value <float32>[units].
    Rewards and terminateds are read from `train_batch`; padded rows come back
    finite and must be masked by the caller (loss_mask)."""
    units = tf.shape(train_batch[SEQ_LENS])[0]
    mask = time_major(train_batch[LOSS_MASK], units)
    # padding repeats the bootstrap value: its deltas are 0 and the last valid row
    # sees V(x_T) = bootstrap as its next value
    padded_values = tf.broadcast_to(bootstrap_value[None], tf.shape(mask))
    terminated = tf.cast(time_major(train_batch[SampleBatch.TERMINATEDS], units), tf.float32)
    returns = vtrace.from_importance_weights(
        log_rhos=tf.where(mask, time_major(log_rhos, units), 0.0),
        discounts=tf.where(mask, gamma * (1.0 - terminated), 1.0),
        rewards=tf.where(
            mask, tf.cast(time_major(train_batch[SampleBatch.REWARDS], units), tf.float32), 0.0
        ),
        values=tf.where(mask, time_major(values, units), padded_values),
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    return vtrace.VTraceReturns(rows_major(returns.vs), rows_major(returns.pg_advantages))
