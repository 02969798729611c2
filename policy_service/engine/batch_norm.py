"""Batch norm over towers and learners: one device's batch norm on the whole batch.

While the towers are traced, every Keras BatchNormalization layer writes its
batch moments into its moving statistics (momentum 0); the stack reads them
back from each tower, combines them over all towers' and learners' valid rows
(`combine_tower_moments`, then `shifted_for_sum` / `unshifted` around the
all-reduce) and applies them once, with the layer's own momentum
(`moving_statistics`), once per step.

With batch_norm_sync each tower also normalizes by the whole batch's moments:
its layers' moments come from a `MomentSum` over every tower and learner, so
loss and gradient are one device's too. Without it each tower normalizes by
its own shard (an approximation, as in RLlib and DDP).

Padding never enters a moment: a layer called without a mask gets the tower's
row mask (`row_mask_like`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import keras
import tensorflow as tf


def batch_norm_layers(model: keras.Model) -> list:
    """Every Keras BatchNormalization layer of the model whose statistics we combine."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
    for layer in layers:
        if layer.renorm:
            raise ValueError(
                f"batch norm layer {layer.name!r} uses renorm, which the "
                "tower stack cannot combine across towers"
            )
        if layer.synchronized:
            raise ValueError(
                f"batch norm layer {layer.name!r} has synchronized=True; "
                "the tower stack combines statistics itself, turn it off"
            )
    return layers


class BatchNormCapture:
    """While tower forwards are traced, each BN layer writes its batch moments
    (momentum 0), which the stack reads back and combines over all towers'
    valid rows, then applies with the layer's own momentum.

    A model that calls batch norm without a mask (most user models) gets the
    tower's row mask put in, so padding never enters the moments; `row_mask`
    is set to each tower's mask in turn.
    """

    def __init__(self, layers: list, moment_sum: MomentSum | None = None):
        self.layers = layers
        self.momenta = [layer.momentum for layer in layers]
        self.moment_sum = moment_sum  # None: each tower normalizes by its own moments
        self._row_mask = None

    @property
    def row_mask(self):
        return self._row_mask

    @row_mask.setter
    def row_mask(self, row_mask) -> None:
        """Set to each tower's mask in turn, in its device scope, before its forward."""
        self._row_mask = row_mask
        if self.moment_sum is not None:
            self.moment_sum.start_tower(row_mask)

    def __enter__(self) -> BatchNormCapture:
        if self.moment_sum is not None:
            self.moment_sum.start_step()
        for layer in self.layers:
            layer.momentum = 0.0
            # instance attributes, set past Keras's attribute tracking; Layer.__call__
            # calls self.call, and BatchNormalization.call self._moments
            layer.__dict__["call"] = self._masked_call(layer.call)
            if self.moment_sum is not None:
                layer.__dict__["_moments"] = whole_batch_moments(layer, self.moment_sum)
        return self

    def __exit__(self, *exc) -> None:
        for layer, momentum in zip(self.layers, self.momenta):
            layer.momentum = momentum
            del layer.__dict__["call"]
            layer.__dict__.pop("_moments", None)

    def _masked_call(self, call):
        def masked(inputs, training=None, mask=None):
            if mask is None and training and self.row_mask is not None:
                mask = row_mask_like(self.row_mask, inputs)
            return call(inputs, training=training, mask=mask)

        return masked


def whole_batch_moments(layer, moment_sum: MomentSum) -> Callable:
    """The layer's moments(inputs, mask) -> (mean, variance) <float32>[channels]
    over the valid rows of every tower and learner: counts and sums of x - c
    and (x - c)^2 summed by `moment_sum`, around c the layer's moving mean as
    the tower reads it (the same on every tower and learner), so the
    variance does not cancel away when the mean is large."""

    def moments(inputs, mask):
        axes = layer._reduction_axes
        shift = tf.reshape(
            tf.stop_gradient(tf.cast(layer.moving_mean, inputs.dtype)),
            _broadcast_shape(inputs.shape.rank, axes),
        )
        valid = (
            tf.ones_like(inputs, tf.bool)
            if mask is None
            else tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(inputs))
        )
        centred = tf.where(valid, inputs - shift, tf.zeros_like(inputs))
        local = tf.concat(
            [
                tf.reduce_sum(tf.cast(valid, inputs.dtype), axes),
                tf.reduce_sum(centred, axes),
                tf.reduce_sum(tf.square(centred), axes),
            ],
            0,
        )
        count, first, second = tf.split(moment_sum(local), 3)
        centred_mean = tf.math.divide_no_nan(first, count)
        variance = tf.maximum(tf.math.divide_no_nan(second, count) - tf.square(centred_mean), 0.0)
        return tf.reshape(shift, [-1]) + centred_mean, variance

    return moments


