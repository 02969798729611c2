"""Reductions over the valid (unpadded) rows of a tower's shard."""

import tensorflow as tf


def masked_mean(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Mean of `x` <float>[rows, ...] over rows where `mask` <bool>[rows] is True.

    A shard with no valid rows gives 0, not NaN: its tower weight is 0 then,
    and 0 * NaN would poison the combined gradient.
    """
    x = tf.convert_to_tensor(x)
    weights = tf.cast(mask, x.dtype)
    while weights.shape.rank < x.shape.rank:
        weights = weights[..., None]
    weights = tf.broadcast_to(weights, tf.shape(x))
    # where, not multiply: padded rows may hold inf/NaN (e.g. log of 0) and 0 * inf is NaN
    total = tf.reduce_sum(tf.where(weights > 0, x, tf.zeros_like(x)))
    return tf.math.divide_no_nan(total, tf.reduce_sum(weights))
