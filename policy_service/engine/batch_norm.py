"""Batch norm over towers and learners: the layers' moments combined into one step.

While the towers are traced, every Keras BatchNormalization layer writes its
batch moments into its moving statistics (momentum 0); the stack reads them
back from each tower, combines them over all towers' and learners' valid rows
(`combine_tower_moments`, then `shifted_for_sum` / `unshifted` around the
all-reduce) and applies them once, with the layer's own momentum
(`moving_statistics`). So the moving statistics are those of the whole batch
on one device, however it is split.

Padding never enters a moment: a layer called without a mask gets the tower's
row mask (`row_mask_like`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import keras
import tensorflow as tf


def batch_norm_layers(model: keras.Model) -> list:
    """Every Keras BatchNormalization layer of the model whose statistics we combine."""
    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True)  # pylint: disable=protected-access
              if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in layers:
        if layer.renorm:
            raise ValueError(f"batch norm layer {layer.name!r} uses renorm, which the "
                             "tower stack cannot combine across towers")
        if layer.synchronized:
            raise ValueError(f"batch norm layer {layer.name!r} has synchronized=True; "
                             "the tower stack combines statistics itself, turn it off")
    return layers


class BatchNormCapture:
    """While tower forwards are traced, each BN layer writes its batch moments
    (momentum 0), which the stack reads back and combines over all towers'
    valid rows, then applies with the layer's own momentum.

    A model that calls batch norm without a mask (most user models) gets the
    tower's row mask put in, so padding never enters the moments; `row_mask`
    is set to each tower's mask in turn.
    """

    def __init__(self, layers: list):
        self.layers = layers
        self.momenta = [layer.momentum for layer in layers]
        self.row_mask = None

    def __enter__(self) -> BatchNormCapture:
        for layer in self.layers:
            layer.momentum = 0.0
            # an instance attribute, set past Keras's attribute tracking; Layer.__call__ calls self.call
            layer.__dict__["call"] = self._masked_call(layer.call)
        return self

    def __exit__(self, *exc) -> None:
        for layer, momentum in zip(self.layers, self.momenta):
            layer.momentum = momentum
            del layer.__dict__["call"]

    def _masked_call(self, call):
        def masked(inputs, training=None, mask=None):
            if mask is None and training and self.row_mask is not None:
                mask = row_mask_like(self.row_mask, inputs)
            return call(inputs, training=training, mask=mask)
        return masked


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
        return tf.broadcast_to(tf.reshape(row_mask, tf.concat([shape[:1], tf.ones([inner], tf.int32)], 0)), shape)

    def by_sequence():
        return tf.broadcast_to(
            tf.reshape(row_mask, tf.concat([shape[:2], tf.ones([inner - 1], tf.int32)], 0)), shape)

    def unmasked():
        return tf.ones(shape, tf.bool)

    if inner == 0:
        return tf.cond(tf.equal(rows, shape[0]), by_row, unmasked)
    return tf.cond(tf.equal(rows, shape[0]), by_row, lambda: tf.cond(
        tf.equal(rows, shape[0] * shape[1]), by_sequence, unmasked))


class BatchNormMoments(NamedTuple):
    """One BN layer's batch moments for a step, over every valid row combined."""

    layer: keras.layers.BatchNormalization
    momentum: float  # the layer's own (set to 0 while towers are traced)
    mean: tf.Tensor
    variance: tf.Tensor  # population variance


def combine_tower_moments(layers: list, momenta: list, updates: list,
                          weighted: Callable[[list], list]) -> list:
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
        variance = tf.add_n(weighted(
            [v + tf.square(m - mean) for m, v in zip(means, variances)]))
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
        combined.append(m._replace(mean=batch_mean, variance=tf.maximum(
            second - tf.square(batch_mean - shift), 0.0)))
    return combined


def moving_statistics(moments: list) -> list:
    """(variable, new value) for each layer's moving mean and variance: the
    combined moments applied once, with the layer's own momentum."""
    assignments = []
    for m in moments:
        layer, momentum = m.layer, m.momentum
        assignments.append((layer.moving_mean,
                            momentum * layer.moving_mean + (1 - momentum) * m.mean))
        assignments.append((layer.moving_variance,
                            momentum * layer.moving_variance + (1 - momentum) * m.variance))
    return assignments