def _broadcast_shape(rank: int, reduction_axes: list) -> list:
    """The shape a per-channel vector broadcasts with against inputs of this rank."""
    return [1 if axis in reduction_axes else -1 for axis in range(rank)]


class MomentSum:
    """The sum of a tensor over every tower of a step and every learner, at run time.

    Towers are traced one after another into one graph, so while one tower's
    batch norm is traced no other tower's activations exist. Each call is
    instead one collective all-reduce op per tower, on its device, under a key
    every tower and learner derives alike (minibatch of the step, call number);
    the ops meet when the step runs. The gradient is an all-reduce as well:
    tower t contributes valid_t * upstream and divides the sum by valid_t, since
    the stack scales tower t's gradients by valid_t / valid after the backward
    pass; the combined gradient is then the whole batch's loss's.

    devices: the tower devices; num_learners: members of the collective group
    (each with as many towers); implementation: RING or NCCL.
    """

    def __init__(self, devices: Sequence[str], num_learners: int, implementation: str):
        self.devices = list(devices)
        self.group_size = len(self.devices) * num_learners
        self.hint = implementation.lower()
        # a collective group is one set of devices: a key of its own per set (not
        # CollectiveGroup's 4201/4202 but for a 1 in 2**31 chance)
        self.group_key = 1 + zlib.crc32(f"moments:{self.devices}:{num_learners}".encode()) % (
            2**31 - 2
        )
        self._tokens = []
        for device in self.devices:
            with tf.init_scope(), tf.device(device):  # orders the ops on a device, as
                self._tokens.append(
                    tf.Variable(  # CollectiveGroup does
                        0.0, trainable=False, name="moments_ordering_token"
                    )
                )
        self._tower = -1
        self._valid_rows = None
        self._calls = 0
        self._gradient_calls = 0

    def start_step(self) -> None:
        self._tower = -1

    def start_tower(self, row_mask: tf.Tensor) -> None:
        """The next tower's forward and backward are traced next; row_mask <bool>[rows]."""
        self._tower += 1
        self._calls = self._gradient_calls = 0
        self._valid_rows = tf.reduce_sum(tf.cast(row_mask, tf.float32))

    def __call__(self, local: tf.Tensor) -> tf.Tensor:
        """local <float32>[n] -> its sum over every tower and learner, [n]."""
        tower = self._tower % len(self.devices)
        minibatch = self._tower // len(self.devices)
        key = f"{minibatch}:{self._calls}:{local.shape.num_elements()}"
        self._calls += 1
        valid = self._valid_rows

        @tf.custom_gradient
        def summed(x):
            def gradient(upstream):
                backward = f"{key}:gradient:{self._gradient_calls}"
                self._gradient_calls += 1
                total = self._all_reduce(upstream * valid, tower, backward)
                return tf.math.divide_no_nan(total, valid)

            return self._all_reduce(x, tower, key), gradient

        return summed(local)

    def _all_reduce(self, x: tf.Tensor, tower: int, key: str) -> tf.Tensor:
        from tensorflow.python.ops import collective_ops  # the raw op has no public alias

        with tf.device(self.devices[tower]):
            return collective_ops.all_reduce_v2(
                x,
                group_size=self.group_size,
                group_key=self.group_key,
                instance_key=1 + zlib.crc32(key.encode()) % (2**31 - 2),
                merge_op="Add",
                final_op="Id",
                communication_hint=self.hint,
                ordering_token=self._tokens[tower].handle,
                name="batch_norm_moments_sum",
            )


def row_mask_like(row_mask: tf.Tensor, inputs: tf.Tensor) -> tf.Tensor:
    """The tower's row mask <bool>[rows] as a mask of inputs.shape[:-1].

    Inputs laid out by row ([rows, ...]) or by sequence ([num_seqs, T, ...]) get
    the mask broadcast over their inner axes; any other layout (say one row per
    sequence) has no padded rows to drop and is left unmasked.
    """
    shape = tf.shape(inputs)[:-1]
    rows = tf.size(row_mask)
    inner = inputs.shape.rank - 2

    def by_row():
        return tf.broadcast_to(
            tf.reshape(row_mask, tf.concat([shape[:1], tf.ones([inner], tf.int32)], 0)), shape
        )

    def by_sequence():
        return tf.broadcast_to(
            tf.reshape(row_mask, tf.concat([shape[:2], tf.ones([inner - 1], tf.int32)], 0)), shape
        )

    def unmasked():
        return tf.ones(shape, tf.bool)

    if inner == 0:
        return tf.cond(tf.equal(rows, shape[0]), by_row, unmasked)
    return tf.cond(
        tf.equal(rows, shape[0]),
        by_row,
        lambda: tf.cond(tf.equal(rows, shape[0] * shape[1]), by_sequence, unmasked),
    )


class BatchNormMoments(NamedTuple):
    """One BN layer's batch moments for a step, over every valid row combined."""

    layer: keras.layers.BatchNormalization
    momentum: float  # the layer's own (set to 0 while towers are traced)
    mean: tf.Tensor
    variance: tf.Tensor  # population variance


def combine_tower_moments(
    layers: list, momenta: list, updates: list, weighted: Callable[[list], list]
) -> list:
    """Each BN layer's batch mean and (population) variance over all towers'
    valid rows, from the towers' own moments.

    updates: per tower, id(variable) -> the value its forward pass wrote (the
    tower's moments); weighted(per_tower) -> each tower's tensor times its share
    of the valid rows, on its device."""
    moments = []
    for layer, momentum in zip(layers, momenta):
        if id(layer.moving_mean) not in updates[0]:
            continue  # layer not run in training mode
        means = [u[id(layer.moving_mean)] for u in updates]
        variances = [u[id(layer.moving_variance)] for u in updates]
        mean = tf.add_n(weighted(means))
        variance = tf.add_n(weighted([v + tf.square(m - mean) for m, v in zip(means, variances)]))
        moments.append(BatchNormMoments(layer, momentum, mean, variance))
    return moments


def shifted_for_sum(moments: list) -> tuple[list, list]:
    """(tensors to average over learners by valid rows, the shifts used).

    Variances travel as var + (mean - c)^2 = E[(x - c)^2] around a shift c every
    learner shares (the layer's moving mean: weights are identical on every
    learner), so the averaged second moment gives the whole batch's variance
    with no second collective and without losing it to cancellation when the
    mean is large."""
    shifts = [tf.convert_to_tensor(m.layer.moving_mean) for m in moments]
    tensors = []
    for m, shift in zip(moments, shifts):
        tensors += [m.mean, m.variance + tf.square(m.mean - shift)]
    return tensors, shifts


def unshifted(moments: list, shifts: list, averaged) -> list:
    """The moments again from `averaged`, an iterator over the averaged output
    of shifted_for_sum's tensors (two per layer, in order)."""
    combined = []
    for m, shift in zip(moments, shifts):
        batch_mean, second = next(averaged), next(averaged)
        combined.append(
            m._replace(
                mean=batch_mean, variance=tf.maximum(second - tf.square(batch_mean - shift), 0.0)
            )
        )
    return combined


def moving_statistics(moments: list) -> list:
    """(variable, new value) for each layer's moving mean and variance: the
    combined moments applied once, with the layer's own momentum."""
    assignments = []
    for m in moments:
        layer, momentum = m.layer, m.momentum
        assignments.append(
            (layer.moving_mean, momentum * layer.moving_mean + (1 - momentum) * m.mean)
        )
        assignments.append(
            (layer.moving_variance, momentum * layer.moving_variance + (1 - momentum) * m.variance)
        )
    return assignments
